#!/usr/bin/env python3
"""Free a real CUDA holder from `gpureap top`, in a real terminal, on a real GPU.

    python3 scripts/gpu_top_validate.py PATH_TO_GPUREAP [--gpu N] [--gib G] [--out DIR]
    python3 scripts/gpu_top_validate.py PATH_TO_GPUREAP --sim [--out DIR]

Needs an NVIDIA GPU, nvidia-smi, python3 with PyTorch, and tmux (or, without
tmux, a pseudo-terminal of Python's own whose output is read as a stream). Run
as root, as gpureap is. `--sim` runs the same steps on a simulated host of its
own (docs/simulated-driver.md: a stand-in holder with the node open and a
claim, the figures from `gpureap status --json`), so that the script itself
is tested where there is no GPU. Steps, each checked:

1. An SGLang-like server: a launcher (`setsid bash`, leading its own group)
   starts `sglang::scheduler_TP0` (scripts/cuda_holder.py holding G GiB on
   GPU N, 4 by default), then the launcher is SIGKILLed: the worker is an
   orphan (re-parented to PID 1, its group leader gone).
2. `gpureap top --grace 2s` in an 80x24 tmux pane: the worker's row (found
   by its PID, which 80 columns always show; the title is cut there) shows
   the `orphaned` flag; `/` filters to its tag; `x` shows the plan, which
   must name the worker and nothing else of this run; `y` frees.
3. The view's result line `GPU N: freed X` is read; the worker is gone; the
   driver (nvidia-smi) lists no process of it; X is compared with
   nvidia-smi's used memory before minus after (within 256 MiB, the
   bookkeeping slack gpureap allows NVML, or the display's rounding).
4. `q`: the exit code is 0 and `stty -a` is the same before and after.

Prints PASS/FAIL per check and writes DIR/top-validate.json and the screens
(DIR/top-*.txt). On any failure it also writes what the next run needs to
diagnose it: the last pane capture (DIR/top-last-screen.txt), top's stderr
(DIR/top-stderr.txt, with GPUREAP_LOG=debug), the worker's stderr
(DIR/worker-stderr.txt), nvidia-smi's view and the environment it ran in.
Exit 0 when every check passed, 1 otherwise. Signals only what it started;
cleans up on every path. The lead records the result in
docs/gpu-validation.md.

Why the last H200 run failed (2026-12): the worker ran under `exec -a TITLE`,
so Python saw a program name without a path and could not find its virtual
environment (no torch): PYTHONPATH is now passed on from this interpreter's
sys.path. Then the row was awaited by the run's tag, which sits after the
22-column title in an 80-column view and so is never on the screen: the row
is now found by the worker's PID.
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


def driver_state(index, gpureap, backend):
    """(memory used in bytes, PIDs listed) on GPU index: nvidia-smi's, or on a
    simulated host gpureap's own status (the simulated driver's figures)."""
    if backend:
        status = json.loads(subprocess.run(
            [gpureap, "--backend", backend, "status", "--json"],
            capture_output=True, text=True, timeout=60).stdout)
        gpu = next(g for g in status["gpus"] if g["index"] == index)
        pids = [h["pid"] for h in status.get("holders", [])
                if any(u.get("index") == index and u.get("listed_by_driver") for u in h.get("gpus", []))]
        return gpu["memory_used"], pids
    used = subprocess.run(
        ["nvidia-smi", "-i", str(index), "--query-gpu=memory.used,pci.bus_id",
         "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60, check=True)
    mib, bus = [field.strip() for field in used.stdout.strip().split(",")]
    apps = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,gpu_bus_id", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=60, check=True)
    pids = [int(line.split(",")[0]) for line in apps.stdout.splitlines()
            if line.strip() and line.split(",")[1].strip() == bus]
    return int(mib) << 20, pids


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


def start_orphan(gpu, gib, tag, work, sim_dir=None):
    """The launcher and its worker; returns the worker's PID once it holds memory.
    On a simulated host the worker is a stand-in: `sleep` under the title,
    with GPU N's node open and a claim of G GiB (docs/simulated-driver.md)."""
    ready = os.path.join(work, "ready")
    holder = os.path.join(HERE, "cuda_holder.py")
    if sim_dir:
        worker_command = (
            f"bash -c 'exec 3<{sim_dir}/nvidia{gpu}; echo {int(gib * GIB)} > {sim_dir}/claims/$$.{gpu}; "
            f"touch {ready}; exec -a \"sglang::scheduler_TP0 {tag}\" sleep 100000'"
        )
    else:
        worker_command = (
            f"exec -a 'sglang::scheduler_TP0 {tag}' "
            f"{sys.executable} {holder} hold {gib} {ready} --gpu {gpu}"
        )
    script = (
        f"GPUREAP_VALIDATE_TAG={tag} {worker_command} 2> {work}/worker-stderr.txt & "
        f"echo $! > {work}/worker; exec -a 'python3 -m sglang.launch_server {tag}' sleep 100000"
    )
    # Under `exec -a` Python cannot find its virtual environment from its
    # program name: pass this interpreter's path on.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    launcher = subprocess.Popen(["setsid", "bash", "-c", script], env=env)
    try:
        wait_until("the worker's allocation", lambda: os.path.exists(ready) or launcher.poll() is not None, 180)
        if not os.path.exists(ready):
            raise RuntimeError("the launcher ended before its worker was ready")
        worker = int(open(f"{work}/worker").read())
    finally:
        if launcher.poll() is None:
            os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
    wait_until("the worker re-parented", lambda: parent_of(worker) not in (None, launcher.pid), 10)
    return worker


def make_sim_host(work):
    """A simulated host of two 80 GiB GPUs (docs/simulated-driver.md)."""
    sim_dir = os.path.join(work, "sim")
    os.makedirs(os.path.join(sim_dir, "claims"), exist_ok=True)
    os.chmod(os.path.join(sim_dir, "claims"), 0o1777)
    for index in range(2):
        open(os.path.join(sim_dir, f"nvidia{index}"), "w").close()
    open(os.path.join(sim_dir, "nvidiactl"), "w").close()
    with open(os.path.join(sim_dir, "gpus"), "w") as gpus:
        gpus.write("".join(f"{80 * GIB} Simulated H200\n" for _ in range(2)))
    return sim_dir


def row_of(screen, pid):
    """The view's row of pid: PID is the first column of a holder's row."""
    for line in screen.splitlines():
        fields = line.lstrip(">* ").split()
        if fields and fields[0] == str(pid):
            return line
    return None


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


def drive(view, worker, tag, gpu, results, gpureap, backend):
    """The keys of steps 2-4; the checks recorded in results."""
    def check(name, ok, detail=""):
        results["checks"].append({"check": name, "ok": bool(ok), "detail": detail})
        print(("PASS" if ok else "FAIL"), name, detail)

    screen = wait_until("the worker's row (by PID)",
                        lambda: (lambda s: s if row_of(s, worker) else None)(view.screen()), 90)
    save(view.work, "before", screen)
    row = row_of(screen, worker)
    check("the worker is listed as orphaned", "orphaned" in row and "sglang::scheduler_TP0" in row, row)
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
    used_before, _ = driver_state(gpu, gpureap, backend)
    view.keys("y")
    done = wait_until("the verified result", lambda: (lambda s: s if re.search(
        rf"GPU {gpu}: (freed|still held|not verified)", s) else None)(view.screen()), 120)
    save(view.work, "freed", done)
    used_after, pids = driver_state(gpu, gpureap, backend)
    shown = freed_bytes(done, gpu)
    freed = used_before - used_after
    results.update(shown_freed=shown, driver_freed=freed, driver_before=used_before, driver_after=used_after)
    check("the view says the GPU was freed", shown is not None, done.strip().splitlines()[-3:])
    check("the worker is gone", not alive(worker))
    check("the driver lists no process of the worker", worker not in pids, f"listed {pids}")
    check("the view's figure matches the driver's (nvidia-smi)",
          shown is not None and abs(shown - freed) <= max(SLACK, 0.05 * GIB + 0.051 * freed),
          f"view {shown} B, driver {freed} B (display rounds to 0.1 GiB)")


def diagnose(view, work, gpureap, backend):
    """What the next run needs when this one failed: the pane, top's stderr,
    the driver's view, the environment."""
    try:
        save(work, "last-screen", view.screen())
    except Exception as error:  # the pane may be gone: say so
        save(work, "last-screen", f"(no capture: {error})")
    notes = {"env": {k: v for k, v in os.environ.items() if k in ("TERM", "PATH", "PYTHONPATH", "HOME")},
             "python": sys.executable, "sys.path": sys.path}
    try:
        command = ["nvidia-smi"] if not backend else [gpureap, "--backend", backend, "status"]
        notes["driver"] = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except Exception as error:
        notes["driver"] = str(error)
    with open(os.path.join(work, "diagnosis.json"), "w") as out:
        json.dump(notes, out, indent=2)


def save(work, name, text):
    with open(os.path.join(work, f"top-{name}.txt"), "w") as out:
        out.write(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gpureap", nargs="?", default=shutil.which("gpureap") or "target/release/gpureap")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--gib", type=float, default=4)
    parser.add_argument("--out", default=None)
    parser.add_argument("--sim", action="store_true", help="on a simulated host of its own, no GPU")
    args = parser.parse_args()
    work = os.path.abspath(args.out or tempfile.mkdtemp(prefix="gpureap-top-validate-"))
    os.makedirs(work, exist_ok=True)
    gpureap = os.path.abspath(args.gpureap)
    tag = f"topval{os.getpid()}"
    sim_dir = make_sim_host(work) if args.sim else None
    backend = f"sim:{sim_dir}" if sim_dir else None
    results = {"gpu": args.gpu, "checks": [], "sim": bool(sim_dir),
               "terminal": "tmux" if shutil.which("tmux") else "pty"}
    worker = None
    view = None
    failed = True
    try:
        worker = start_orphan(args.gpu, args.gib, tag, work, sim_dir)
        chosen = f"--backend {backend} " if backend else ""
        command = f"GPUREAP_LOG=debug {gpureap} {chosen}top --grace 2s --timeout 60s 2> {work}/top-stderr.txt"
        view = Pane(command, work) if shutil.which("tmux") else Stream(command, work)
        drive(view, worker, tag, args.gpu, results, gpureap, backend)
        view.keys("q")
        if isinstance(view, Pane):
            wait_until("the view closed", lambda: "TOP-ENDED" in view.screen(), 20)
        failed = False
    except Exception as error:
        results["checks"].append({"check": "the run completed", "ok": False, "detail": repr(error)})
        print("FAIL the run completed", repr(error))
    finally:
        if failed or not all(c["ok"] for c in results["checks"]):
            if view is not None:
                diagnose(view, work, gpureap, backend)
        if worker is not None and alive(worker):
            os.kill(worker, signal.SIGKILL)
        if view is not None:
            view.close()
    if not failed:
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
