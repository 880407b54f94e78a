#!/usr/bin/env python3
"""Free a real CUDA holder from `gpureap top`, in a real terminal, on a real GPU.

    python3 scripts/gpu_top_validate.py [PATH_TO_GPUREAP] [--gpu N] [--gib G] [--out DIR]

Needs an NVIDIA GPU, python3 with PyTorch, pynvml (nvidia-ml-py), and tmux
(or, without tmux, a pseudo-terminal of Python's own whose output is read as
a stream). Run as root, as gpureap is. Steps, each checked:

1. An SGLang-like server: a launcher (`setsid sh`, leading its own group)
   starts `sglang::scheduler_TP0` (scripts/cuda_holder.py holding G GiB on
   GPU N, 4 by default), then the launcher is SIGKILLed: the worker is an
   orphan (re-parented to PID 1, its group leader gone).
2. `gpureap top --grace 2s` in an 80x24 tmux pane: the worker's row shows
   the `orphaned` flag on GPU N; `/` filters to its tag; `x` shows the plan,
   which must name the worker and nothing else of this run; `y` frees.
3. The view's result line `GPU N: freed X` is read; the worker is gone; NVML
   lists no process of it; X is compared with NVML's used memory before minus
   after (within 256 MiB, the bookkeeping slack gpureap allows NVML).
4. `q`: the exit code is 0 and `stty -a` is the same before and after.

Prints PASS/FAIL per check and writes DIR/top-validate.json (and the
screens, DIR/top-*.txt). Exit 0 when every check passed, 1 otherwise. The
lead records the result in docs/gpu-validation.md.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SLACK = 256 << 20
GIB = 1 << 30


def nvml_state(index):
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
        pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        return used, pids
    finally:
        pynvml.nvmlShutdown()


def wait_until(what, check, limit=60.0):
    deadline = time.monotonic() + limit
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {limit:.0f}s for {what}")
        time.sleep(0.05)


class Pane:
    """gpureap top in tmux (a server of this run's own, 80x24)."""

    def __init__(self, command, work):
        self.socket = f"gpureap-top-validate-{os.getpid()}"
        self.work = work
        script = (
            f"stty -a > {work}/before; {command}; echo $? > {work}/rc; "
            f"stty -a > {work}/after; echo TOP-ENDED; exec cat"
        )
        self.tmux("new-session", "-d", "-x", "80", "-y", "24", "-e", "TERM=xterm-256color",
                  "sh", "-c", script)

    def tmux(self, *args):
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args],
                              check=True, capture_output=True, text=True).stdout

    def keys(self, *keys):
        self.tmux("send-keys", "-t", "0", *keys)

    def screen(self):
        return self.tmux("capture-pane", "-p", "-t", "0")

    def close(self):
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


class Stream:
    """Without tmux: a pseudo-terminal; the screen is the output seen so far,
    escape sequences removed (enough to find a line's text)."""

    def __init__(self, command, work):
        import pty

        self.work = work
        self.seen = ""
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.environ["TERM"] = "xterm-256color"
            os.execvp("sh", ["sh", "-c", (
                f"stty rows 24 cols 80; stty -a > {work}/before; {command}; "
                f"echo $? > {work}/rc; stty -a > {work}/after")])
        os.set_blocking(self.fd, False)

    def keys(self, *keys):
        names = {"Enter": "\r", "Escape": "\x1b", "C-c": "\x03"}
        for key in keys:
            os.write(self.fd, names.get(key, key).encode())

    def screen(self):
        try:
            while True:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    break
                self.seen += chunk.decode("utf-8", "replace")
        except (BlockingIOError, OSError):
            pass
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]", " ", self.seen)

    def close(self):
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def start_orphan(gpu, gib, tag, work):
    """The launcher and its worker; returns the worker's PID once it holds memory."""
    ready = os.path.join(work, "ready")
    holder = os.path.join(HERE, "cuda_holder.py")
    script = (
        f"GPUREAP_VALIDATE_TAG={tag} exec -a 'sglang::scheduler_TP0 {tag}' "
        f"{sys.executable} {holder} hold {gib} {ready} --gpu {gpu} & "
        f"echo $! > {work}/worker; exec -a 'python3 -m sglang.launch_server {tag}' sleep 100000"
    )
    launcher = subprocess.Popen(["setsid", "bash", "-c", script])
    wait_until("the worker's CUDA allocation", lambda: os.path.exists(ready), 120)
    worker = int(open(f"{work}/worker").read())
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    wait_until("the worker re-parented", lambda: parent_of(worker) == 1, 10)
    return worker


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def freed_bytes(screen, gpu):
    match = re.search(rf"GPU {gpu}: freed ([0-9.]+) (B|KiB|MiB|GiB|TiB)", screen)
    if not match:
        return None
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
    return float(match.group(1)) * units[match.group(2)]


def drive(view, worker, tag, gpu, results):
    """The keys of steps 2-4; the checks recorded in results."""
    def check(name, ok, detail=""):
        results["checks"].append({"check": name, "ok": bool(ok), "detail": detail})
        print(("PASS" if ok else "FAIL"), name, detail)

    screen = wait_until("the worker's row", lambda: (lambda s: s if tag in s else None)(view.screen()))
    save(view.work, "before", screen)
    check("the worker is listed as orphaned", "orphaned" in screen and str(worker) in screen)
    view.keys("/", tag, "Enter")
    view.keys("x")
    plan = wait_until("the plan", lambda: (lambda s: s if "plan: free these?" in s else None)(view.screen()))
    save(view.work, "plan", plan)
    others = [int(p) for p in re.findall(r"│\s+(\d+) GPU", plan) if int(p) != worker]
    check("the plan names the worker and nothing else", str(worker) in plan and not others,
          f"others: {others}")
    if others or str(worker) not in plan:
        view.keys("n")
        return
    used_before, _ = nvml_state(gpu)
    view.keys("y")
    done = wait_until("the verified result", lambda: (lambda s: s if re.search(
        rf"GPU {gpu}: (freed|still held|not verified)", s) else None)(view.screen()), 120)
    save(view.work, "freed", done)
    used_after, pids = nvml_state(gpu)
    shown = freed_bytes(done, gpu)
    nvml = used_before - used_after
    results.update(shown_freed=shown, nvml_freed=nvml, nvml_before=used_before, nvml_after=used_after)
    check("the view says the GPU was freed", shown is not None, done.strip().splitlines()[-3:])
    check("the worker is gone", not alive(worker))
    check("NVML lists no process of the worker", worker not in pids, f"NVML pids {pids}")
    check("the view's figure matches NVML's", shown is not None and abs(shown - nvml) <= max(SLACK, 0.05 * GIB + 0.051 * nvml),
          f"view {shown} B, NVML {nvml} B (display rounds to 0.1 GiB)")


def save(work, name, text):
    with open(os.path.join(work, f"top-{name}.txt"), "w") as out:
        out.write(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gpureap", nargs="?", default=shutil.which("gpureap") or "target/release/gpureap")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--gib", type=float, default=4)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    work = args.out or tempfile.mkdtemp(prefix="gpureap-top-validate-")
    os.makedirs(work, exist_ok=True)
    tag = f"topval{os.getpid()}"
    results = {"gpu": args.gpu, "checks": [], "terminal": "tmux" if shutil.which("tmux") else "pty"}
    worker = start_orphan(args.gpu, args.gib, tag, work)
    command = f"{os.path.abspath(args.gpureap)} top --grace 2s --timeout 60s"
    view = Pane(command, work) if shutil.which("tmux") else Stream(command, work)
    try:
        drive(view, worker, tag, args.gpu, results)
        view.keys("q")
        if isinstance(view, Pane):
            wait_until("the view closed", lambda: "TOP-ENDED" in view.screen(), 20)
    finally:
        if alive(worker):
            os.kill(worker, signal.SIGKILL)
        view.close()
    rc = open(f"{work}/rc").read().strip()
    drop_size = lambda text: re.sub(r"rows \d+; columns \d+;", "", text)
    same = drop_size(open(f"{work}/before").read()) == drop_size(open(f"{work}/after").read())
    for name, ok in [("exit code 0 on q", rc == "0"), ("stty -a unchanged", same)]:
        results["checks"].append({"check": name, "ok": ok})
        print(("PASS" if ok else "FAIL"), name)
    with open(os.path.join(work, "top-validate.json"), "w") as out:
        json.dump(results, out, indent=2)
    print(f"results in {work}")
    sys.exit(0 if all(c["ok"] for c in results["checks"]) else 1)


if __name__ == "__main__":
    main()
