#!/usr/bin/env python3
"""Where `gpureap wait`'s last milliseconds go on the simulated driver, two builds side by side.

    python3 bench/wait_exit.py NEW OLD [--runs 30] [--crowd 0]

Eight SGLang-like workers hold one GPU each (bench.py's waiting part, without its launcher);
`wait --gpu 0` waits on them; all eight are SIGKILLed; each run gives the time from the kill to
the wait's exit, and, from gpureap's own trace (GPUREAP_LOG=debug), the part of it between the
release being read and the command being done: the simulated driver's inotify instance closing
as the command returns (the kernel's fsnotify teardown). Runs alternate between the builds.
Signals only what it started.
"""

import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import crowd  # noqa: E402  bench/crowd.py
from simhost import simulated_host, sleeping  # noqa: E402  bench/simhost.py

GIB = 1 << 30


def seconds_at(trace, text):
    for line in trace.splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        match = re.match(r"\s*([\d.]+)s", line)
        if match and text in line:
            return float(match.group(1))
    return None


def one(binary, host):
    holders = [subprocess.Popen(["bash", "-c", f'D={host}; exec 3<$D/nvidia{k} 9<$D/nvidiactl; '
                                 f'echo {70 * GIB} > $D/claims/$BASHPID.{k}; exec -a sglang::exit_TP{k} sleep 100000'])
               for k in range(8)]
    try:
        deadline = time.time() + 10
        while len(list((host / "claims").iterdir())) < 8 and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        waiter = subprocess.Popen([binary, "--backend", f"sim:{host}", "wait", "--gpu", "0", "--below", "1GiB",
                                   "--timeout", "60s"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env=dict(os.environ, GPUREAP_LOG="debug"))
        while not sleeping(waiter.pid) and waiter.poll() is None:
            time.sleep(0.02)
        time.sleep(0.3)
        killed = time.perf_counter()
        for holder in holders:
            holder.send_signal(signal.SIGKILL)
        _, trace = waiter.communicate(timeout=60)
        lag = time.perf_counter() - killed
        read = seconds_at(trace, "read without a scan") or seconds_at(trace, "a scan is needed")
        done = seconds_at(trace, "command done")
        return lag * 1e3, (done - read) * 1e3 if read is not None and done is not None else None
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
        for claim in (host / "claims").iterdir():
            claim.unlink()


def main():
    args = sys.argv[1:]
    if len(args) < 2 or args[0].startswith("-") or args[1].startswith("-"):
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
    builds = [str(Path(binary).resolve()) for binary in args[:2]]
    for binary in builds:
        if not os.access(binary, os.X_OK) or not Path(binary).is_file():
            print(f"wait_exit.py: {binary} is not an executable file", file=sys.stderr)
            raise SystemExit(2)

    def count(flag, default, least):
        if flag not in args:
            return default
        at = args.index(flag) + 1
        if at >= len(args) or not args[at].isdigit() or int(args[at]) < least:
            print(f"wait_exit.py: {flag} takes a whole number, at least {least}", file=sys.stderr)
            raise SystemExit(2)
        return int(args[at])

    runs = count("--runs", 30, 1)
    crowd_size = count("--crowd", 0, 0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    host = simulated_host("gpureap-wait-exit-")
    try:
        results = {binary: [] for binary in builds}
        with crowd.running(crowd_size):
            for _ in range(runs):
                for binary in builds:
                    results[binary].append(one(binary, host))
    finally:
        shutil.rmtree(host, ignore_errors=True)
    print(f"{runs} runs each, {crowd_size:,} extra processes; milliseconds.\n")
    print("| build | kill to exit: median (max) | release read to command done: median | runs with that under 1 ms |")
    print("|---|---|---|---|")
    for binary, values in results.items():
        lags = [lag for lag, _ in values]
        gaps = [gap for _, gap in values if gap is not None]
        version = subprocess.run([binary, "--version"], stdout=subprocess.PIPE, text=True).stdout.split()[2]
        print(f"| {version.strip('(')} | {statistics.median(lags):.1f} ({max(lags):.1f}) | "
              f"{statistics.median(gaps):.1f} | {sum(gap < 1 for gap in gaps)} of {len(gaps)} |")
    print("\nEach run's release-to-done gap, sorted:\n")
    for binary, values in results.items():
        print(f"- {Path(binary).name}: {sorted(round(gap, 1) for _, gap in values if gap is not None)}")


if __name__ == "__main__":
    main()
