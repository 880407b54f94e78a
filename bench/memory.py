#!/usr/bin/env python3
"""Peak memory and CPU of `gpureap status --json`, build against build, and what the memory is.

    python3 bench/memory.py [--gpu] [--crowds 100,5000] [--runs 9] [--out FILE] NAME=BINARY[,VAR=VALUE...] ...

Each NAME=BINARY is one configuration: a binary, and environment variables it runs with
(`base=target/dist/gpureap,MALLOC_ARENA_MAX=1`). On a simulated 8-GPU host (an SGLang-like
server holding 70 GiB on each GPU, as bench/exporter_memory.py sets up) with bench/crowd.py's
idle processes, for each crowd size it runs `/usr/bin/time -f "%e %U %S %M" BINARY --backend
sim:DIR status --json` (CPU from time's rusage through wait4, at microsecond resolution) --runs times per configuration, the configurations interleaved (each
round in another order), and prints the medians of wall and CPU (user + sys) and the peak RSS
(least, median, most). Then, once per configuration, it stops the process at its exit_group
under gdb and reads /proc/PID/status (RssAnon, RssFile) and /proc/PID/smaps: resident KiB per
mapping, summed by file (the binary's own, libc, ...), with [heap] and the other anonymous
mappings apart. With --gpu, on an NVIDIA host: the real driver (no --backend, no simulated
server), nvidia-smi --query-compute-apps timed beside as the reference, and where gdb is missing
the figures at exit come from gpureap's own GPUREAP_LOG=debug line (no split by mapping).
--out FILE writes the tables to FILE and every run's figures to FILE.json. Signals only what
it started. docs/performance.md quotes it; scripts/gpu_memory.sh runs it on the GPU host.
"""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import shutil
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simhost import option, simulated_host, start_server  # noqa: E402
import crowd  # noqa: E402  bench/crowd.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
GPUS = 8


CROWDS = [int(n) for n in option("--crowds", "100,5000").split(",")]
RUNS = int(option("--runs", "9"))
OUT = option("--out", None)
GPU = "--gpu" in sys.argv[1:]
NVIDIA_SMI = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"]


def configurations():
    args, found, skip = sys.argv[1:], [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--gpu":
            continue
        elif arg.startswith("--"):
            skip = True
        else:
            name, _, rest = arg.partition("=")
            binary, *variables = rest.split(",")
            binary = binary if binary == "nvidia-smi" else str(Path(binary).resolve())
            found.append((name, binary, dict(v.split("=", 1) for v in variables)))
    if not found:
        raise SystemExit(__doc__)
    return found


def status(binary, host):
    """The command line measured: status --json on the simulated host, or on the real driver."""
    if binary == "nvidia-smi":
        return NVIDIA_SMI
    return [binary, "status", "--json"] if GPU else [binary, "--backend", f"sim:{host}", "status", "--json"]


def timed(binary, variables, host):
    """Wall, CPU (user + sys) and peak RSS (KiB) of one run under `/usr/bin/time -f %M`: the peak as
    time prints it (this process's own peak would be counted in a child it starts directly: Linux
    keeps the peak across exec), the CPU from time's rusage at microsecond resolution (time prints
    it to 10 ms; time's own share is some 1 ms)."""
    started = time.perf_counter()
    child = subprocess.Popen(["/usr/bin/time", "-f", "%M", *status(binary, host)], env=dict(os.environ, **variables),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    printed = child.stderr.read()
    _, _, usage = os.wait4(child.pid, 0)
    child.returncode = 0
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime, int(printed.split()[-1])


GDB_SCRIPT = """
import gdb
pid = gdb.selected_inferior().pid
with open("{out}", "w") as out:
    out.write(open(f"/proc/{{pid}}/status").read())
    out.write("\\n@@smaps\\n")
    out.write(open(f"/proc/{{pid}}/smaps").read())
"""


def logged_at_exit(binary, variables, host):
    """The figures of gpureap's own "memory at exit" line (GPUREAP_LOG=debug), where gdb is missing."""
    result = subprocess.run(status(binary, host), env=dict(os.environ, **variables, GPUREAP_LOG="gpureap=debug",
                                                           NO_COLOR="1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    line = re.sub(r"\x1b\[[0-9;]*m", "", (result.stderr.strip().splitlines() or [""])[-1])
    names = {"rss_anon_kib": "RssAnon", "rss_file_kib": "RssFile", "vm_rss_kib": "VmRSS", "vm_hwm_kib": "VmHWM"}
    figures = {names[name]: int(value) for name, value in re.findall(r"(\w+)=(\d+)", line) if name in names}
    arenas = re.search(r"malloc_arenas=(\d+)", line)
    return figures, ({"malloc arenas": int(arenas.group(1))} if arenas else {})


def at_exit(binary, variables, host, work):
    """/proc/PID/status and smaps of a run stopped at its exit_group."""
    if binary == "nvidia-smi":
        return {}, {}
    if shutil.which("gdb") is None:
        return logged_at_exit(binary, variables, host)
    dump, script = work / "at-exit.txt", work / "at-exit.py"
    script.write_text(GDB_SCRIPT.format(out=dump))
    subprocess.run(["gdb", "-q", "-batch", "-ex", "set startup-with-shell off", "-ex", "catch syscall exit_group",
                    "-ex", "run", "-ex", f"source {script}", "-ex", "kill",
                    "--args", *status(binary, host)],
                   env=dict(os.environ, **variables), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    proc_status, _, smaps = dump.read_text().partition("\n@@smaps\n")
    figures = {line.split(":")[0]: int(line.split()[1]) for line in proc_status.splitlines()
               if line.startswith(("RssAnon", "RssFile", "VmRSS", "VmHWM"))}
    mappings, current = defaultdict(int), None
    for line in smaps.splitlines():
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            name = fields[5] if len(fields) > 5 else "[anonymous]"
            current = "the binary" if name == binary else (Path(name).name if name.startswith("/") else name)
        elif fields[0] == "Rss:":
            mappings[current] += int(fields[1])
    return figures, dict(mappings)


def main():
    configs = configurations()
    host, work = simulated_host("gpureap-exporter-mem-", GPUS), Path(tempfile.mkdtemp(prefix="gpureap-memory-work-"))
    server = None if GPU else start_server(host, work)
    raw = {}
    lines = [f"# gpureap status --json: {RUNS} runs each, interleaved; {os.cpu_count()} cores, "
             f"{os.uname().release}", ""]
    try:
        while server is not None and not all((work / f"ready{r}").exists() for r in range(GPUS)):
            time.sleep(0.05)
        for crowd_size in CROWDS:
            with crowd.running(crowd_size):
                table, raw[crowd_size] = measure(configs, crowd_size, host, work)
                lines += table
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        shutil.rmtree(host, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if OUT:
        Path(OUT).write_text(text)
        Path(f"{OUT}.json").write_text(json.dumps(raw, indent=1))


def measure(configs, crowd_size, host, work):
    runs = defaultdict(list)
    for round_ in range(RUNS):
        for index in range(len(configs)):
            name, binary, variables = configs[(index + round_) % len(configs)]
            runs[name].append(timed(binary, variables, host))
    load = " / ".join(f"{v:.1f}" for v in os.getloadavg())
    lines = [f"## {crowd_size:,} extra processes ({len(os.listdir('/proc'))} /proc entries, load {load})", "",
             "| configuration | wall, median | CPU user+sys, median (least–most) | peak RSS least / median / most | "
             "at exit: RssAnon / RssFile | resident by mapping at exit (KiB) |", "|---|---|---|---|---|---|"]
    raw = {}
    for name, binary, variables in configs:
        walls, cpus, peaks = zip(*runs[name])
        figures, mappings = at_exit(binary, variables, host, work)
        raw[name] = {"wall_s": walls, "cpu_s": cpus, "peak_kib": peaks, "at_exit": figures, "mappings": mappings}
        biggest = sorted(mappings.items(), key=lambda item: -item[1])[:6]
        lines.append(f"| {name} | {statistics.median(walls) * 1000:.0f} ms | {statistics.median(cpus) * 1000:.0f} ms ({min(cpus) * 1000:.0f}–{max(cpus) * 1000:.0f}) | "
                     f"{min(peaks) / 1024:.2f} / {statistics.median(peaks) / 1024:.2f} / {max(peaks) / 1024:.2f} MiB | "
                     f"{figures.get('RssAnon', 0):,} / {figures.get('RssFile', 0):,} KiB | "
                     + ", ".join(f"{mapping} {kib:,}" for mapping, kib in biggest) + " |")
    return lines + [""], raw


if __name__ == "__main__":
    main()
