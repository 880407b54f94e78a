#!/usr/bin/env python3
"""Two builds of gpureap side by side in one run, and `plan`'s answer time.

    python3 bench/compare.py OLD_BIN NEW_BIN [--crowd 5000] [--runs 10] [--out FILE] [--containers]

On a simulated 8-GPU host (a temporary directory, eight SGLang-like TP workers holding 40 GiB
each) with CROWD extra idle processes (bench/crowd.py), it times, alternating OLD and NEW run by
run so that both see the same machine:

- `status --json`, `check`, `free --match … --dry-run` on the staged host;
- a whole free: stage an orphaned 8-worker tree on a fresh simulated host, then `free --match
  sglang::scheduler --yes` (staging included, the same for both);
- `plan` for Kimi-K2.5 TP8 (tests/fixtures/models/kimi-k2.5) on a hypothetical box
  (`--gpu-memory`, no GPU read: what `plan` costs on a machine without a GPU) and on the staged
  host (a snapshot as `check` takes it).

With --containers, the eight workers are first moved into cgroups laid out as the kubelet and
containerd lay them out (`kubepods.slice/…/kubepods-burstable-pod<uid>.slice/
cri-containerd-<id>.scope`, under a root of this run's own on the cgroup v2 mount, removed at the
end): what attributing each holder to its container and pod costs `status`.

Each figure is the median of RUNS wall times (and CPU, from wait4), and the ratio NEW/OLD is taken
pair by pair (its median quoted). Prints a markdown table; with --out, writes it there too.
Signals only the processes it started.
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KIMI = os.path.join(ROOT, "tests/fixtures/models/kimi-k2.5")
SGLANG = ["--", "python3", "-m", "sglang.launch_server", "--model-path", KIMI, "--tp", "8",
          "--mem-fraction-static", "0.85"]


def stage(directory):
    """Eight TP workers, CUDA-like: every node open, 40 GiB on their own GPU."""
    os.makedirs(os.path.join(directory, "claims"), exist_ok=True)
    for name in [f"nvidia{i}" for i in range(8)] + ["nvidiactl"]:
        open(os.path.join(directory, name), "w").close()
    workers = []
    for rank in range(8):
        script = "".join(
            f"echo {40 << 30 if gpu == rank else 'none'} > claims/$BASHPID.{gpu}; "
            for gpu in range(8))
        nodes = " ".join(f"{fd}<nvidia{gpu}" for fd, gpu in zip([3, 4, 5, 6, 7, 8, 10, 12],
                                                                 range(8)))
        workers.append(subprocess.Popen(
            ["bash", "-c", f"{script} exec {nodes} 9<nvidiactl; "
                           f"exec -a sglang::scheduler_TP{rank} sleep 3000"],
            cwd=directory))
    for worker in workers:
        path = f"/proc/{worker.pid}/cmdline"
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if open(path, "rb").read().startswith(b"sglang::"):
                    break
            except OSError:
                break
            time.sleep(0.005)
    return workers


def cgroup2_mount():
    for line in open("/proc/self/mountinfo"):
        left, _, right = line.partition(" - ")
        if right.split()[0] == "cgroup2":
            return left.split()[4]
    sys.exit("--containers needs a cgroup v2 mount")


def into_containers(workers):
    """Moves each worker into a kubepods/containerd cgroup of its own; returns the cgroups made,
    deepest first, and where to move the workers back."""
    mount = cgroup2_mount()
    own = next(line[3:].strip() for line in open("/proc/self/cgroup") if line.startswith("0::"))
    root = os.path.join(mount, f"gpureap-compare-{os.getpid()}")
    made = [root]
    os.mkdir(root)
    for rank, worker in enumerate(workers):
        uid = f"8c1f2a3b_4d5e_6f70_8192_a3b4c5d6e7f{rank}"
        path = root
        for component in ["kubepods.slice", "kubepods-burstable.slice",
                          f"kubepods-burstable-pod{uid}.slice",
                          f"cri-containerd-{rank:x}{'0' * 63}.scope"]:
            path = os.path.join(path, component)
            if not os.path.isdir(path):
                os.mkdir(path)
                made.append(path)
        with open(os.path.join(path, "cgroup.procs"), "w") as procs:
            procs.write(str(worker.pid))
    return list(reversed(made)), os.path.join(mount, own.lstrip("/"))


def out_of_containers(made, home):
    for path in made:
        for pid in open(os.path.join(path, "cgroup.procs")).read().split():
            with open(os.path.join(home, "cgroup.procs"), "w") as procs:
                procs.write(pid)
        os.rmdir(path)


def timed(argv):
    started = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime, os.waitstatus_to_exitcode(status)


def whole_free(binary):
    """Stage an orphaned tree on a fresh host, free it; the time of both."""
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        workers = stage(directory)
        wall, cpu, code = timed([binary, "--backend", f"sim:{directory}", "free", "--match",
                                 "sglang::scheduler", "--yes"])
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait()
        return time.perf_counter() - started, cpu, code


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--crowd", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out")
    parser.add_argument("--containers", action="store_true")
    args = parser.parse_args()
    crowd = None
    host = tempfile.mkdtemp(prefix="gpureap-compare-")
    workers = stage(host)
    cgroups = None
    try:
        if args.containers:
            cgroups = into_containers(workers)
        if args.crowd:
            ready = os.path.join(host, "crowd.ready")
            crowd = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench/crowd.py"),
                                      str(args.crowd), ready])
            while not os.path.exists(ready):
                time.sleep(0.1)
        sim = ["--backend", f"sim:{host}"]
        cases = [
            ("status --json", lambda b: timed([b, *sim, "status", "--json"])),
            ("check", lambda b: timed([b, *sim, "check"])),
            ("free --dry-run", lambda b: timed([b, *sim, "free", "--match", "sglang", "--dry-run"])),
            ("stage + free (8 workers)", whole_free),
        ]
        plan_cases = [
            ("plan, hypothetical box", lambda b: timed(
                [b, "plan", "--gpu-memory", "97871MiB", "--weights", "72.8GiB", *SGLANG])),
            ("plan, staged host", lambda b: timed([b, *sim, "plan", "--weights", "72.8GiB", *SGLANG])),
        ]
        rows = []
        for name, run in cases:
            old, new = [], []
            for _ in range(args.runs):
                old.append(run(args.old))
                new.append(run(args.new))
            ratio = statistics.median(n[0] / o[0] for o, n in zip(old, new))
            cpu_ratio = statistics.median(n[1] / o[1] for o, n in zip(old, new) if o[1] > 0)
            rows.append(f"| {name} | {statistics.median(o[0] for o in old) * 1000:.0f} ms | "
                        f"{statistics.median(n[0] for n in new) * 1000:.0f} ms | {ratio:.2f} | "
                        f"{cpu_ratio:.2f} | {sorted({o[2] for o in old} | {n[2] for n in new})} |")
        plan_rows = []
        for name, run in plan_cases:
            new = [run(args.new) for _ in range(args.runs)]
            plan_rows.append(f"| {name} | {statistics.median(n[0] for n in new) * 1000:.1f} ms | "
                             f"{max(n[0] for n in new) * 1000:.1f} ms | {sorted({n[2] for n in new})} |")
    finally:
        if crowd is not None:
            crowd.send_signal(signal.SIGTERM)
            crowd.wait()
        if cgroups is not None:
            out_of_containers(*cgroups)
        for worker in workers:
            worker.kill()
            worker.wait()
        subprocess.run(["rm", "-rf", host], check=False)
    report = "\n".join([
        f"{args.crowd} extra processes, {args.runs} runs each, OLD and NEW alternating"
        f"{', the workers in kubepods/containerd cgroups' if args.containers else ''}.",
        "",
        "| command | OLD median | NEW median | NEW/OLD wall (median of pairs) | NEW/OLD CPU | exit codes |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "| `plan` (NEW) | median | max | exit codes |",
        "|---|---|---|---|",
        *plan_rows,
    ])
    print(report)
    if args.out:
        with open(args.out, "w") as out:
            out.write(report + "\n")


if __name__ == "__main__":
    main()
