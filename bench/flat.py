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

    python3 bench/flat.py --gpu BIN [OTHER_BIN] [--crowds 0,100,1000,5000,20000] [--out FILE]

On an NVIDIA host (the real driver): one CUDA holder of 4 GiB on GPU 0 titled as an SGLang
rank (scripts/cuda_holder.py under `exec -a sglang::scheduler_TP0`: the driver's list explains
the memory), then the same three commands (`plan` of vLLM serving Llama-3.1-8B's config of
tests/fixtures/models, at TP 1, against the live GPU) beside `nvidia-smi --query-compute-apps`, every
tool interleaved, RUNS times each at each crowd: median wall, CPU and peak RSS (through GNU
time), each command's growth over its no-crowd figure, and `status` over nvidia-smi's
time. OTHER_BIN (for example the build without the optional features) is measured beside BIN.
"""

import argparse
import statistics
import sys
import tempfile

sys.path.insert(0, __import__("os").path.dirname(__file__))
import compare  # noqa: E402
import crowd as crowds  # noqa: E402


def gpu(args):
    import os
    import signal
    import subprocess
    import time

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binaries = [("B", args.old)] + ([("OTHER", args.new)] if args.new else [])
    model = os.path.join(root, "tests/fixtures/models/llama-3.1-8b")
    commands = [
        ("status", ["status"]),
        ("status --json", ["status", "--json"]),
        ("plan", ["plan", "--model-config", model, "--", "vllm", "serve", "meta-llama/Llama-3.1-8B",
                  "--max-model-len", "8192"]),
    ]
    tools = [(f"{build} {name}", [binary, *argv]) for name, argv in commands for build, binary in binaries]
    tools.append(("nvidia-smi --query-compute-apps",
                  ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"]))

    def timed(argv):
        # Through GNU time, as bench/bench.py: wait4's ru_maxrss would count this Python
        # process's pages that the child had before its exec. Its ~1 ms is in every tool's wall.
        record = tempfile.mktemp(prefix="gpureap-flat-rss-")
        started = time.perf_counter()
        wrapper = ["/usr/bin/time", "-o", record, "-f", "%M"] if os.path.exists("/usr/bin/time") else []
        child = subprocess.Popen([*wrapper, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        peak = 0  # not measured without GNU time
        if wrapper:
            with open(record) as text:
                peak = int(text.read().split()[-1])
            os.unlink(record)
        return wall, usage.ru_utime + usage.ru_stime, peak, os.waitstatus_to_exitcode(status)

    ready = tempfile.mktemp(prefix="gpureap-flat-holder-")
    holder = subprocess.Popen(["bash", "-c", 'exec -a sglang::scheduler_TP0 "$@"', "holder", sys.executable,
                               os.path.join(root, "scripts/cuda_holder.py"), "hold", "4", ready],
                              start_new_session=True,
                              # `exec -a TITLE` hides where python3 lives: the child gets this
                              # one's sys.path, so that it finds PyTorch.
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    figures = {}
    try:
        while not os.path.exists(ready):
            if holder.poll() is not None:
                raise SystemExit("scripts/cuda_holder.py did not start")
            time.sleep(0.1)
        for count in args.counts:
            with crowds.running(count):
                for _, argv in tools:
                    timed(argv)  # warm-up
                runs = {name: [] for name, _ in tools}
                for _ in range(args.runs):
                    for name, argv in tools:
                        runs[name].append(timed(argv))
                for name, measured in runs.items():
                    figures[(name, count)] = (
                        statistics.median(run[0] for run in measured) * 1000,
                        statistics.median(run[1] for run in measured) * 1000,
                        statistics.median(run[2] for run in measured) / 1024,
                        sorted({run[3] for run in measured}))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        if os.path.exists(ready):
            os.unlink(ready)
    smi = "nvidia-smi --query-compute-apps"
    lines = ["| tool | extra processes | wall | CPU | peak RSS | growth (wall) | over nvidia-smi (wall) "
             "| exit codes |", "|---|---|---|---|---|---|---|---|"]
    for name, _ in tools:
        for count in args.counts:
            wall, cpu, rss, codes = figures[(name, count)]
            base = figures[(name, args.counts[0])][0]
            lines.append(
                f"| `{name}` | {count:,} | {wall:.1f} ms | {cpu:.1f} ms | {rss:.1f} MiB "
                f"| {wall / max(base, 1e-9):.2f}x | {wall / max(figures[(smi, count)][0], 1e-9):.2f}x | {codes} |")
    report = (f"{args.runs} interleaved runs per figure, medians; one CUDA holder of 4 GiB on GPU 0.\n\n"
              + "\n".join(lines) + "\n")
    print(report, end="")
    if args.out:
        with open(args.out, "w") as out:
            out.write(report)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("old")
    parser.add_argument("new", nargs="?")
    parser.add_argument("--crowds", default="0,5000,20000")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out")
    args = parser.parse_args()
    counts = [int(count) for count in args.crowds.split(",")]
    if args.gpu:
        args.counts = counts
        return gpu(args)
    if not args.new:
        parser.error("give OLD and NEW (or --gpu BIN)")
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
