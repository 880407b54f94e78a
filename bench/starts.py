#!/usr/bin/env python3
"""Where the fixed cost of `status` is on a GPU host: wall time (Python's clock, median of 11,
interleaved) of a bare process start, `gpureap --version` (start-up and exit alone), `status`
without a driver, `status` with NVML, the same for another build, nvidia-smi's query of the compute processes,
plain nvidia-smi, and nvidia-smi's query of the health figures `status` shows.

    python3 bench/starts.py GPUREAP OTHER_GPUREAP
"""
import subprocess, sys, time, statistics
b, old = sys.argv[1], sys.argv[2]
cases = [("true", ["/bin/true"]), ("gpureap --version", [b, "--version"]), ("old --version", [old, "--version"]),
         ("gpureap --backend none status --json", [b, "--backend", "none", "status", "--json"]),
         ("gpureap status --json", [b, "status", "--json"]), ("old status --json", [old, "status", "--json"]),
         ("nvidia-smi --query-compute-apps", ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"]),
         ("nvidia-smi (plain)", ["nvidia-smi"]),
         ("nvidia-smi --query-gpu (health)", ["nvidia-smi", "--query-gpu=index,memory.used,ecc.errors.uncorrected.volatile.total,"
                                              "ecc.errors.uncorrected.aggregate.total,retired_pages.pending,"
                                              "remapped_rows.pending,remapped_rows.failure", "--format=csv"])]
times = {name: [] for name, _ in cases}
for _ in range(11):
    for name, argv in cases:
        t = time.perf_counter(); subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); times[name].append((time.perf_counter() - t) * 1e3)
for name, _ in cases:
    v = sorted(times[name]); print(f"{name}: median {statistics.median(v):.1f} ms (min {v[0]:.1f}, max {v[-1]:.1f})")
