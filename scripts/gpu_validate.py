#!/usr/bin/env python3
"""Check gpureap's real NVML path against real CUDA processes.

    python3 scripts/gpu_validate.py [PATH_TO_GPUREAP] [--gpu N] [--out DIR]

Needs an NVIDIA GPU, python3 with PyTorch, and pynvml (nvidia-ml-py). Builds
the incidents of the test suite out of real CUDA processes, each holding a few
GiB, runs gpureap scoped to those processes only, and checks every outcome
independently through NVML. It signals only processes it started itself, and
kills them all before it exits. Prints one PASS/FAIL line per check and a
summary; exits 1 if any check failed. Results are recorded in
docs/gpu-validation.md.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pynvml

HERE = Path(__file__).resolve().parent
HOLDER = HERE / "cuda_holder.py"
GIB = 1 << 30

args = sys.argv[1:]
GPU = 0
OUT = None
if "--gpu" in args:
    GPU = int(args.pop(args.index("--gpu") + 1))
    args.remove("--gpu")
if "--out" in args:
    OUT = Path(args.pop(args.index("--out") + 1))
    args.remove("--out")
BIN = str(Path(args[0]).resolve()) if args else str(HERE.parent / "target/release/gpureap")

WORK = Path(tempfile.mkdtemp(prefix="gpureap-validate-"))
STARTED = []  # (pid, title): everything this script started, for cleanup
RESULTS = []  # (check, passed, detail)
TIMINGS = []  # (case, figure)


def log(text):
    print(text, flush=True)


def check(name, passed, detail=""):
    RESULTS.append((name, bool(passed), detail))
    log(f"{'PASS' if passed else 'FAIL'} {name}{': ' + detail if detail else ''}")


def nvml_state():
    handle = pynvml.nvmlDeviceGetHandleByIndex(GPU)
    used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    pids = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    return used, pids


def titled_pid(title):
    """The PID of the process this script started under `title` (from its pids file)."""
    for line in (WORK / "pids").read_text().splitlines():
        pid, recorded = line.split(" ", 1)
        if recorded == title:
            return int(pid)
    raise KeyError(title)


def bash(script, title="bash"):
    """Runs a bash script with $H (holder), $R (ready dir), $P (pids file)."""
    # `exec -a TITLE python3` hides where python3 lives, so the child would not
    # find this interpreter's site-packages (torch): hand them over explicitly.
    python_path = os.pathsep.join(path for path in sys.path if path)
    env = dict(os.environ, H=str(HOLDER), R=str(WORK), P=str(WORK / "pids"), GPU=str(GPU), PYTHONPATH=python_path)
    child = subprocess.Popen(["bash", "-c", script], env=env, stdin=subprocess.DEVNULL)
    STARTED.append((child.pid, title))
    return child


def holder_cmd(title, gib, ready, extra=""):
    """A bash fragment: record $BASHPID under `title`, then become a CUDA holder titled `title`."""
    return (
        f'echo "$BASHPID {title}" >> "$P"; '
        f'exec -a {shlex.quote(title)} python3 "$H" hold {gib} "$R/{ready}" --gpu $GPU {extra}'
    )


def wait_ready(*names, timeout=60):
    deadline = time.time() + timeout
    while not all((WORK / name).exists() for name in names):
        if time.time() > deadline:
            raise RuntimeError(f"holders not ready after {timeout}s: {names}")
        time.sleep(0.05)


def alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def ppid(pid):
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def sid(pid):
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])


def gpureap(*arguments):
    started = time.monotonic()
    done = subprocess.run(
        [BIN, "--backend", "nvml", *arguments], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
    )
    wall_ms = (time.monotonic() - started) * 1000
    if OUT:
        with open(OUT / "gpureap-outputs.txt", "a") as record:
            record.write(f"$ gpureap {' '.join(arguments)}  # exit {done.returncode}, {wall_ms:.0f} ms\n{done.stdout}{done.stderr}\n")
    return done, wall_ms


def report_of(done):
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        log(f"not JSON (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
        return {"targets": [], "spared": [], "gpus": [], "holders": []}


def signals(report, pid):
    for target in report.get("targets", []):
        if target["pid"] == pid:
            return [e["signal"] for e in target["signals"] if e["delivery"] == "sent"]
    return None


def gpu_outcome(report):
    for gpu in report.get("gpus", []):
        if gpu["index"] == GPU:
            return gpu
    return {}


def kill_everything():
    """SIGKILL every process this script started, checked by title, never anything else."""
    for line in (WORK / "pids").read_text().splitlines() if (WORK / "pids").exists() else []:
        pid, title = line.split(" ", 1)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if cmdline.startswith(title.encode()):
            os.kill(int(pid), signal.SIGKILL)
    for pid, _ in STARTED:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def case_sglang_orphans():
    log("\n== SGLang-like server, launcher SIGKILLed, workers orphaned, TP1 ignores SIGTERM ==")
    workers = "".join(
        f"( {holder_cmd(f'sglang::scheduler_TP{rank}', 4, f'tp{rank}', '--ignore-term' if rank == 1 else '')} ) & "
        for rank in range(3)
    )
    launcher = bash(
        'echo "$$ python3 -m sglang.launch_server" >> "$P"; '
        + workers
        + '( echo "$BASHPID sglang::detokenizer" >> "$P"; exec -a sglang::detokenizer sleep 100000 ) & '
        + "exec -a 'python3 -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B --tp 3' sleep 100000",
        "python3 -m sglang.launch_server",
    )
    bash(holder_cmd("jupyter-kernel colleague.ipynb", 2, "notebook"), "jupyter-kernel")
    bash(
        'echo "$BASHPID gpu_exporter" >> "$P"; exec -a gpu_exporter python3 "$H" monitor "$R/monitor" --gpu $GPU',
        "gpu_exporter",
    )
    wait_ready("tp0", "tp1", "tp2", "notebook", "monitor")
    tp = [titled_pid(f"sglang::scheduler_TP{rank}") for rank in range(3)]
    notebook = titled_pid("jupyter-kernel colleague.ipynb")
    monitor = titled_pid("gpu_exporter")
    detokenizer = titled_pid("sglang::detokenizer")
    used_before, listed = nvml_state()
    check("NVML lists the three workers and the notebook", set(tp + [notebook]) <= set(listed), f"listed {sorted(listed)}")

    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    deadline = time.time() + 5
    while any(ppid(pid) != 1 for pid in tp) and time.time() < deadline:
        time.sleep(0.01)
    orphaned = all(ppid(pid) == 1 for pid in tp)

    status, _ = gpureap("status", "--json")
    status = report_of(status)
    holders = {h["pid"]: h for h in status.get("holders", [])}
    def memory_on_gpu(pid):
        # Every CUDA process has every GPU's node open: take the entry for this script's GPU.
        return next((g.get("memory") for g in holders.get(pid, {}).get("gpus", []) if g.get("index") == GPU), None)

    check("status shows each worker with NVML memory", all(memory_on_gpu(pid) == listed.get(pid) for pid in tp),
          ", ".join(f"{pid}: {memory_on_gpu(pid)}" for pid in tp))
    check("status flags the workers orphaned", (not orphaned) or all("orphaned" in holders.get(pid, {}).get("flags", []) for pid in tp),
          "re-parented to PID 1" if orphaned else "a subreaper adopted them: flag not expected")
    check("status flags the exporter as a monitor", "monitor" in holders.get(monitor, {}).get("flags", []), str(holders.get(monitor, {}).get("flags")))
    gpu_row = next((g for g in status.get("gpus", []) if g["index"] == GPU), {})
    check("status reports the GPU name and memory from NVML", gpu_row.get("memory_used") is not None and "H200" in (gpu_row.get("name") or ""),
          f"{gpu_row.get('name')}, used {gpu_row.get('memory_used')}, unattributed {gpu_row.get('memory_unattributed')}")

    scope = ["--orphans"] if orphaned else ["--match", "sglang::scheduler"]
    done, wall_ms = gpureap("free", *scope, "--grace", "2s", "--yes", "--json")
    report = report_of(done)
    used_after, listed_after = nvml_state()
    outcome = gpu_outcome(report)
    check("free exits 0", done.returncode == 0, f"exit {done.returncode}; {done.stderr.strip()}")
    check("exactly the workers are targets", sorted(t["pid"] for t in report["targets"]) == sorted(tp),
          str(sorted(t["pid"] for t in report["targets"])))
    check("TP0 and TP2 exit on SIGTERM", signals(report, tp[0]) == ["SIGTERM"] and signals(report, tp[2]) == ["SIGTERM"],
          f"{signals(report, tp[0])} {signals(report, tp[2])}")
    check("TP1 ignores SIGTERM and gets SIGSTOP then SIGKILL", signals(report, tp[1]) == ["SIGTERM", "SIGSTOP", "SIGKILL"], str(signals(report, tp[1])))
    check("GPU verified freed", outcome.get("freed") is True, json.dumps(outcome))
    check("NVML no longer lists any worker", not (set(tp) & set(listed_after)), f"listed {sorted(listed_after)}")
    freed_nvml = used_before - used_after
    check("NVML memory dropped by the workers' share", freed_nvml >= sum(listed[pid] for pid in tp) * 0.95,
          f"{freed_nvml / GIB:.2f} GiB back, workers held {sum(listed[pid] for pid in tp) / GIB:.2f} GiB")
    check("notebook, exporter and detokenizer untouched", alive(notebook) and alive(monitor) and alive(detokenizer))
    TIMINGS.append(("orphans, grace 2s, TP1 ignores SIGTERM", f"freed_after_ms {outcome.get('freed_after_ms')}, command wall {wall_ms:.0f} ms"))
    return notebook, monitor


def case_grace_zero():
    log("\n== Three workers, --grace 0: SIGSTOP+SIGKILL at once ==")
    bash("".join(f"( {holder_cmd(f'sglang::fast_TP{rank}', 4, f'fast{rank}')} ) & " for rank in range(3)) + "wait", "bash")
    wait_ready("fast0", "fast1", "fast2")
    pids = [titled_pid(f"sglang::fast_TP{rank}") for rank in range(3)]
    done, wall_ms = gpureap("free", "--match", "sglang::fast_TP", "--grace", "0", "--yes", "--json")
    report = report_of(done)
    outcome = gpu_outcome(report)
    _, listed = nvml_state()
    check("grace 0: freed, no SIGTERM sent", done.returncode == 0 and all(signals(report, pid) == ["SIGSTOP", "SIGKILL"] for pid in pids),
          f"exit {done.returncode}, {[signals(report, pid) for pid in pids]}")
    check("grace 0: NVML lists none of them", not (set(pids) & set(listed)))
    TIMINGS.append(("3 workers x 4 GiB, grace 0", f"freed_after_ms {outcome.get('freed_after_ms')}, command wall {wall_ms:.0f} ms"))


def case_setsid():
    log("\n== A worker's grandchild double-forks, calls setsid, and holds GPU memory ==")
    escapee = holder_cmd("sglang::escapee", 3, "escapee")
    bash(f"( ( exec setsid bash -c {shlex.quote(escapee)} ) & ); " + holder_cmd("sglang::worker", 3, "worker"), "bash")
    wait_ready("escapee", "worker")
    escapee_pid, worker_pid = titled_pid("sglang::escapee"), titled_pid("sglang::worker")
    check("the grandchild has its own session and PID 1 as parent", sid(escapee_pid) != sid(worker_pid) and ppid(escapee_pid) == 1,
          f"sid {sid(escapee_pid)} vs {sid(worker_pid)}, ppid {ppid(escapee_pid)}")
    done, wall_ms = gpureap("free", "--match", "sglang::(worker|escapee)", "--grace", "1s", "--yes", "--json")
    report = report_of(done)
    _, listed = nvml_state()
    check("setsid grandchild found and killed, GPU freed", done.returncode == 0 and not alive(escapee_pid) and not alive(worker_pid)
          and gpu_outcome(report).get("freed") is True, f"exit {done.returncode}")
    check("NVML lists neither", not ({escapee_pid, worker_pid} & set(listed)))


def case_zombie():
    log("\n== A hung CUDA parent with a zombie child it never reaps ==")
    bash('( echo "$BASHPID zombie" >> "$P"; sleep 0.5; exit 0 ) & ' + holder_cmd("sglang::hung_parent", 3, "hung"), "bash")
    wait_ready("hung")
    time.sleep(0.6)
    parent, zombie = titled_pid("sglang::hung_parent"), titled_pid("zombie")
    tree, _ = gpureap("status", "--tree")
    check("status --tree shows the zombie under its parent", f"{zombie} [Z]" in tree.stdout and "zombie" in tree.stdout,
          next((line.strip() for line in tree.stdout.splitlines() if f"{zombie} [" in line), "not shown"))
    done, _ = gpureap("free", "--match", "sglang::hung_parent", "--grace", "1s", "--yes", "--json")
    report = report_of(done)
    fates = {t["pid"]: t["fate"] for t in report["targets"]}
    check("parent killed, zombie not signalled, GPU freed", done.returncode == 0 and fates.get(zombie) == "zombie"
          and signals(report, zombie) == [] and not alive(parent), f"exit {done.returncode}, fates {fates}")


def case_respawn():
    log("\n== A parent that ignores SIGTERM and respawns its CUDA worker, freed with --pid ==")
    parent = bash(
        "trap '' TERM; n=0; while :; do n=$((n+1)); ( "
        + holder_cmd("sglang::respawned", 3, "respawn-$n")
        + " ) & wait; done",
        "bash",
    )
    wait_ready("respawn-1")
    worker = titled_pid("sglang::respawned")
    done, wall_ms = gpureap("free", "--pid", str(parent.pid), "--grace", "1s", "--yes", "--json")
    report = report_of(done)
    parent.wait(timeout=10)
    _, listed = nvml_state()
    check("respawning parent: SIGTERM ignored, then SIGSTOP before SIGKILL", signals(report, parent.pid) == ["SIGTERM", "SIGSTOP", "SIGKILL"],
          str(signals(report, parent.pid)))
    check("respawning parent: worker killed, nothing respawned, GPU freed", done.returncode == 0 and not alive(worker)
          and not (WORK / "respawn-2").exists() and gpu_outcome(report).get("freed") is True, f"exit {done.returncode}")


def case_ancestor():
    log("\n== gpureap run by a CUDA process that matches its own scope ==")
    command = f"{shlex.quote(BIN)} --backend nvml free --match sglang::ancestor --grace 0 --timeout 2s --yes --json"
    bash(holder_cmd("sglang::ancestor", 3, "ancestor", "-- " + command), "bash")
    wait_ready("ancestor")
    ancestor = titled_pid("sglang::ancestor")
    exit_code, _, output = (WORK / "ancestor.out").read_text().partition("\n")
    report = report_of(subprocess.CompletedProcess([], int(exit_code), output, ""))
    spared = {s["pid"]: s["reason"] for s in report.get("spared", [])}
    reasons = [r["reason"] for r in gpu_outcome(report).get("reasons", [])]
    check("the calling process is spared as an ancestor, exit 1 with the reason", int(exit_code) == 1 and spared.get(ancestor) == "ancestor"
          and "protected" in reasons and alive(ancestor), f"exit {exit_code}, spared {spared}, reasons {reasons}")


def case_wait(notebook):
    log("\n== gpureap wait: returns once the last holder's memory is back ==")
    used, listed = nvml_state()
    below = used - listed.get(notebook, 0) + GIB // 2
    waiter = subprocess.Popen([BIN, "--backend", "nvml", "wait", "--gpu", str(GPU), "--below", str(below), "--timeout", "60s", "--json"],
                              stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    check("wait is still waiting while the notebook holds memory", waiter.poll() is None)
    os.kill(notebook, signal.SIGKILL)
    out, _ = waiter.communicate(timeout=60)
    result = json.loads(out)
    check("wait exits 0 once the memory is back", waiter.returncode == 0 and result["ready"], f"waited {result['waited_ms']} ms")


def main():
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(GPU)
    name = pynvml.nvmlDeviceGetName(handle)
    driver = pynvml.nvmlSystemGetDriverVersion()
    version = subprocess.run([BIN, "--version"], stdout=subprocess.PIPE, text=True).stdout.strip()
    log(f"date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; GPU {GPU}: {name}; driver {driver}; {version}; kernel {os.uname().release}")
    used, listed = nvml_state()
    log(f"before: {used / GIB:.2f} GiB used, {len(listed)} process(es) listed")
    try:
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        log(f"memory info v2: used {v2.used / GIB:.2f} GiB, reserved {v2.reserved / GIB:.2f} GiB (v1 'used' counts the reserved part)")
    except Exception as error:  # older pynvml: v1 only
        log(f"memory info v2 unavailable here: {error}")
    if listed:
        # Someone else uses this GPU: broad scopes could reach their processes.
        log(f"refusing to run: NVML lists processes this script did not start: {sorted(listed)}")
        return 2
    auto = subprocess.run([BIN, "status", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    backend = json.loads(auto.stdout).get("backend", "") if auto.returncode == 0 else ""
    check("--backend auto picks NVML", backend.startswith("nvml"), f"{backend}; stderr: {auto.stderr.strip()}")
    try:
        notebook, _ = case_sglang_orphans()
        case_grace_zero()
        case_setsid()
        case_zombie()
        case_respawn()
        case_ancestor()
        case_wait(notebook)
    finally:
        kill_everything()
    passed = sum(1 for _, ok, _ in RESULTS if ok)
    log("\nTimings (gpureap's own verified-free time, and the command's wall time):")
    for case, figure in TIMINGS:
        log(f"  {case}: {figure}")
    log(f"\n{passed} passed, {len(RESULTS) - passed} failed")
    return 0 if passed == len(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
