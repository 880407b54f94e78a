#!/usr/bin/env python3
"""Whether a look costs the same on a busy host as on an idle one (issue 45's flat cost).

    python3 bench/flat.py OLD_BIN NEW_BIN [--crowds 0,5000,20000] [--runs 7] [--out FILE]

On bench/compare.py's simulated 8-GPU host (eight SGLang-like TP workers, 40 GiB each, every
byte explained by the driver's lists), with each number of extra idle processes in turn
(bench/crowd.py), it runs `status`, `status --json` and `plan` (Kimi-K2.5 TP8 on the staged
host), OLD and NEW alternately, RUNS times each. Prints per command and crowd the median wall
and CPU time (user + system, from wait4) of each build, and each build's growth: its median
at that crowd over its median with no extra processes (the target: at most 1.2). CPU time is
the figure to read on a loaded machine: it counts what the command did, not what it waited for.
Signals only the processes it started.
"""

import argparse
import statistics
import sys
import tempfile

sys.path.insert(0, __import__("os").path.dirname(__file__))
import compare  # noqa: E402
import crowd as crowds  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--crowds", default="0,5000,20000")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out")
    args = parser.parse_args()
    counts = [int(count) for count in args.crowds.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        workers = compare.stage(directory)
        sim = ["--backend", f"sim:{directory}"]
        commands = [
            ("status", ["status"]),
            ("status --json", ["status", "--json"]),
            ("plan", ["plan", "--weights", "72.8GiB", *compare.SGLANG]),
        ]
        figures = {}
        try:
            for count in counts:
                with crowds.running(count):
                    for name, argv in commands:
                        for build, binary in (("OLD", args.old), ("NEW", args.new)):
                            compare.timed([binary, *sim, *argv])  # warm-up
                        runs = {"OLD": [], "NEW": []}
                        for _ in range(args.runs):
                            for build, binary in (("OLD", args.old), ("NEW", args.new)):
                                runs[build].append(compare.timed([binary, *sim, *argv]))
                        for build, measured in runs.items():
                            figures[(name, count, build)] = (
                                statistics.median(run[0] for run in measured) * 1000,
                                statistics.median(run[1] for run in measured) * 1000,
                                sorted({run[2] for run in measured}))
        finally:
            for worker in workers:
                worker.kill()
                worker.wait()
    lines = ["| command | extra processes | OLD wall | OLD CPU | NEW wall | NEW CPU "
             "| OLD growth (CPU) | NEW growth (CPU) | exit codes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, _ in commands:
        for count in counts:
            old, new = figures[(name, count, "OLD")], figures[(name, count, "NEW")]
            base_old, base_new = figures[(name, counts[0], "OLD")], figures[(name, counts[0], "NEW")]
            lines.append(
                f"| `{name}` | {count:,} | {old[0]:.1f} ms | {old[1]:.1f} ms | {new[0]:.1f} ms "
                f"| {new[1]:.1f} ms | {old[1] / max(base_old[1], 1e-9):.2f}x "
                f"| {new[1] / max(base_new[1], 1e-9):.2f}x | {old[2]} / {new[2]} |")
    report = "\n".join(lines) + "\n"
    print(report, end="")
    if args.out:
        with open(args.out, "w") as out:
            out.write(report)


if __name__ == "__main__":
    main()
