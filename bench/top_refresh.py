#!/usr/bin/env python3
"""What `gpureap top` costs while it refreshes: CPU per second of wall time,
and its resident memory over time, with a crowd of processes on the host.

    python3 bench/top_refresh.py [--bin target/dist/gpureap] [--procs 5000]
                                 [--seconds 60] [--interval 1s]
    python3 bench/top_refresh.py --bin /tmp/gpureap-old --bin target/dist/gpureap

With --bin twice or more, every build runs at once (the same crowd and load),
and the CPU ratios to the first are printed.

Tops the host up to --procs processes with bench/crowd.py (at least half of
them its own, as others' processes come and go; the crowd is ended on exit), stages a
simulated 8-GPU host (an empty DIR: the `gpus` file, nodes, `claims/`),
opens `gpureap --backend sim:DIR top --readonly --interval I` in a tmux pane
of its own (80x24), waits for its first frame, then samples the process's
utime+stime and VmRSS from /proc every 5 s for --seconds. Prints the CPU
share (CPU seconds / wall seconds, of one core) and the RSS samples; the
figures go to docs/performance.md ("top").
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TICKS = os.sysconf("SC_CLK_TCK")


def processes():
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def sim_host(directory, gpus=8, total=80 << 30):
    with open(os.path.join(directory, "gpus"), "w") as out:
        for index in range(gpus):
            out.write(f"{total} Simulated H200\n")
            open(os.path.join(directory, f"nvidia{index}"), "w").close()
    open(os.path.join(directory, "nvidiactl"), "w").close()
    os.mkdir(os.path.join(directory, "claims"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", action="append",
                        help="a gpureap binary; give it twice (old, new) to run both side by side")
    parser.add_argument("--procs", type=int, default=5000)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--interval", default="1s")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="gpureap-top-bench-")
    sim = os.path.join(work, "sim")
    os.mkdir(sim)
    sim_host(sim)
    crowd = None
    missing = args.procs - processes()
    # Others' processes come and go: a crowd of at least half is always started.
    missing = max(missing, args.procs // 2)
    if missing > 0:
        ready = os.path.join(work, "crowd-ready")
        crowd = subprocess.Popen([sys.executable, os.path.join(HERE, "crowd.py"), str(missing), ready])
        while not os.path.exists(ready):
            time.sleep(0.1)
    bins = args.bin or ["target/dist/gpureap"]
    views = []
    try:
        # Every build at once, each in a tmux server of its own: the same
        # crowd and the same load for all, so their ratio is fair.
        for n, binary in enumerate(os.path.abspath(b) for b in bins):
            socket = f"gpureap-top-bench-{os.getpid()}-{n}"
            tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
            pid_file = os.path.join(work, f"pid{n}")
            command = f"echo $$ > {pid_file}; exec {binary} --backend sim:{sim} top --readonly --interval {args.interval}"
            subprocess.run(tmux + ["new-session", "-d", "-x", "80", "-y", "24", "sh", "-c", command], check=True)
            views.append((binary, tmux, pid_file))
        pids = []
        for binary, tmux, pid_file in views:
            while "gpureap top · data" not in subprocess.run(
                tmux + ["capture-pane", "-p", "-t", "0"], capture_output=True, text=True
            ).stdout:
                time.sleep(0.1)
            pids.append(int(open(pid_file).read()))
        start = time.monotonic()
        start_cpu = [cpu_seconds(pid) for pid in pids]
        samples = [[] for _ in pids]
        fewest = processes()
        while time.monotonic() - start < args.seconds:
            time.sleep(5)
            for n, pid in enumerate(pids):
                samples[n].append((round(time.monotonic() - start), rss_kib(pid)))
            fewest = min(fewest, processes())
        wall = time.monotonic() - start
        print(f"processes on the host: at least {fewest} throughout; interval {args.interval}; {wall:.0f} s of wall time")
        used = [cpu_seconds(pid) - cpu for pid, cpu in zip(pids, start_cpu)]
        for n, (binary, _, _) in enumerate(views):
            print(f"{binary}: CPU {used[n]:.2f} s = {100 * used[n] / wall:.1f}% of one core")
            print("  RSS (s, MiB): " + ", ".join(f"{t}:{kib / 1024:.1f}" for t, kib in samples[n]))
        if len(views) > 1 and used[0] > 0:
            print("CPU ratios to the first: " + ", ".join(f"{u / used[0]:.2f}" for u in used))
    finally:
        for _, tmux, _ in views:
            subprocess.run(tmux + ["kill-server"], capture_output=True)
        # A build older than the fix of top's exit (c370437) outlives its
        # terminal: end each view by the PID it wrote, once its pane is gone.
        for _, _, pid_file in views:
            try:
                pid = int(open(pid_file).read())
                deadline = time.monotonic() + 5
                while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                    time.sleep(0.1)
                # Still ours: the same program, running `top` on this run's host.
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    if f"sim:{sim}".encode() in cmdline.read():
                        os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass
        if crowd is not None:
            crowd.send_signal(signal.SIGTERM)
            crowd.wait()

if __name__ == "__main__":
    main()
