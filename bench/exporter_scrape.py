#!/usr/bin/env python3
"""What `gpureap exporter` costs left running: scrape latency (p50, p99) and
CPU per second of wall time, with a crowd of processes on the host.

    python3 bench/exporter_scrape.py --bin OLD --bin NEW [--procs 5000]
                                     [--seconds 120] [--interval 15s] [--every 1]

Tops the host up to --procs processes with bench/crowd.py (at least half its
own), stages a simulated 8-GPU host, starts one exporter per --bin on it
(all at once: the same crowd and load, so their ratio is fair), scrapes each
every --every seconds for --seconds, and prints each one's scrape latency
and its utime+stime share of one core, with the ratios to the first.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from top_refresh import cpu_seconds, processes, sim_host  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", action="append", required=True)
    parser.add_argument("--procs", type=int, default=5000)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--interval", default="15s")
    parser.add_argument("--every", type=float, default=1.0)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="gpureap-exporter-bench-")
    sim = os.path.join(work, "sim")
    os.mkdir(sim)
    sim_host(sim)
    crowd = None
    missing = max(args.procs - processes(), args.procs // 2)
    if missing > 0:
        ready = os.path.join(work, "crowd-ready")
        crowd = subprocess.Popen([sys.executable, os.path.join(HERE, "crowd.py"), str(missing), ready])
        while not os.path.exists(ready):
            time.sleep(0.1)
    exporters = []
    try:
        for n, binary in enumerate(os.path.abspath(b) for b in args.bin):
            err = open(os.path.join(work, f"stderr{n}"), "w+")
            child = subprocess.Popen([binary, "--backend", f"sim:{sim}", "exporter", "--listen",
                                      "127.0.0.1:0", "--interval", args.interval],
                                     stderr=err, stdout=subprocess.DEVNULL)
            exporters.append((binary, child, err))
        urls = []
        for binary, child, err in exporters:
            while True:
                err.seek(0)
                found = re.search(r"serving (http://\S+/metrics)", err.read())
                if found:
                    urls.append(found.group(1))
                    break
                time.sleep(0.1)
        start = time.monotonic()
        cpu = [cpu_seconds(child.pid) for _, child, _ in exporters]
        latencies = [[] for _ in exporters]
        fewest = processes()
        while time.monotonic() - start < args.seconds:
            for n, url in enumerate(urls):
                began = time.monotonic()
                urllib.request.urlopen(url, timeout=30).read()
                latencies[n].append(time.monotonic() - began)
            fewest = min(fewest, processes())
            time.sleep(args.every)
        wall = time.monotonic() - start
        used = [cpu_seconds(child.pid) - c for (_, child, _), c in zip(exporters, cpu)]
        print(f"processes on the host: at least {fewest}; interval {args.interval}; "
              f"a scrape every {args.every}s; {wall:.0f} s of wall time")
        for n, (binary, _, _) in enumerate(exporters):
            got = sorted(latencies[n])
            p = lambda q: got[min(len(got) - 1, int(q * len(got)))] * 1000
            print(f"{binary}: {len(got)} scrapes, p50 {p(0.5):.1f} ms, p99 {p(0.99):.1f} ms; "
                  f"CPU {used[n]:.2f} s = {100 * used[n] / wall:.2f}% of one core")
        if len(exporters) > 1 and used[0] > 0:
            print("CPU ratios to the first: " + ", ".join(f"{u / used[0]:.2f}" for u in used))
    finally:
        for _, child, _ in exporters:
            child.send_signal(signal.SIGTERM)
            child.wait()
        if crowd is not None:
            crowd.send_signal(signal.SIGTERM)
            crowd.wait()


if __name__ == "__main__":
    main()
