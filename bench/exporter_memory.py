#!/usr/bin/env python3
"""Whether `gpureap exporter`'s memory stays flat over a long run.

    python3 bench/exporter_memory.py [--bin target/dist/gpureap] [--minutes 65] [--crowd 5000]
                                     [--scrape 15s] [--interval 15s] [--out FILE]

On a simulated 8-GPU host (a directory, docs/simulated-driver.md) it starts a healthy
SGLang-like server (a launcher and 8 workers, each holding 70 GiB of its GPU), bench/crowd.py's
crowd of idle processes (5,000 by default) and `gpureap exporter --interval 15s --per-process`
(per-process series: the label set that could grow; --interval sets its scan interval), then scrapes GET /metrics every --scrape,
as Prometheus would. Every scrape it samples the exporter's resident memory (VmRSS) and CPU
time (utime + stime, /proc/PID/stat); at the end it prints the CPU share of one core, the
least-squares slope of resident memory (KiB per hour) over the whole run and over its second
half (after warm-up), one sample a minute, the scrape latencies (p50, p99, max) and the
exporter's own gpureap_scans_total. With --out FILE, each sample is also appended to
FILE.samples as it is taken (seconds, KiB, scrape ms, processes on the host), so that a run cut short still shows
its trend. Signals only what it started. docs/performance.md quotes it.
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from watch_idle import cpu_seconds, host_processes, rss_kib, seconds, slope  # noqa: E402
from simhost import option, simulated_host, start_server, stop  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GPUS = 8


BIN = str(Path(option("--bin", ROOT / "target/dist/gpureap")).resolve())
MINUTES = float(option("--minutes", "65"))
CROWD = int(option("--crowd", "5000"))
SCRAPE = option("--scrape", "15s")
INTERVAL = option("--interval", "15s")
OUT = option("--out", None)


def scrape(port):
    import http.client

    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/metrics")
    response = connection.getresponse()
    body = response.read().decode()
    connection.close()
    if response.status != 200:
        raise RuntimeError(f"scrape answered {response.status}")
    return time.perf_counter() - started, body


def metric(body, name):
    found = re.search(rf"^{name} (\S+)", body, re.M)
    return float(found.group(1)) if found else float("nan")


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def report(samples, latencies, wall, cpu, body):
    rss = [(t / 3600, kib) for t, kib in samples]
    second_half = rss[len(rss) // 2:]
    per_minute = {}
    for t, kib in samples:
        per_minute.setdefault(int(t // 60), kib)
    lines = [
        f"# exporter --interval {INTERVAL} --per-process: {CROWD:,} extra processes started, {host_processes():,} on the host, "
        f"scraped every {SCRAPE}, "
        f"{wall / 60:.1f} min",
        "",
        f"Machine: {os.cpu_count()} cores, {os.uname().release}; binary {BIN}; "
        f"MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', 'unset')}; "
        f"load average at the end {' / '.join(f'{v:.1f}' for v in os.getloadavg())} (1 / 5 / 15 min).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| CPU, share of one core over the run | {cpu / wall * 100:.2f}% ({cpu:.2f} s in {wall:.0f} s) |",
        f"| resident memory, first / last / max sample | {samples[0][1] / 1024:.1f} MiB / "
        f"{samples[-1][1] / 1024:.1f} MiB / {max(k for _, k in samples) / 1024:.1f} MiB |",
        f"| resident memory, least-squares slope | {slope(rss):+.1f} KiB per hour ({len(samples)} samples); "
        f"second half: {slope(second_half):+.1f} KiB per hour |",
        f"| resident memory, each minute (MiB) | {' '.join(f'{kib / 1024:.1f}' for kib in per_minute.values())} |",
        f"| scrapes: count, p50 / p99 / max | {len(latencies)}, {percentile(latencies, 0.5) * 1000:.2f} / "
        f"{percentile(latencies, 0.99) * 1000:.2f} / {max(latencies) * 1000:.1f} ms |",
        f"| exporter's scans (gpureap_scans_total), last scan | {metric(body, 'gpureap_scans_total'):.0f}, "
        f"{metric(body, 'gpureap_scan_duration_seconds') * 1000:.0f} ms |",
        f"| body of the last scrape | {len(body) / 1024:.1f} KiB |",
    ]
    return "\n".join(lines) + "\n"


def main():
    # SIGTERM unwinds as an exit does, so that what this run started is ended (finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    host, work = simulated_host("gpureap-exporter-mem-", GPUS), Path(tempfile.mkdtemp(prefix="gpureap-exporter-mem-work-"))
    server = start_server(host, work)
    ready = work / "crowd-ready"
    crowd = subprocess.Popen([sys.executable, str(ROOT / "bench/crowd.py"), str(CROWD), str(ready)])
    exporter = None
    try:
        while not all((work / f"ready{r}").exists() for r in range(GPUS)) or not ready.exists():
            if crowd.poll() is not None:
                raise SystemExit(f"bench/crowd.py could not start {CROWD} processes")
            time.sleep(0.05)
        exporter = subprocess.Popen([BIN, "--backend", f"sim:{host}", "exporter", "--listen", "127.0.0.1:0",
                                     "--interval", INTERVAL, "--per-process"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        found = re.search(r"127\.0\.0\.1:(\d+)", exporter.stderr.readline())
        if not found:
            raise SystemExit("the exporter ended at start")
        port = int(found.group(1))
        started, cpu0 = time.monotonic(), cpu_seconds(exporter.pid)
        samples, latencies, body = [], [], ""
        step, end = seconds(SCRAPE), started + MINUTES * 60
        while time.monotonic() < end:
            took, body = scrape(port)
            latencies.append(took)
            samples.append((time.monotonic() - started, rss_kib(exporter.pid)))
            if OUT:
                with open(f"{OUT}.samples", "a") as trace:
                    trace.write(f"{samples[-1][0]:.1f} {samples[-1][1]} {took * 1000:.2f} {host_processes()}\n")
            time.sleep(min(step, max(0.0, end - time.monotonic())))
        wall = time.monotonic() - started
        text = report(samples, latencies, wall, cpu_seconds(exporter.pid) - cpu0, body)
        print(text)
        if OUT:
            Path(OUT).write_text(text)
    finally:
        stop(exporter, crowd, server, host, work)


if __name__ == "__main__":
    main()
