"""Part 4 of bench/bench.py: `status -H` over 8 real sshd hosts (network
namespaces on this machine, bench/sshd_lab.py), against the floor (8 plain
`ssh hN gpureap status --json` started in parallel by a shell) and against
the sequential loop users write today. Needs root and openssh-server;
skipped, and said so, without them.
"""

import os
import tempfile
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


def measured_latency(repeat=10):
    """Median wall time of `ssh HOST true` to a real sshd host of the lab
    (connection, key exchange, session, exit), seconds; None without root or sshd."""
    if os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd") or not shutil.which("ip"):
        return None
    from sshd_lab import Lab

    lab = Lab(1)
    try:
        command = ["ssh", "-F", lab.config, "-o", "BatchMode=yes", "-T", "h1", "true"]
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL)
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            subprocess.run(command, check=True, stdin=subprocess.DEVNULL)
            times.append(time.perf_counter() - started)
        return statistics.median(times)
    finally:
        lab.close()


class SimHost:
    """One simulated 2-GPU host directory with one 30 GiB holder, shared by every stand-in host."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="gpureap-fleet-scale-")
        os.makedirs(f"{self.dir}/claims")
        for g in range(2):
            open(f"{self.dir}/nvidia{g}", "w").close()
        open(f"{self.dir}/nvidiactl", "w").close()
        with open(f"{self.dir}/gpus", "w") as f:
            f.write("".join(f"{80 << 30} NVIDIA H100 80GB HBM3\n" for _ in range(2)))
        ready = f"{self.dir}/ready"
        script = (f'exec 3<"{self.dir}/nvidia0" 4<"{self.dir}/nvidia1" 9<"{self.dir}/nvidiactl"; '
                  f'echo none > "{self.dir}/claims/$BASHPID.1"; echo {30 << 30} > "{self.dir}/claims/$BASHPID.0"; '
                  f'touch {ready}; exec -a sglang::scheduler_TP0 sleep 100000')
        self.holder = subprocess.Popen(["bash", "-c", script])
        while not os.path.exists(ready):
            time.sleep(0.01)

    def close(self):
        self.holder.kill()
        self.holder.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def gnu_time(command):
    """(wall seconds, peak RSS KiB, CPU seconds user + system) of one run, through GNU time."""
    record = tempfile.mktemp(prefix="gpureap-fleet-time-")
    started = time.perf_counter()
    result = subprocess.run(["/usr/bin/time", "-o", record, "-f", "%M %U %S", *command],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - started
    fields = open(record).read().split()[-3:]
    os.unlink(record)
    if result.returncode not in (0, 1):
        raise SystemExit(f"{command[:3]} failed ({result.returncode}): {result.stderr.decode()[-500:]}")
    return wall, int(fields[0]), float(fields[1]) + float(fields[2])


def run_scale(say, binary, quick, counts=(8, 64, 256), latency=None):
    """`status -H` over 8 to 256 stand-in hosts (bench/lagged_ssh.sh: ssh to this
    machine plus a fixed latency, measured on a real sshd host of the lab), against
    the parallel floor. Returns {hosts: {name: (median wall s, peak RSS KiB)}} for the plots."""
    counts = [n for n in counts if not quick or n <= 64]
    measured = latency if latency is not None else measured_latency(5 if quick else 10)
    if measured is None:
        measured, source = 0.25, "not measured here (needs root and openssh-server): 0.25 s assumed"
    else:
        source = "measured: median of `ssh -F LAB h1 true` to a real sshd host of bench/sshd_lab.py, this machine"
    say(f"## Fleet at scale: `status -H` over {', '.join(map(str, counts))} hosts\n")
    say(f"Each host is a stand-in (`bench/lagged_ssh.sh {measured:.3f}`): ssh's options and the host name are dropped, "
        f"the connection's latency is slept ({measured * 1000:.0f} ms, {source}), and the remote "
        "`gpureap --backend sim:DIR status --json` runs on this machine against one simulated 2-GPU host with a "
        "30 GiB holder. The floors run the same stand-in commands from a shell: all at once (`&`, `wait`: "
        "the slowest host's time when every host runs concurrently), and at most 32 at once (`xargs -P 32`, "
        "the floor for gpureap's default `--parallel 32`). Peak RSS and CPU (user + system, children included) "
        "from GNU time.\n")
    ssh = f"{os.path.dirname(os.path.abspath(__file__))}/lagged_ssh.sh {measured:.3f}"
    host = SimHost()
    results = {}
    try:
        remote = f"{binary} --backend sim:{host.dir} status --json"
        say("| hosts | command | median | vs all-at-once floor | vs 32-at-once floor | peak RSS | CPU |")
        say("|---|---|---|---|---|---|---|")
        for count in counts:
            names = " ".join(f"h{i}" for i in range(1, count + 1))
            commands = {
                f"gpureap status -H h[1-{count}] (--parallel 32, the default)":
                    [binary, "--backend", f"sim:{host.dir}", "status", "-H", f"h[1-{count}]", "--ssh", ssh,
                     "--remote-bin", binary, "--json"],
                "floor: all at once (shell &, wait)":
                    ["bash", "-c", f"for h in {names}; do {ssh} $h {remote} >/dev/null & done; wait"],
                "floor: 32 at once (xargs -P 32)":
                    ["bash", "-c", f"printf '%s\\n' {names} | xargs -P 32 -I@ {ssh} @ {remote} >/dev/null"],
            }
            if count > 32:
                commands[f"gpureap status -H h[1-{count}] --parallel {count}"] = [
                    *commands[f"gpureap status -H h[1-{count}] (--parallel 32, the default)"],
                    "--parallel", str(count)]
            for command in commands.values():
                gnu_time(command)
            repeat = 3 if quick or count >= 256 else 5
            runs = {name: [] for name in commands}
            for _ in range(repeat):
                for name, command in commands.items():
                    runs[name].append(gnu_time(command))
            med = {name: (statistics.median(r[0] for r in values), max(r[1] for r in values),
                          statistics.median(r[2] for r in values)) for name, values in runs.items()}
            floor_all = med["floor: all at once (shell &, wait)"][0]
            floor_32 = med["floor: 32 at once (xargs -P 32)"][0]
            for name, (wall, rss, cpu) in med.items():
                say(f"| {count} | {name} | {wall * 1000:.0f} ms | {wall / floor_all:.2f}× | {wall / floor_32:.2f}× | "
                    f"{rss / 1024:.1f} MiB | {cpu:.2f} s |")
            results[count] = med
        say()
        gp = [(n, results[n][f"gpureap status -H h[1-{n}] (--parallel 32, the default)"][1]) for n in counts]
        if len(gp) >= 2:
            (n0, r0), (n1, r1) = gp[0], gp[-1]
            say(f"Memory per host (gpureap's peak RSS, {n0} → {n1} hosts): "
                f"{(r1 - r0) / (n1 - n0):.1f} KiB per host ({r0 / 1024:.1f} MiB at {n0}, {r1 / 1024:.1f} MiB at {n1}).\n")
        say(f"Load average at the end: {' / '.join(f'{v:.1f}' for v in os.getloadavg())} (1 / 5 / 15 min).\n")
    finally:
        host.close()
    return results, measured
