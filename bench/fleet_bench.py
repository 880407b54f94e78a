"""Part 4 of bench/bench.py: `status -H` over 8 real sshd hosts (network
namespaces on this machine, bench/sshd_lab.py), against the floor (8 plain
`ssh hN gpureap status --json` started in parallel by a shell) and against
the sequential loop users write today. Needs root and openssh-server;
skipped, and said so, without them.
"""

import os
import shutil
import statistics
import subprocess
import time

HOSTS = 8


def run(say, binary, quick):
    say("## Fleet: `status -H` over 8 sshd hosts\n")
    if os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd") or not shutil.which("ip"):
        say("Not measured: needs root, openssh-server and iproute2 (network namespaces).\n")
        return
    from sshd_lab import Lab

    lab = Lab(HOSTS)
    try:
        for index, (name, _, _) in enumerate(lab.hosts):
            lab.hold(name, f"sglang::scheduler_TP{index % 2}", index % 2, 30 << 30)
        ssh = f"ssh -F {lab.config}"
        names = " ".join(name for name, _, _ in lab.hosts)
        remote = f"{binary} status --json"
        commands = {
            "gpureap status -H h[1-8]": [binary, "status", "-H", f"h[1-{HOSTS}]", "--ssh", ssh,
                                         "--remote-bin", binary],
            "floor: 8 × ssh in parallel (shell &, wait)": [
                "bash", "-c", f"for h in {names}; do {ssh} $h {remote} >/dev/null & done; wait"],
            "sequential: for h in …; do ssh $h …; done": [
                "bash", "-c", f"for h in {names}; do {ssh} $h {remote} >/dev/null; done"],
        }
        # Warm up: the first connections pay for page-cache misses.
        for command in commands.values():
            subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        repeat = 5 if quick else 15
        times = {name: [] for name in commands}
        # Interleaved, so that a slow moment of the machine hits all alike.
        for _ in range(repeat):
            for name, command in commands.items():
                started = time.perf_counter()
                result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                elapsed = time.perf_counter() - started
                if result.returncode != 0:
                    raise SystemExit(f"{name} failed ({result.returncode}): {result.stderr.decode()}")
                times[name].append(elapsed)
        floor = statistics.median(times["floor: 8 × ssh in parallel (shell &, wait)"])
        say(f"Median of {repeat} interleaved runs; each host holds one 30 GiB worker. "
            "Target: gpureap within 1.25× of the parallel floor.\n")
        say("| command | median | vs floor |")
        say("|---|---|---|")
        for name, values in times.items():
            median = statistics.median(values)
            say(f"| {name} | {median * 1000:.0f} ms | {median / floor:.2f}× |")
        say()
    finally:
        lab.close()
