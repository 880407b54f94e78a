#!/usr/bin/env python3
"""Check that `gpureap status` puts each CUDA worker on its own GPU on a multi-GPU host.

    python3 scripts/gpu_status_multi.py [PATH_TO_GPUREAP] [--gpus N] [--out DIR]

Needs two or more NVIDIA GPUs, python3 with PyTorch, and pynvml (nvidia-ml-py).
Starts one PyTorch holder per GPU (scripts/cuda_holder.py, titled
`sglang::scheduler_TP<i>`): holder i calls torch.cuda.set_device(i) first and
allocates 4 + 2*i GiB there, so that each worker's memory is distinct. The CUDA
runtime opens every GPU's device node in every worker, which is what used to
make `status` show each of them on all GPUs with unknown memory. Then it runs
`gpureap status`, `status --json` and `status --tree` (and `status --gpu`, and
`free --gpu 1 --dry-run`, which signals nothing), and checks that each worker
appears only on its own GPU, with its NVML memory there (the allocation plus
the context's bookkeeping, under 1 GiB). It prints one PASS/FAIL line per
check, the table, and a summary; exit 1 if any check failed, 2 if NVML lists a
process it did not start. It signals only the holders it started, checked by
PID and start time, and kills them all before it exits. Results are recorded
in docs/gpu-validation.md.
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
# Above the allocation, a context costs ~0.5 GiB on an H200 (driver 580): allow 1 GiB.
CONTEXT_SLACK = GIB
TABLE_WIDTH = 120

args = sys.argv[1:]
OUT = None
COUNT = None
if "--out" in args:
    OUT = Path(args.pop(args.index("--out") + 1))
    args.remove("--out")
if "--gpus" in args:
    COUNT = int(args.pop(args.index("--gpus") + 1))
    args.remove("--gpus")
BIN = str(Path(args[0]).resolve()) if args else str(HERE.parent / "target/release/gpureap")

WORK = Path(tempfile.mkdtemp(prefix="gpureap-status-multi-"))
STARTED = []  # (pid, start time in ticks): the holders this script started
RESULTS = []  # (check, passed, detail)


def log(text):
    print(text, flush=True)


def check(name, passed, detail=""):
    RESULTS.append((name, bool(passed), detail))
    log(f"{'PASS' if passed else 'FAIL'} {name}{': ' + detail if detail else ''}")


def start_time(pid):
    """A process's start time in clock ticks, its identity with the PID; None once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def gib_of(rank):
    return 4 + 2 * rank


def start_holder(rank):
    """Starts holder `rank` on GPU `rank` under an SGLang-like title; returns its PID."""
    title = f"sglang::scheduler_TP{rank}"
    # `exec -a TITLE python3` hides where python3 lives, so the holder would not
    # find this interpreter's site-packages (torch): hand them over explicitly.
    python_path = os.pathsep.join(path for path in sys.path if path)
    script = f"exec -a {shlex.quote(title)} python3 {shlex.quote(str(HOLDER))} hold {gib_of(rank)} {shlex.quote(str(WORK / f'tp{rank}'))} --gpu {rank}"
    child = subprocess.Popen(["bash", "-c", script], env=dict(os.environ, PYTHONPATH=python_path), stdin=subprocess.DEVNULL)
    STARTED.append((child.pid, start_time(child.pid)))
    return child.pid


def wait_ready(count, timeout=120):
    deadline = time.time() + timeout
    while not all((WORK / f"tp{rank}").exists() for rank in range(count)):
        if time.time() > deadline:
            raise RuntimeError(f"holders not ready after {timeout}s")
        time.sleep(0.05)


def kill_holders():
    """SIGKILL every holder this script started, and only while it is still that process."""
    for pid, started in STARTED:
        if started is not None and start_time(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def nvml_processes(count):
    """{gpu: {pid: used bytes}} from NVML, independently of gpureap."""
    result = {}
    for index in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        result[index] = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    return result


def gpureap(*arguments):
    done = subprocess.run([BIN, "--backend", "nvml", *arguments], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    if OUT:
        with open(OUT / "gpureap-outputs.txt", "a") as record:
            record.write(f"$ gpureap {' '.join(arguments)}  # exit {done.returncode}\n{done.stdout}{done.stderr}\n")
    return done


def bytes_text(value):
    """Bytes as gpureap prints them (units::Bytes)."""
    if value == 0:
        return "0 B"
    if value < GIB:
        return f"{max(value / (1 << 20), 1.0):.0f} MiB"
    return f"{value / GIB:.1f} GiB"


COLUMNS = ["GPU", "PID", "PPID", "PGID", "SID", "USER", "S", "AGE", "GPU MEM", "FLAGS", "CGROUP", "COMMAND"]


def holder_rows(stdout):
    """The holders table's rows as dicts, cut where the header's columns start."""
    lines = stdout.splitlines()
    try:
        at = next(i for i, line in enumerate(lines) if line.strip().startswith("GPU  PID"))
    except StopIteration:
        return []
    header = lines[at]
    starts, searched_to = [], 0
    for label in COLUMNS:
        starts.append(header.index(label, searched_to))
        searched_to = starts[-1] + len(label)
    rows = []
    for line in lines[at + 1:]:
        if not line.strip():
            break
        cells = [line[start:end].strip() for start, end in zip(starts, starts[1:] + [len(line)])]
        rows.append(dict(zip(COLUMNS, cells)))
    return rows


def main():
    pynvml.nvmlInit()
    available = pynvml.nvmlDeviceGetCount()
    count = COUNT or available
    driver = pynvml.nvmlSystemGetDriverVersion()
    version = subprocess.run([BIN, "--version"], stdout=subprocess.PIPE, text=True).stdout.strip()
    names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(available)]
    log(f"date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {available} GPU(s): {', '.join(map(str, names))}; driver {driver}; {version}; kernel {os.uname().release}")
    if count < 2 or count > available:
        log(f"needs 2 to {available} GPUs; asked for {count}")
        return 2
    foreign = {index: sorted(pids) for index, pids in nvml_processes(available).items() if pids}
    if foreign:
        log(f"refusing to run: NVML lists processes this script did not start: {foreign}")
        return 2
    if OUT:
        OUT.mkdir(parents=True, exist_ok=True)
    try:
        workers = [start_holder(rank) for rank in range(count)]
        wait_ready(count)
        nvml = nvml_processes(available)
        for rank, pid in enumerate(workers):
            on = sorted(index for index, listed in nvml.items() if pid in listed)
            check(f"NVML: TP{rank} has a context on GPU {rank} only", on == [rank], f"pid {pid} listed on {on}")
            nodes = sorted(
                int(target[len("/dev/nvidia"):])
                for target in (os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
                if target.startswith("/dev/nvidia") and target[len("/dev/nvidia"):].isdigit()
            )
            log(f"info: TP{rank} (pid {pid}) has /dev/nvidia{{{','.join(map(str, nodes))}}} open")

        table = gpureap("status")
        log("\n$ gpureap status\n" + table.stdout + table.stderr)
        status = gpureap("status", "--json")
        document = json.loads(status.stdout)
        tree = gpureap("status", "--tree")
        log("$ gpureap status --tree\n" + tree.stdout + tree.stderr)

        check("status exits 0", table.returncode == 0 and status.returncode == 0 and tree.returncode == 0,
              f"{table.returncode}, {status.returncode}, {tree.returncode}")
        rows = holder_rows(table.stdout)
        holders = {h["pid"]: h for h in document.get("holders", [])}
        for rank, pid in enumerate(workers):
            expected = nvml[rank].get(pid)
            mine = [row for row in rows if row["PID"] == str(pid)]
            check(f"table: TP{rank} in one row, on GPU {rank}, with NVML's memory",
                  len(mine) == 1 and mine[0]["GPU"] == str(rank) and mine[0]["GPU MEM"] == bytes_text(expected or 0),
                  f"rows {[(row['GPU'], row['GPU MEM'], row['FLAGS']) for row in mine]}, NVML {bytes_text(expected or 0)}")
            allocated = gib_of(rank) * GIB
            check(f"NVML: TP{rank}'s memory is its {gib_of(rank)} GiB plus a context",
                  expected is not None and allocated <= expected <= allocated + CONTEXT_SLACK,
                  f"{expected} B = {bytes_text(expected or 0)}")
            gpus = holders.get(pid, {}).get("gpus", [])
            listed = [(g["index"], g["memory"]) for g in gpus if g.get("listed_by_driver")]
            check(f"JSON: TP{rank} listed by the driver on GPU {rank} only, with NVML's memory", listed == [(rank, expected)],
                  f"listed {listed}; node_open on {[g['index'] for g in gpus if g.get('node_open')]}")
            check(f"JSON: TP{rank} is not a monitor", "monitor" not in holders.get(pid, {}).get("flags", []),
                  str(holders.get(pid, {}).get("flags")))
            line = next((line for line in tree.stdout.splitlines() if line.lstrip("│├└─ ").startswith(f"{pid} [")), "")
            check(f"tree: TP{rank} shows GPU {rank} only", line.count("  GPU ") == 1 and f"  GPU {rank}: {bytes_text(expected or 0)}" in line,
                  line.strip())
            only = holder_rows(gpureap("status", "--gpu", str(rank)).stdout)
            ours = [int(row["PID"]) for row in only if int(row["PID"]) in workers]
            check(f"status --gpu {rank}: of the workers, only TP{rank}", ours == [pid], str(ours))
        wide = [line for line in table.stdout.splitlines() if len(line) > TABLE_WIDTH]
        check(f"the table fits {TABLE_WIDTH} columns", not wide, f"{len(wide)} wider line(s)")
        plan = json.loads(gpureap("free", "--gpu", "1", "--dry-run", "--json").stdout)
        targets = sorted(t["pid"] for t in plan.get("targets", []))
        check("free --gpu 1 --dry-run: targets TP1 only", targets == [workers[1]], str(targets))
        if OUT:
            (OUT / "status.txt").write_text(table.stdout)
            (OUT / "status.json").write_text(status.stdout)
            (OUT / "status-tree.txt").write_text(tree.stdout)
    finally:
        kill_holders()
    passed = sum(1 for _, ok, _ in RESULTS if ok)
    log(f"\n{passed} passed, {len(RESULTS) - passed} failed")
    return 0 if passed == len(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
