#!/usr/bin/env python3
"""gpureap against what users run today, side by side in one run.

    python3 bench/bench.py                 # simulated driver, this machine; report to docs/bench/
    python3 bench/bench.py --quick         # smaller and fewer runs (a smoke test)
    python3 bench/bench.py --gpu --out F   # on an NVIDIA machine: real driver, results to F

It builds gpureap (cargo build --profile dist: the artifacts' build) unless --bin is given. The parts, numbered as their
sections in the report (fleet and fleet-scale have no number there):

1. Seeing: `gpureap status --json` (and `status --json --monitors`, which reads every process's
   descriptors) against `fuser` on the same device nodes (and, with --gpu,
   `nvidia-smi --query-compute-apps`; for reference, plain `nvidia-smi` and
   `nvidia-smi --query-gpu` of the health figures `status` shows, which read the ECC counters
   as `status` does), with 100, 1,000, 5,000 and 20,000 extra idle processes
   of about ten open files each (bench/crowd.py starts and ends them; --quick: 100 and 1,000;
   `--crowds 100,1000` picks others). Wall time (median) and peak RSS, and a plot of time against
   process count, one line per tool (an SVG written by this script: docs/bench/seeing-sim.svg,
   or docs/bench/seeing-h100.svg or -h200.svg with --gpu (the GPU it ran on), or beside the --out file).
2. Freeing: an orphaned 8-worker tree (launcher SIGKILLed), from the command's start to
   verified free: gpureap --grace 0, gpureap with the default grace (workers exit on SIGTERM),
   the recipe `fuser -k <nodes>; sleep 5; <memory query>`, and `pkill -9 -f <name>` followed by
   a memory query every second. With --gpu the kills are scoped to this benchmark's own PIDs
   (`kill -9 <pids>`): the device machines forbid unscoped kills, and the timings are the
   recipe's all the same. With --gpu it also measures the driver's own release time: SIGKILL
   to memory back, as NVML sees it, polled every millisecond.
3. Waiting: how long after the memory is back `gpureap wait` returns, with 5,000 extra
   processes (`--wait-crowd N`; 1,000 with --quick); with `--compare B`, both builds
   interleaved in one run.
5. Idle cost ("idle"): CPU time (GNU time) of `gpureap wait` and of free's verification
   (its GPU held by a worker in scope but protected by name) while the GPU stays held, with
   5,000 extra processes (1,000 with --quick); each also run to a 1 s timeout, for the
   waiting alone.
Fleet ("fleet", not with --gpu): `status -H` over 8 real sshd hosts in network namespaces against 8
   parallel ssh calls and the sequential loop (bench/fleet_bench.py; needs root).

Fleet at scale ("fleet-scale", not with --gpu): `status -H` over 8, 64 and 256 hosts
   (`--hosts 8,64`), each a stand-in (bench/lagged_ssh.sh: ssh to this machine plus the
   latency of a real sshd host of bench/sshd_lab.py, measured first; `--ssh-latency S` gives
   it), against the parallel floors: all at once, and 32 at once (the default --parallel);
   peak RSS per host (bench/fleet_bench.py, run_scale).

Growth plots (bench/growth.py): every run draws, from the figures of the parts that ran, one
SVG per measure with the targets dashed: wall time, CPU time and peak memory of `status`
against extra processes (plus `wait`'s CPU per 5 s on a held GPU), and `status -H`'s wall
time and memory against hosts: docs/bench/growth-{time,cpu,memory}-sim.svg and
fleet-{time,memory}-sim.svg (-h100 or -h200 with --gpu, beside the --out file).

    python3 bench/bench.py --exporter      # only the exporter's part (below); its own section of the doc
    python3 bench/bench.py --parts seeing  # only some parts (seeing, freeing, waiting, idle, fleet, fleet-scale, hour)
    python3 bench/bench.py --parts hour --minutes 62   # the exporter and the watch left running (not by default)
    python3 bench/bench.py --parts waiting --runs 15 --compare B   # more runs per figure (default 5; 3 with --quick)

7. Left running ("hour", only when asked, not with --gpu): bench/exporter_memory.py and
   bench/watch_idle.py side by side for --minutes (62 by default), with one crowd of 5,000 extra
   processes that both see (1,000 with --quick): resident memory's slope (KiB per hour), CPU share of a core,
   the exporter's scrape latency; with `--compare B`, a watch of B beside them.

4. Exporter (`--exporter`): `gpureap exporter --interval 15s` on the simulated host with the
   orphaned tree and 5,000 extra processes (1,000 with --quick): scrape latency p50/p99 over
   scrapes paced 50 ms apart for 30 s (so that scans run during them), and the exporter's CPU
   use (utime + stime from /proc) over 2 minutes (30 s with --quick) of one scrape every 15 s,
   as Prometheus would; with `--compare B`, both builds' exporters run at once over the same
   window, for a side-by-side ratio.

Signals only processes it started. Prints a markdown report; writes it to --out, or to
docs/bench/DATE-HHMM-PART.md (PART: sim, h100, h200 or exporter; UTC), whose figures
docs/performance.md quotes by hand with the report's name.
"""

import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import crowd  # bench/crowd.py, beside this script
from simhost import simulated_host, sleeping  # bench/simhost.py

ROOT = Path(__file__).resolve().parent.parent
GIB = 1 << 30

args = sys.argv[1:]
# The parts, by name (--parts); those that run only on the simulated driver (not with --gpu).
KNOWN_PARTS = ("seeing", "freeing", "waiting", "idle", "fleet", "fleet-scale", "hour")
NOT_ON_GPU = ("fleet", "fleet-scale", "hour")
FLAGS = ("--quick", "--gpu", "--exporter")
OPTIONS = ("--out", "--bin", "--compare", "--crowds", "--parts", "--wait-crowd", "--hosts", "--ssh-latency",
           "--minutes", "--runs")


def usage(message):
    """A bad argument: said on stderr, exit 2, before anything starts."""
    print(f"bench.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def option(flag, convert, default):
    """The value after `flag`, converted; a missing or bad one ends the run before anything starts."""
    if flag not in args:
        return default
    at = args.index(flag)
    if at + 1 >= len(args) or args[at + 1].startswith("--"):
        usage(f"{flag} needs a value")
    try:
        return convert(args[at + 1])
    except ValueError as error:
        usage(f"{flag} {args[at + 1]!r}: {error}")


def counts(text):
    """A comma-separated list of positive whole numbers."""
    values = [int(n) for n in text.split(",")]
    if not values or min(values) <= 0:
        raise ValueError("each must be a positive whole number")
    return values


def above(convert, low=0):
    """A finite number more than `low` (or at least 0, with low=None)."""
    def checked(text):
        value = convert(text)
        if not math.isfinite(value) or not (value >= 0 if low is None else value > low):
            raise ValueError("must be a finite number, at least 0" if low is None
                             else f"must be a finite number more than {low}")
        return value
    return checked


def executable(text):
    path = Path(text).resolve()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ValueError("not an executable file")
    return str(path)


def parts(text):
    chosen = text.split(",")
    unknown = [part for part in chosen if part not in KNOWN_PARTS]
    if unknown:
        raise ValueError(f"no part {', '.join(unknown)}; the parts are {', '.join(KNOWN_PARTS)}")
    return chosen


if "-h" in args or "--help" in args:
    print(__doc__)
    raise SystemExit(0)
for at, argument in enumerate(args):
    if argument in FLAGS or argument in OPTIONS or (at > 0 and args[at - 1] in OPTIONS):
        continue
    usage(f"unknown argument {argument!r} (bench.py --help lists them)")
QUICK = "--quick" in args
GPU = "--gpu" in args


def gpu_kind():
    """The GPU's short name for file names and labels ("h100", "h200"; "gpu" for
    another), from nvidia-smi: the device machines lend both kinds."""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                               stdout=subprocess.PIPE, text=True).stdout
    except OSError:
        return "gpu"
    return next((kind for kind in ("h100", "h200") if kind in names.lower()), "gpu")


KIND = gpu_kind() if GPU else "sim"
OUT = option("--out", Path, None)
BIN = option("--bin", executable, None)
EXPORTER = "--exporter" in args
# --compare OTHER: parts that support it (seeing, waiting, idle, hour) run this build and OTHER side by side.
COMPARE = option("--compare", executable, None)
# Runs per figure (--runs N): seeing, freeing (simulated driver) and waiting.
REPEAT = option("--runs", above(int), 3 if QUICK else 5)
CROWDS = option("--crowds", counts, [100, 1000] if QUICK else [100, 1000, 5000, 20000])
PARTS = option("--parts", parts,
               ["seeing", "freeing", "waiting", "idle"] + ([] if GPU else ["fleet", "fleet-scale"]))
if GPU and any(part in NOT_ON_GPU for part in PARTS):
    usage(f"part {', '.join(p for p in PARTS if p in NOT_ON_GPU)}: the simulated driver's only "
                     "(not with --gpu)")
# Extra processes while `wait` waits for the release (part 3): issue 28 asks for 5,000.
WAIT_CROWD = option("--wait-crowd", above(int), 1000 if QUICK else 5000)
# Hosts of the fleet-scale part; the SSH latency its stand-in adds (default: measured on a real sshd host).
FLEET_HOSTS = option("--hosts", counts, [8, 64] if QUICK else [8, 64, 256])
SSH_LATENCY = option("--ssh-latency", above(float, None), None)
# Part "hour": how long the exporter and the watch are left running, and their crowd.
HOUR_MINUTES = option("--minutes", above(float), 62)
HOUR_CROWD = 1000 if QUICK else 5000
WORKERS = 8
# The health figures `status` reads for each GPU (docs/evidence.md), as nvidia-smi names them.
SMI_HEALTH = ("index,memory.used,ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total,"
              "retired_pages.pending,remapped_rows.pending,remapped_rows.failure")
LINES = []


def say(text=""):
    LINES.append(text)
    print(text, flush=True)


def timed(command, env=None, cpu=None):
    """Runs a command; returns (seconds, peak RSS in KiB, stdout). The peak RSS
    comes from GNU time, which forks from a small process: wait4 here would
    count this Python process's pages that the child had before its exec.
    With a list as `cpu`, its user + system seconds are appended to it."""
    record = tempfile.mktemp(prefix="gpureap-rss-")
    wrapper = ["/usr/bin/time", "-o", record, "-f", "%U %S %M"] if Path("/usr/bin/time").exists() else []
    started = time.perf_counter()
    output = subprocess.run([*wrapper, *command], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env).stdout
    seconds = time.perf_counter() - started
    try:
        user, system, peak = Path(record).read_text().split()[-3:]
        peak = int(peak)
        os.unlink(record)
        if cpu is not None:
            cpu.append(float(user) + float(system))
    except (OSError, ValueError, IndexError):
        peak = 0
    return seconds, peak, output


def rss_text(peaks):
    return f"{max(peaks) / 1024:.1f} MiB" if max(peaks, default=0) else "RSS not measured (no GNU time)"


def median(values):
    return statistics.median(values) if values else float("nan")


class Host:
    """Where GPU nodes live: a simulated host directory, or the real /dev."""

    def __init__(self):
        if GPU:
            self.dir = None
            self.nodes = sorted(str(p) for p in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia(\d+|ctl)", p.name))
            self.backend = "nvml"
        else:
            self.dir = simulated_host("gpureap-bench-", WORKERS)
            self.nodes = [str(self.dir / f"nvidia{i}") for i in range(WORKERS)] + [str(self.dir / "nvidiactl")]
            self.backend = f"sim:{self.dir}"

    def gpureap(self, *arguments, binary=None):
        return [binary or BIN, "--backend", self.backend, *arguments]

    def cleanup(self):
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


def gpu_used(host):
    """Memory used on all GPUs, through gpureap's JSON (the memory query on the simulated driver)."""
    _, _, output = timed(host.gpureap("status", "--json"))
    return sum(gpu["memory_used"] or 0 for gpu in json.loads(output)["gpus"])


def nvml():
    import pynvml

    pynvml.nvmlInit()
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)


class DriverWatch:
    """Polls NVML every millisecond in a thread and notes when the memory is back:
    the driver's own release, seen during the very run being measured."""

    def __init__(self, baseline):
        import threading

        self.back_at = None
        self.done = False
        self.thread = threading.Thread(target=self.poll, args=(baseline,), daemon=True)
        self.thread.start()

    def poll(self, baseline):
        pynvml, handle = nvml()
        while not self.done:
            if pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used <= baseline + 256 * (1 << 20):
                self.back_at = time.perf_counter()
                return
            time.sleep(0.001)

    def stop(self):
        self.done = True
        self.thread.join()


def settled_baseline(host):
    """GPU memory once nothing of ours is left: no process listed, and the same
    reading three times 100 ms apart (a just-killed tree may still be releasing)."""
    if not GPU:
        return 0
    pynvml, handle = nvml()
    readings = []
    deadline = time.time() + 60
    while time.time() < deadline:
        listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        readings.append(pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used)
        if not listed and len(readings) >= 3 and len(set(readings[-3:])) == 1:
            return readings[-1]
        time.sleep(0.1)
    return readings[-1]


def nvml_used():
    pynvml, handle = nvml()
    return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used


class Tree:
    """An SGLang-like tree: a launcher and WORKERS workers, one per GPU (all on GPU 0 with --gpu)."""

    def __init__(self, host, tag):
        self.host, self.tag = host, tag
        self.work = Path(tempfile.mkdtemp(prefix="gpureap-bench-tree-"))
        python_path = os.pathsep.join(p for p in sys.path if p)
        parts = []
        for rank in range(WORKERS):
            title = f"sglang::{tag}_TP{rank}"
            if GPU:
                body = (f'exec -a {title} python3 {ROOT}/scripts/cuda_holder.py hold 2 {self.work}/ready{rank}')
            else:
                body = (f'exec 3<"{host.dir}/nvidia{rank}" 9<"{host.dir}/nvidiactl"; '
                        f'echo {70 * GIB} > "{host.dir}/claims/$BASHPID.{rank}"; '
                        f'touch {self.work}/ready{rank}; exec -a {title} sleep 100000')
            parts.append(f'( echo $BASHPID >> {self.work}/pids; {body} ) & ')
        script = "".join(parts) + "exec -a 'python3 -m sglang.launch_server --tp 8' sleep 100000"
        # The launcher leads its own process group, as a server started from a shell does: its
        # workers stay in that group, which is what makes them orphans once it is gone.
        self.launcher = subprocess.Popen(["bash", "-c", script], env=dict(os.environ, PYTHONPATH=python_path),
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
        deadline = time.time() + 120
        while not all((self.work / f"ready{r}").exists() for r in range(WORKERS)):
            if time.time() > deadline:
                raise RuntimeError("workers did not start")
            time.sleep(0.02)
        time.sleep(0.1)
        self.pids = [int(line) for line in (self.work / "pids").read_text().split()]
        # The crash: the launcher dies, its workers are orphaned and keep their memory.
        self.launcher.kill()
        self.launcher.wait()
        deadline = time.time() + 5
        while any(ppid(pid) != 1 for pid in self.pids if alive(pid)):
            if time.time() > deadline:
                self.cleanup()
                raise SystemExit("the workers were not re-parented to PID 1 (a subreaper above this benchmark?): "
                                 "run it where orphans go to PID 1")
            time.sleep(0.005)

    def cleanup(self):
        for pid in self.pids:
            if alive(pid) and Path(f"/proc/{pid}/cmdline").read_bytes().startswith(f"sglang::{self.tag}".encode()):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.work, ignore_errors=True)


def ppid(pid):
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, IndexError):
        return None


def alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return False


def wait_until_free(host, baseline, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        used = nvml_used() if GPU else gpu_used(host)
        if used <= baseline + 256 * (1 << 20):
            return True
        time.sleep(0.05)
    return False


def room_for(crowd_size):
    """Whether this many more processes fit under the PID limit, with 2,000 to spare."""
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return True
    running = sum(1 for entry in os.listdir("/proc") if entry.isdigit())
    return running + crowd_size + 2000 <= pid_max


def seeing(host):
    say("## 1. Seeing: who holds the GPUs\n")
    say(f"Each figure is the median of {REPEAT} runs, interleaved, each through GNU time (its ~1 ms is in every figure); "
        "peak RSS from GNU time. The extra processes are idle `sleep`s with 13 descriptors each (bench/crowd.py). "
        "Load average (1 min) when each crowd's runs ended in the last column: the runs of a row share it.\n")
    tree = Tree(host, "see")
    fuser = shutil.which("fuser")
    tools = [("gpureap", "gpureap status --json", host.gpureap("status", "--json")),
             ("monitors", "status --json --monitors", host.gpureap("status", "--json", "--monitors"))]
    if fuser:
        tools.append(("fuser", "fuser (list only)", ["fuser", *host.nodes]))
    if GPU:
        tools.append(("smi", "nvidia-smi --query-compute-apps",
                      ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"]))
        # What the user types, and the GPU health status shows: both read the ECC counters.
        tools.append(("smi-plain", "nvidia-smi", ["nvidia-smi"]))
        tools.append(("smi-health", "nvidia-smi --query-gpu (health)", ["nvidia-smi", f"--query-gpu={SMI_HEALTH}",
                                                                         "--format=csv"]))
    if COMPARE:
        tools.append(("compare", "--compare build status --json", host.gpureap("status", "--json", binary=COMPARE)))
    header = "| extra processes | gpureap status --json | status --json --monitors (every process's descriptors) |"
    rule = "|---|---|---|"
    if fuser:
        header += " fuser (list only) | fuser / gpureap |"
        rule += "---|---|"
    if GPU:
        header += (" nvidia-smi --query-compute-apps | nvidia-smi / gpureap | nvidia-smi (plain) | plain / gpureap |"
                   " --query-compute-apps + --query-gpu health (two calls) | both / gpureap |")
        rule += "---|---|---|---|---|---|"
    if COMPARE:
        header += " --compare build | --compare / this build |"
        rule += "---|---|"
    say(header + " load |")
    say(rule + "---|")
    series = {label: [] for _, label, _ in tools}
    skipped = []
    try:
        for crowd_size in CROWDS:
            if not room_for(crowd_size):
                skipped.append(crowd_size)
                continue
            with crowd.running(crowd_size):
                times = {name: [] for name, _, _ in tools}
                rss = {name: [] for name, _, _ in tools}
                cpu = {name: [] for name, _, _ in tools}
                for _ in range(REPEAT):
                    for name, _, command in tools:
                        seconds, peak, _ = timed(command, cpu=cpu[name])
                        times[name].append(seconds)
                        rss[name].append(peak)
                wait_cost(host, crowd_size)
                load = os.getloadavg()[0]
            for name, label, _ in tools:
                series[label].append((crowd_size, median(times[name]) * 1000))
            grow(crowd_size, tools, times, cpu, rss)
            g = median(times["gpureap"])
            row = f"| {crowd_size:,} | {g * 1000:.0f} ms, {rss_text(rss['gpureap'])} |"
            row += f" {median(times['monitors']) * 1000:.0f} ms, {rss_text(rss['monitors'])} |"
            if fuser:
                f = median(times["fuser"])
                row += f" {f * 1000:.0f} ms, {rss_text(rss['fuser'])} | {f / g:.1f}x |"
            if GPU:
                s = median(times["smi"])
                row += f" {s * 1000:.0f} ms, {rss_text(rss['smi'])} | {s / g:.2f}x |"
                p = median(times["smi-plain"])
                row += f" {p * 1000:.0f} ms, {rss_text(rss['smi-plain'])} | {p / g:.2f}x |"
                # Each run's two calls, added run by run, then the median.
                both = median([a + b for a, b in zip(times["smi"], times["smi-health"])])
                row += f" {both * 1000:.0f} ms | {both / g:.2f}x |"
            if COMPARE:
                c = median(times["compare"])
                row += f" {c * 1000:.0f} ms, {rss_text(rss['compare'])} | {c / g:.2f}x |"
            say(row + f" {load:.1f} |")
    finally:
        tree.cleanup()
    say()
    if skipped:
        say(f"Not measured: {', '.join(f'{n:,}' for n in skipped)} extra processes (they would not fit under "
            f"kernel.pid_max with 2,000 to spare).\n")
    name = f"seeing-{KIND}.svg"
    svg = OUT.parent / name if OUT else ROOT / "docs/bench" / name
    where = f"the {KIND.upper()} host" if GPU else "this machine, simulated driver"
    if any(len(points) >= 2 for points in series.values()):
        import growth

        svg.parent.mkdir(parents=True, exist_ok=True)
        svg.write_text(growth.chart(f"Seeing: median wall time against extra processes ({where})",
                                     "extra processes", "median wall time", " ms", series, {}))
        say(f"![time against extra processes, one line per tool](bench/{name})\n")
        say(f"(The plot: `docs/bench/{name}`, drawn by this script from the table above.)\n")


def grow(crowd_size, tools, times, cpu, rss):
    """Feeds the growth plots (bench/growth.py) with one crowd's figures and
    draws the targets as anchors: at most half of fuser's time, at most
    nvidia-smi's time and peak memory (with --gpu), under 8 MiB without a driver."""
    import growth

    for name, label, _ in tools:
        growth.add("time", label, crowd_size, median(times[name]) * 1000)
        if cpu[name]:
            growth.add("cpu", label, crowd_size, median(cpu[name]) * 1000)
        if max(rss[name], default=0):
            growth.add("memory", label, crowd_size, max(rss[name]) / 1024)
    if "fuser" in times:
        growth.anchor("time", "target: half of fuser's time", crowd_size, median(times["fuser"]) * 500)
    if "smi" in times:
        growth.anchor("time", "target: at most nvidia-smi's time", crowd_size, median(times["smi"]) * 1000)
        growth.anchor("memory", "target: at most nvidia-smi's peak", crowd_size, max(rss["smi"]) / 1024)
    else:
        growth.anchor("memory", "target without a driver: 8 MiB", crowd_size, 8.0)


def wait_cost(host, crowd_size, seconds=5):
    """CPU (user + system, GNU time) of one `gpureap wait` that runs to a
    `seconds` timeout on a held GPU, start-up and the final holder table
    included: the issue's "CPU per 5 s". For the growth plot of CPU."""
    import growth

    cpu = []
    timed(host.gpureap("wait", "--gpu", "0", "--below", "1MiB", "--timeout", f"{seconds}s"), cpu=cpu)
    if cpu:
        growth.add("cpu", f"gpureap wait, {seconds} s on a held GPU", crowd_size, cpu[0] * 1000)
        growth.anchor("cpu", f"target: wait under 5% of a core ({seconds * 50} ms per {seconds} s)",
                      crowd_size, seconds * 50)
    return cpu[0] if cpu else None


def freeing(host):
    say("## 2. Freeing: an orphaned 8-worker tree, from the command's start to verified free\n")
    baseline = settled_baseline(host)
    nodes = " ".join(host.nodes)
    query = ("nvidia-smi --query-gpu=index,memory.used --format=csv,noheader" if GPU
             else " ".join(host.gpureap("status", "--json")) + " > /dev/null")
    methods = [
        # --match narrows --orphans to this benchmark's own workers: never anyone else's.
        ("gpureap free --orphans --grace 0",
         lambda tree: host.gpureap("free", "--orphans", "--match", f"sglang::{tree.tag}_", "--grace", "0", "--yes", "--json")),
        ("gpureap free --orphans (default 5s grace; workers exit on SIGTERM)",
         lambda tree: host.gpureap("free", "--orphans", "--match", f"sglang::{tree.tag}_", "--yes", "--json")),
        ("fuser -k <nodes>; sleep 5; <memory query>" + (" (kill scoped to the workers)" if GPU else ""),
         lambda tree: ["bash", "-c", (f"kill -9 {' '.join(map(str, tree.pids))}" if GPU else f"fuser -k {nodes} >/dev/null 2>&1")
                       + f"; sleep 5; {query} >/dev/null"]),
        ("pkill -9 -f <name>; <memory query> every second until free" + (" (kill scoped)" if GPU else ""),
         lambda tree: ["bash", "-c", (f"kill -9 {' '.join(map(str, tree.pids))}" if GPU else f"pkill -9 -f '[s]glang::{tree.tag}_'")
                       + f"; until {poll_free(host, baseline)}; do sleep 1; done"]),
    ]
    say("| method | median | verified by the tool | / gpureap --grace 0 |" + (" driver released (same runs) | done after the release |" if GPU else ""))
    say("|---|---|---|---|" + ("---|---|" if GPU else ""))
    medians = {}
    for name, command in methods:
        runs, freed_ms, released, after = [], [], [], []
        for attempt in range(REPEAT if not GPU else 3):
            tree = Tree(host, f"free{len(medians)}{attempt}")
            try:
                watch = DriverWatch(baseline) if GPU else None
                launched = time.perf_counter()
                seconds, _, output = timed(command(tree))
                if watch:
                    watch.stop()
                    if watch.back_at:
                        released.append(watch.back_at - launched)
                        after.append(seconds - (watch.back_at - launched))
                if output.startswith(b"{"):
                    report = json.loads(output)
                    freed_ms.append(max(g["freed_after_ms"] or 0 for g in report["gpus"]))
                    assert all(g["freed"] for g in report["gpus"]), report
                else:
                    assert wait_until_free(host, baseline, 5), "the recipe left memory held"
                runs.append(seconds)
            finally:
                tree.cleanup()
                wait_until_free(host, baseline)
        medians[name] = median(runs)
        verified = f"yes (verified free at {median(freed_ms):.0f} ms)" if freed_ms else "no"
        first = medians[methods[0][0]]
        row = f"| `{name}` | {medians[name] * 1000:.0f} ms | {verified} | {medians[name] / first:.1f}x |"
        if GPU:
            row += (f" {median(released) * 1000:.0f} ms | {median(after) * 1000:.0f} ms |" if released else " - | - |")
        say(row)
    if GPU:
        release = []
        for attempt in range(3):
            tree = Tree(host, f"release{attempt}")
            pynvml, handle = nvml()
            try:
                started = time.perf_counter()
                for pid in tree.pids:
                    os.kill(pid, signal.SIGKILL)
                while pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used > baseline + 256 * (1 << 20):
                    time.sleep(0.001)
                release.append(time.perf_counter() - started)
            finally:
                tree.cleanup()
        say(f"| driver's own release, alone (SIGKILL all 8 to memory back, NVML polled every 1 ms) | {median(release) * 1000:.0f} ms | - | {median(release) / medians[methods[0][0]]:.2f}x | - | - |")
        medians["driver release"] = median(release)
    say()
    return medians


def poll_free(host, baseline):
    if GPU:
        return (f"[ $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1) -le "
                f"{(baseline + 256 * (1 << 20)) >> 20} ]")
    return " ".join(host.gpureap("wait", "--gpu", "all", "--below", "256MiB", "--timeout", "0")) + " >/dev/null"


def waiting(host):
    say("## 3. Waiting: how soon `gpureap wait` returns once the memory is back\n")
    baseline = settled_baseline(host)
    lags = {label: [] for label, _ in BINS}
    crowd_size = WAIT_CROWD
    with crowd.running(crowd_size):
        # Interleaved: each attempt runs every build, so that a slow moment hits all alike.
        for attempt in range(REPEAT if "--runs" in args or not GPU else 3):
            for label, binary in BINS:
                lags[label].append(wait_lag(host, baseline, f"wait{attempt}{len(lags[label])}{BINS.index((label, binary))}",
                                            binary))
        load = os.getloadavg()[0]
    since = ("the memory being back, seen by NVML polled every millisecond" if GPU
             else "the SIGKILL of the holders (an upper bound: the simulated driver frees at their exit)")
    say(f"{crowd_size:,} extra processes (bench/crowd.py); from {since} to `gpureap wait` having exited. "
        f"Target (issue 28): within 100 ms. Load average (1 min) at the end: {load:.1f}.\n")
    say("| build | median | max | runs |")
    say("|---|---|---|---|")
    for label, values in lags.items():
        say(f"| {label} | {median(values) * 1000:.1f} ms | {max(values) * 1000:.1f} ms | {len(values)} |")
    say()
    return median(lags[BINS[0][0]])


def wait_lag(host, baseline, tag, binary):
    """One run: a tree holds GPU 0, `gpureap wait` waits on it, the tree is
    killed; seconds from the release (or the kill) to the wait's exit."""
    tree = Tree(host, tag)
    below = f"{(baseline >> 20) + 1024}MiB" if GPU else "1GiB"
    waiter = subprocess.Popen(host.gpureap("wait", "--gpu", "0", "--below", below, "--timeout", "60s", binary=binary),
                              stdout=subprocess.DEVNULL)
    try:
        # Until it waits on the driver: its first reading (a scan of every
        # process on the simulated driver) is done and it sleeps.
        deadline = time.time() + 30
        while time.time() < deadline and not sleeping(waiter.pid):
            time.sleep(0.05)
        time.sleep(0.3)
        killed = time.perf_counter()
        for pid in tree.pids:
            os.kill(pid, signal.SIGKILL)
        if GPU:
            pynvml, handle = nvml()
            while pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used > baseline + GIB:
                time.sleep(0.001)
            back = time.perf_counter()
        else:
            # The simulated driver frees the memory as the killed processes close
            # their descriptors, within a millisecond or so: the time from the kill
            # is an upper bound of gpureap's lag.
            back = killed
        waiter.wait(timeout=60)
        return time.perf_counter() - back
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
        tree.cleanup()
        wait_until_free(host, baseline)


def idle(host):
    """CPU used by `wait` and by free's verification while nothing changes,
    with a crowd of extra processes: user + system time from GNU time over
    the whole command (start-up included), divided by its wall time."""
    crowd_size = 1000 if QUICK else 5000
    seconds = 10 if QUICK else 30
    repeat = 2 if QUICK else 3
    say(f"## 5. Waiting without burning: CPU while the GPU stays held, {crowd_size:,} extra processes\n")
    held = ("the benchmark's tree: out of `wait`'s scope" if GPU else
            "the benchmark's tree: out of `wait`'s scope, in free's but protected by name, beside 5 GiB held by "
            "no process")
    say(f"Each command runs {seconds} s against a GPU that stays held ({held}); "
        f"CPU is user + system time from GNU time over the whole run, start-up included, divided by its wall time. "
        f"Median of {repeat} runs, interleaved.\n")
    tree = Tree(host, "idle")
    if not GPU:
        # Memory that no process explains, as a crashed engine leaves it.
        host.dir.joinpath("leak.0").write_text(f"{5 * GIB}\n")
    commands = [
        ("gpureap wait --gpu 0 (below 1 MiB)",
         host.gpureap("wait", "--gpu", "0", "--below", "1MiB", "--timeout", f"{seconds}s")),
    ]
    # Not on a GPU host: a free of GPU 0 there would signal whatever else holds it.
    if not GPU:
        # The tree's worker on GPU 0 is in scope but protected by name, so the
        # GPU stays held and the verification runs to its timeout. (Memory held
        # by no process since before the free, like the leak, is not waited
        # for, and a free with nothing in scope ends at once: this row measured
        # that, its start-up alone, until round 12.)
        commands.append(
            ("gpureap free --gpu 0 --protect <its holder> --grace 0 (verification to its timeout)",
             host.gpureap("free", "--gpu", "0", "--protect", "sglang::idle_TP0", "--grace", "0",
                          "--timeout", f"{seconds}s", "--yes", "--json")))
    if len(BINS) > 1:
        commands = [(f"{name} [{label}]", [binary, *command[1:]]) for name, command in commands
                    for label, binary in BINS]
    shares = {name: [] for name, _ in commands}
    # The waiting alone: each command also runs to a 1 s timeout, and the CPU
    # the longer run used beyond it, over the wall time beyond it, is what
    # waiting costs without the fixed part (start-up, the first reading,
    # the holder table at the timeout).
    alone = {name: [] for name, _ in commands}

    def with_timeout(command, timeout):
        at = command.index("--timeout") + 1
        return [*command[:at], timeout, *command[at + 1:]]

    def cpu_of(command):
        cpu = []
        wall, _, _ = timed(command, cpu=cpu)
        # Each runs to its timeout, or its share is not what the row says.
        timeout = float(command[command.index("--timeout") + 1].rstrip("s"))
        if wall < 0.9 * timeout:
            raise SystemExit(f"bench.py: {' '.join(command[1:])} ended after {wall:.2f} s, before its "
                             f"{timeout:g} s timeout: its CPU share would not be the waiting's")
        return cpu[0], wall

    try:
        with crowd.running(crowd_size):
            for _ in range(repeat):
                for name, command in commands:
                    cpu, wall = cpu_of(command)
                    shares[name].append(cpu / wall * 100)
                    if name in alone:
                        short_cpu, short_wall = cpu_of(with_timeout(command, "1s"))
                        alone[name].append(max(cpu - short_cpu, 0.0) / (wall - short_wall) * 100)
            load = os.getloadavg()[0]
    finally:
        tree.cleanup()
        if not GPU:
            host.dir.joinpath("leak.0").unlink(missing_ok=True)
    say("| command | CPU, share of one core (median) | max | the waiting alone (median) |")
    say("|---|---|---|---|")
    for name, values in shares.items():
        waiting = f"{median(alone[name]):.2f}%" if alone.get(name) else "-"
        say(f"| `{name}` | {median(values):.1f}% | {max(values):.1f}% | {waiting} |")
    say(f"\nThe waiting alone: the CPU a {seconds} s run used beyond a 1 s run of the same command, over the wall "
        f"time beyond it (start-up, the first reading and the holder table at the timeout left out).")
    say(f"\nTarget: under 5% of a core with 5,000 extra processes (issue 28 for `wait`, issue 12 for free's "
        f"verification). Load average (1 min) at the end: {load:.1f}.\n")


def scrape(port):
    """One GET /metrics on a new connection; returns (seconds, body)."""
    import http.client
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/metrics")
    response = connection.getresponse()
    body = response.read()
    connection.close()
    if response.status != 200:
        raise RuntimeError(f"scrape answered {response.status}")
    return time.perf_counter() - started, body.decode()


def cpu_ticks(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def start_exporter(host, binary, *flags):
    """An exporter on a free loopback port: (process, port)."""
    server = subprocess.Popen(host.gpureap("exporter", "--listen", "127.0.0.1:0", "--interval", "15s", *flags,
                                           binary=binary),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = server.stderr.readline()
    return server, int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))


def exporter(host):
    crowd_size = 1000 if QUICK else 5000
    pace, latency_window = 0.05, (10 if QUICK else 30)
    cpu_window = 30 if QUICK else 120
    say("## 4. Exporter: scrape latency and CPU use\n")
    say(f"`gpureap exporter --interval 15s` on the {'real' if GPU else 'simulated'} host: the orphaned 8-worker tree plus "
        f"{crowd_size:,} extra idle processes (bench/crowd.py). Latency (this build): GET /metrics on a new connection "
        f"each, paced {pace * 1000:.0f} ms apart for {latency_window} s, so that background scans run during them. "
        f"CPU: utime + stime of each exporter over the same {cpu_window} s, every build's exporter running at once "
        f"(side by side), with one scrape of each every 15 s, as Prometheus would.\n")
    tree = Tree(host, "exp")
    ready = Path(tempfile.mktemp(prefix="gpureap-crowd-"))
    crowd = subprocess.Popen([sys.executable, str(ROOT / "bench/crowd.py"), str(crowd_size), str(ready)])
    servers = []
    try:
        while not ready.exists():
            time.sleep(0.05)
        rows = []
        for flags in ([], ["--per-process"]):
            server, port = start_exporter(host, BIN, *flags)
            servers.append(server)
            latencies, body = [], ""
            finish = time.time() + latency_window
            while time.time() < finish:
                seconds, body = scrape(port)
                latencies.append(seconds)
                time.sleep(pace)
            scan = re.search(r"^gpureap_scan_duration_seconds (\S+)", body, re.M)
            scans = re.search(r"^gpureap_scans_total (\S+)", body, re.M)
            rows.append({
                "flags": " ".join(flags) or "(default)",
                "scrapes": len(latencies),
                "p50": percentile(latencies, 0.5) * 1000,
                "p99": percentile(latencies, 0.99) * 1000,
                "max": max(latencies) * 1000,
                "bytes": len(body),
                "scan": float(scan.group(1)) * 1000 if scan else float("nan"),
                "scans": int(float(scans.group(1))) if scans else 0,
            })
            server.terminate()
            server.wait()
            servers.remove(server)
        say("| flags | scrapes | p50 | p99 | max | body | last scan | scans during the scrapes |")
        say("|---|---|---|---|---|---|---|---|")
        for row in rows:
            say(f"| {row['flags']} | {row['scrapes']} | {row['p50']:.2f} ms | {row['p99']:.2f} ms | {row['max']:.1f} ms | "
                f"{row['bytes'] / 1024:.1f} KiB | {row['scan']:.0f} ms | {row['scans']} |")
        say()

        running = []
        for name, binary in BINS:
            server, port = start_exporter(host, binary)
            servers.append(server)
            running.append((name, server, port))
        # Each exporter prints its address once its first scan is done, so that scan is not in the window.
        def scans_total(port):
            found = re.search(r"^gpureap_scans_total (\S+)", scrape(port)[1], re.M)
            return int(float(found.group(1))) if found else 0
        before = [(cpu_ticks(server.pid), time.time(), scans_total(port)) for _, server, port in running]
        started = time.time()
        while time.time() - started < cpu_window:
            for _, _, port in running:
                scrape(port)
            time.sleep(min(15, max(0, cpu_window - (time.time() - started))))
        cpu = []
        for (name, server, port), (ticks, since, scans) in zip(running, before):
            used = (cpu_ticks(server.pid) - ticks) / os.sysconf("SC_CLK_TCK")
            status = Path(f"/proc/{server.pid}/status").read_text()
            cpu.append((name, used / (time.time() - since) * 100,
                        int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024,
                        scans_total(port) - scans))
        say("| build | CPU at a 15 s interval (target: under 1% of a core) | resident memory | scans in the window |")
        say("|---|---|---|---|")
        for name, share, rss, scans in cpu:
            say(f"| {name} | {share:.2f}% of one core | {rss:.1f} MiB | {scans} |")
        if len(cpu) > 1 and cpu[0][1] > 0:
            say()
            say(f"Ratio, --compare build / this build: {cpu[1][1] / cpu[0][1]:.1f}x the CPU.")
        say()
        say(f"Load average at the end: {' / '.join(f'{load:.1f}' for load in os.getloadavg())} (1 / 5 / 15 min).")
        say()
    finally:
        for server in servers:
            server.kill()
            server.wait()
        crowd.send_signal(signal.SIGTERM)
        crowd.wait()
        ready.unlink(missing_ok=True)
        tree.cleanup()


BINS = []


def fleet_scale():
    """`status -H` over 8 to 256 stand-in hosts (bench/fleet_bench.py, run_scale),
    fed to the growth plots: wall time against hosts with 1.25x the floor as the
    anchor, and gpureap's peak memory against hosts."""
    sys.path.insert(0, str(ROOT / "bench"))
    import fleet_bench
    import growth

    results, _ = fleet_bench.run_scale(say, BIN, QUICK, FLEET_HOSTS, SSH_LATENCY)
    for count, figures in results.items():
        for name, (wall, rss, _) in figures.items():
            short = name.replace(f" h[1-{count}]", "").replace(f"--parallel {count}", "--parallel N")
            growth.add("fleet-time", short, count, wall * 1000)
            if name.startswith("gpureap"):
                growth.add("fleet-memory", short, count, rss / 1024)
        growth.anchor("fleet-time", "target: 1.25x the all-at-once floor", count,
                      figures["floor: all at once (shell &, wait)"][0] * 1250)
        growth.anchor("fleet-time", "target: 1.25x the 32-at-once floor", count,
                      figures["floor: 32 at once (xargs -P 32)"][0] * 1250)


def plots():
    """The growth plots (bench/growth.py) of whatever parts ran: into docs/bench/,
    or beside the --out file."""
    sys.path.insert(0, str(ROOT / "bench"))
    import growth

    folder = OUT.parent if OUT else ROOT / "docs/bench"
    suffix, where = (KIND, f"the {KIND.upper()} host") if GPU else ("sim", "this machine, simulated driver")
    written = growth.draw(folder, suffix, where)
    if written:
        say("## Growth plots\n")
        say("Drawn by bench/growth.py from the figures above; targets dashed.\n")
        for name in written:
            say(f"![{name}](bench/{name})\n")


def shown_arguments():
    """This run's flags, less the paths of --bin and --out."""
    shown, skip = [], False
    for argument in args:
        if skip:
            skip = False
        elif argument in ("--bin", "--out"):
            skip = True
        elif argument == "--compare":
            shown.append("--compare OTHER_BUILD")
            skip = True
        else:
            shown.append(argument)
    return "".join(f" {argument}" for argument in shown)


def left_running():
    """Part "hour": the exporter (bench/exporter_memory.py) and the watch's idle loop
    (bench/watch_idle.py) left running side by side for --minutes (62 by default), with one crowd
    of idle processes: their resident memory's slope, CPU share and scrape latency."""
    say(f"## 7. Left running: memory and CPU over {HOUR_MINUTES:g} minute{'' if HOUR_MINUTES == 1 else 's'}\n")
    say("The exporter (`bench/exporter_memory.py`: scraped every 15 s, `--per-process`) and the watch "
        "(`bench/watch_idle.py`: `reap --watch`, a look every 10 s) ran side by side, each on a simulated 8-GPU "
        f"host of its own, with one crowd of {HOUR_CROWD:,} extra processes that both see "
        "(each also sees the other's server); each script's report as it printed it.\n")
    work = Path(tempfile.mkdtemp(prefix="gpureap-bench-hour-"))
    scripts = {"exporter": ("exporter_memory.py", BIN), "watch": ("watch_idle.py", BIN)}
    if COMPARE:
        say("With `--compare`, a second watch of the other build ran beside them, on a host of its own.\n")
        scripts["compare"] = ("watch_idle.py", COMPARE)
    running = {}
    try:
        left_running_in(work, scripts, running)
    finally:
        for child in running.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                child.wait()
        shutil.rmtree(work, ignore_errors=True)


def left_running_in(work, scripts, running):
    """The hour part's runs (each child in `running` as it starts) and their reports."""
    with crowd.running(HOUR_CROWD):
        for name, (script, binary) in scripts.items():
            running[name] = subprocess.Popen([sys.executable, str(ROOT / "bench" / script), "--bin", binary,
                                              "--minutes", str(HOUR_MINUTES), "--crowd", "0",
                                              "--out", str(work / f"{name}.md")],
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        outputs = {name: child.communicate()[0] for name, child in running.items()}
    for name, child in running.items():
        report = work / f"{name}.md"
        title = {"exporter": "The exporter", "watch": "The watch", "compare": "The watch, --compare build"}[name]
        say(f"### {title}\n")
        if child.returncode == 0 and report.exists():
            say(report.read_text())
        else:
            say(f"bench/{scripts[name][0]} exited {child.returncode}:\n\n```\n{outputs[name][-2000:]}\n```\n")


def main():
    global BIN
    # SIGTERM unwinds as an exit does, so that what this run started is ended (finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if BIN is None:
        subprocess.run(["cargo", "build", "--profile", "dist", "--quiet"], cwd=ROOT, check=True)
        BIN = str(ROOT / "target/dist/gpureap")
    if not GPU and not shutil.which("fuser"):
        raise SystemExit("fuser is needed (Debian: psmisc)")
    BINS.append(("this build", BIN))
    if COMPARE:
        BINS.append(("--compare build", COMPARE))
    host = Host()
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), platform.processor())
        label = f"{KIND.upper()} (real driver)" if GPU else "simulated driver"
        say(f"# Results: {label}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
        say(f"Machine: {os.cpu_count()} cores ({cpu}), kernel {platform.release()}, "
            f"{subprocess.run([BIN, '--version'], stdout=subprocess.PIPE, text=True).stdout.strip()}"
            f"{', ' + ' and '.join(sorted(set(subprocess.run(['nvidia-smi', '--query-gpu=name,driver_version', '--format=csv,noheader'], stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()))) if GPU else ''}. "
            f"Command: `python3 bench/bench.py{shown_arguments()}`. Load average at the start: "
            f"{' / '.join(f'{load:.1f}' for load in os.getloadavg())} (1 / 5 / 15 min).\n")
        if EXPORTER:
            exporter(host)
        else:
            if "seeing" in PARTS:
                seeing(host)
            if "freeing" in PARTS:
                freeing(host)
            if "waiting" in PARTS:
                waiting(host)
            if "idle" in PARTS:
                idle(host)
            if "fleet" in PARTS:
                sys.path.insert(0, str(ROOT / "bench"))
                import fleet_bench
                fleet_bench.run(say, BIN, QUICK)
            if "fleet-scale" in PARTS:
                fleet_scale()
            if "hour" in PARTS:
                left_running()
    finally:
        host.cleanup()
    plots()
    report = "\n".join(LINES) + "\n"
    if OUT:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(report)
    else:
        section = "exporter" if EXPORTER else KIND
        stamp = time.strftime("%Y-%m-%d-%H%M", time.gmtime())
        written = ROOT / "docs/bench" / f"{stamp}-{section}.md"
        written.write_text(report)
        print(f"wrote {written}")


if __name__ == "__main__":
    main()
