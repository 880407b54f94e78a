#!/usr/bin/env python3
"""What `gpureap reap --watch` costs while nothing happens, over a long run.

    python3 bench/watch_idle.py [--bin target/dist/gpureap] [--minutes 10] [--crowd 5000]
                                [--interval 10s] [--out FILE]

On a simulated 8-GPU host (a directory, docs/simulated-driver.md) it starts a healthy
SGLang-like server (a launcher and 8 workers, each holding 70 GiB of its GPU: the driver lists
them, no rule names them), bench/crowd.py's crowd of idle processes (5,000 by default), and
`gpureap reap --watch --orphans --supervisor-gone --older-than 10m --interval 10s --enforce
--log FILE --listen 127.0.0.1:0`. Every interval it samples the watch's CPU time (utime + stime,
/proc/PID/stat) and resident memory (VmRSS), and at the end prints: the CPU share of one core
over the whole run, the resident memory's least-squares slope (KiB per hour), over the run and
over its second half (after warm-up), its first and last samples and one a minute, and how many full looks the watch took (its own gpureap_scans_total) against its
cycles (gpureap_reap_cycles_total). With --out FILE, each sample is also appended to
FILE.samples as it is taken (seconds, CPU seconds, KiB, processes on the host), so that a run cut short still shows
its trend. Signals only what it started. docs/performance.md quotes it.
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from simhost import option, simulated_host, start_server, stop  # bench/simhost.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
GPUS = 8


BIN = str(Path(option("--bin", ROOT / "target/dist/gpureap")).resolve())
MINUTES = float(option("--minutes", "10"))
CROWD = int(option("--crowd", "5000"))
INTERVAL = option("--interval", "10s")
OUT = option("--out", None)


def seconds(text):
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text)
    value, unit = float(match.group(1)), match.group(2)
    return value / 1000 if unit == "ms" else value * 60 if unit == "m" else value


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_processes():
    """Processes on the host now: each scan's buffers grow with them, so a
    memory trend is read beside this count."""
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def metric(port, name):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise RuntimeError(f"no {name}")


def slope(points):
    """Least-squares slope of (x, y) points."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    num = sum((x - mean_x) * (y - mean_y) for x, y in points)
    den = sum((x - mean_x) ** 2 for x, _ in points)
    return num / den if den else 0.0


def main():
    # SIGTERM unwinds as an exit does, so that what this run started is ended (finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    host = simulated_host("gpureap-watch-bench-", GPUS)
    work = Path(tempfile.mkdtemp(prefix="gpureap-watch-bench-work-"))
    server = start_server(host, work, GPUS)
    ready = work / "crowd-ready"
    crowd = subprocess.Popen([sys.executable, str(ROOT / "bench/crowd.py"), str(CROWD), str(ready)])
    watch = None
    try:
        while not all((work / f"ready{r}").exists() for r in range(GPUS)) or not ready.exists():
            if crowd.poll() is not None:
                raise SystemExit(f"bench/crowd.py could not start {CROWD} processes")
            time.sleep(0.05)
        log = work / "reap.jsonl"
        watch = subprocess.Popen([BIN, "--backend", f"sim:{host}", "reap", "--watch", "--orphans",
                                  "--supervisor-gone", "--older-than", "10m", "--interval", INTERVAL,
                                  "--enforce", "--log", str(log), "--listen", "127.0.0.1:0"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port = None
        while port is None:
            line = watch.stderr.readline()
            if not line:
                raise SystemExit("the watch ended at start")
            found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/", line)
            port = int(found.group(1)) if found else None
        started, cpu0 = time.monotonic(), cpu_seconds(watch.pid)
        samples = []
        step = seconds(INTERVAL)
        end = started + MINUTES * 60
        while time.monotonic() < end:
            time.sleep(min(step, max(0.0, end - time.monotonic())))
            samples.append((time.monotonic() - started, cpu_seconds(watch.pid) - cpu0, rss_kib(watch.pid)))
            if OUT:
                with open(f"{OUT}.samples", "a") as trace:
                    trace.write(f"{samples[-1][0]:.1f} {samples[-1][1]:.2f} {samples[-1][2]} {host_processes()}\n")
        wall = time.monotonic() - started
        cpu = cpu_seconds(watch.pid) - cpu0
        scans, cycles = metric(port, "gpureap_scans_total"), metric(port, "gpureap_reap_cycles_total")
        rss = [(t / 3600, kib) for t, _, kib in samples]
        second_half = rss[len(rss) // 2:]
        per_minute = {}
        for t, _, kib in samples:
            per_minute.setdefault(int(t // 60), kib)
        lines = [
            f"# reap --watch idle: {CROWD:,} extra processes started, {host_processes():,} on the host, --interval {INTERVAL}, "
            f"{wall / 60:.1f} min",
            "",
            f"Machine: {os.cpu_count()} cores, {os.uname().release}; binary {BIN}; "
            f"load average at the end {os.getloadavg()[0]:.1f}.",
            "",
            "| figure | value |",
            "|---|---|",
            f"| CPU, share of one core over the run | {cpu / wall * 100:.2f}% ({cpu:.2f} s in {wall:.0f} s) |",
            f"| resident memory, first / last sample | {samples[0][2] / 1024:.1f} MiB / {samples[-1][2] / 1024:.1f} MiB |",
            f"| resident memory, least-squares slope | {slope(rss):+.1f} KiB per hour ({len(samples)} samples); "
            f"second half: {slope(second_half):+.1f} KiB per hour |",
            f"| resident memory, each minute (MiB) | {' '.join(f'{kib / 1024:.1f}' for kib in per_minute.values())} |",
            f"| full looks / cycles | {scans:.0f} / {cycles:.0f} |",
            f"| decision lines logged | {len(log.read_text().splitlines()) if log.exists() else 0} |",
        ]
        text = "\n".join(lines) + "\n"
        print(text)
        if OUT:
            Path(OUT).write_text(text)
    finally:
        stop(watch, crowd, server, host, work)


if __name__ == "__main__":
    main()
