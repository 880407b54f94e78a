#!/usr/bin/env python3
"""Issue 28 on an NVIDIA host: bench/bench.py's seeing (100 to 20,000 extra
processes), waiting (5,000) and idle parts with the real driver, the growth
plots, and PASS/FAIL lines for the waiting targets.

    python3 scripts/gpu_growth.py GPUREAP --out DIR [--compare OLD_GPUREAP] [--crowds 100,1000,5000,20000]

Writes DIR/h200-growth.md (the report) and the plots beside it
(growth-time-h200.svg, growth-cpu-h200.svg, growth-memory-h200.svg). With
--compare, the waiting and idle parts run both builds side by side. PASS/FAIL:
`wait` at most 100 ms after the driver's release (median, this build), and
under 5% of a core over a 30 s wait on a held GPU. The benchmark signals only
what it started (its own trees and crowds) and removes them on every path;
exits 1 when a target is missed, 2 when the benchmark itself failed.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv):
    if not argv or argv[0].startswith("-") or "--out" not in argv:
        print(__doc__)
        return 2
    binary = argv[0]
    out = Path(argv[argv.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    report = out / "h200-growth.md"
    command = [sys.executable, str(ROOT / "bench/bench.py"), "--gpu", "--bin", binary,
               "--parts", "seeing,waiting,idle", "--out", str(report),
               "--crowds", argv[argv.index("--crowds") + 1] if "--crowds" in argv else "100,1000,5000,20000"]
    if "--compare" in argv:
        command += ["--compare", argv[argv.index("--compare") + 1]]
    print("running:", " ".join(command), flush=True)
    if subprocess.run(command).returncode != 0 or not report.exists():
        print("FAIL bench/bench.py did not complete")
        return 2
    text = report.read_text()
    failed = False
    lag = re.search(r"^\| this build \| ([\d.]+) ms \|", text, re.M)
    if lag:
        ok = float(lag.group(1)) <= 100
        failed |= not ok
        print(f"{'PASS' if ok else 'FAIL'} wait returns {lag.group(1)} ms after the release (target 100 ms)")
    else:
        failed = True
        print("FAIL no waiting figure in the report")
    share = re.search(r"^\| `gpureap wait --gpu 0 \(below 1 MiB\)(?: \[this build\])?` \| ([\d.]+)% \|", text, re.M)
    if share:
        ok = float(share.group(1)) < 5
        failed |= not ok
        print(f"{'PASS' if ok else 'FAIL'} wait uses {share.group(1)}% of a core on a held GPU (target under 5%)")
    else:
        failed = True
        print("FAIL no idle figure in the report")
    print(f"report: {report}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
