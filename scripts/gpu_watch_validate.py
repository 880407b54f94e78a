#!/usr/bin/env python3
"""Check gpureap's fleet, push, exporter, check and portable build on real GPUs.

    python3 scripts/gpu_watch_validate.py [PATH_TO_GPUREAP] [--gpu LIST] [--out DIR] [--portable PATH]

Needs NVIDIA GPUs, python3 with PyTorch, and pynvml (nvidia-ml-py); no sshd,
no Prometheus. Uses every GPU no other process uses (or --gpu LIST). Starts,
in parallel, one CUDA holder per GPU (scripts/cuda_holder.py, 2 + i GiB on the
i-th GPU used, so each GPU's figure is its own) and, on the last GPU, an
SGLang-like launcher with a 2 GiB worker, whose launcher it kills later to
orphan the worker. Then, each outcome checked against NVML, GPU by GPU:

- `gpureap exporter --listen 127.0.0.1:PORT --interval 1s`: per GPU, memory
  used within 256 MiB of NVML's, total equal to NVML's, holders equal to
  NVML's process count; `gpureap_driver_up 1`; the orphan's memory in
  `gpureap_gpu_orphaned_memory_bytes` on its GPU only; SIGTERM: exit 0.
  `status --prometheus` once, likewise.
- `status -H localhost,gpuhost --json`, `wait -H` and `free -H --match TAG
  --grace 0` through scripts/fake_ssh.py (ssh to this machine: the remote
  command runs here with `sh -c`, as sshd would run it): each host's report
  places every holder on its GPU with NVML's memory; wait returns once a
  holder is killed; free frees and verifies, and NVML agrees.
- `push -H localhost --to DIR/gpureap` through the same fake ssh: installed,
  `--version` there equals this one's, a second push is up_to_date. push's
  record of what it installed is kept in the run's directory (fake_ssh.py
  --state), never in the host's /var/lib/gpureap.
- `check --gpu LIST`: exit 0 on clean GPUs and with healthy holders; exit 1
  naming the GPU once the worker is orphaned, exit 0 on the other GPUs.
- `--portable PATH` (optional; SKIP without it): `PATH --version` runs and
  `PATH status --json` agrees with this gpureap's.

It never signals anything it did not start: its processes are known by PID
and start time and all killed before it exits; every `free` is scoped with
--match on the run's tag; it never resets a GPU or changes its settings.
Prints one PASS/FAIL/SKIP line per check and `N passed, M failed, K skipped`;
exits 1 if any check failed, 2 if it could not start. With --out DIR it writes
its log (watch-validate.log), every gpureap command with its output
(gpureap-outputs.txt, gpureap/), the scrapes (metrics/), the fake ssh's calls
(ssh.log), the exporter's stderr (exporter.log) and children.log.
"""

import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
from pathlib import Path

import gpuval as gv
from gpu_validate import Validation

HERE = Path(__file__).resolve().parent
FAKE_SSH = HERE / "fake_ssh.py"
GIB = gv.GIB
LAUNCHER = "python3 -m sglang.launch_server"
ORPHAN = "sglang::orphan_TP0"
ORPHAN_GIB = 2


def holder_title(i):
    return f"sglang::watch_TP{i}"


def holder_gib(i):
    return 2 + i


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def first_line(text):
    return (text.strip().splitlines() or [""])[0]


class WatchValidation(Validation):
    def __init__(self, args):
        super().__init__(args, "watch-validate.log")
        self.portable = args.portable
        self.ssh_log = self.work / "ssh.log"
        self.ssh = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_SSH))} --log {shlex.quote(str(self.ssh_log))}"
        self.exporter = None
        self.exporter_log = None
        self.port = None
        self.scrapes = 0
        self.holders = {}  # pid -> GPU, the holders started
        self.orphan = None
        self.launcher = None

    # ------------------------------------------------------------ plumbing

    def fleet(self, label, *arguments, remote_bin=None):
        """gpureap with -H, through the fake ssh, the remote side running `remote_bin` (this gpureap)."""
        return self.gpureap(label, *arguments, "--ssh", self.ssh, "--remote-bin", remote_bin or self.bin)

    def step(self, title, function):
        """A group of checks; one that breaks is a failure, and the next still run."""
        self.log(f"\n== {title} ==")
        started = time.monotonic()
        try:
            function()
        except Exception as error:
            self.log(traceback.format_exc())
            self.check(f"{title}: ran to the end", False, f"{type(error).__name__}: {error}")
        self.log(f"  ({time.monotonic() - started:.1f} s)")

    def scrape(self, label):
        """GET /metrics: (text, samples)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        self.scrapes += 1
        self.r.save(f"metrics/{self.scrapes:03d}-{label}.txt", text)
        return text, gv.parse_metrics(text)

    def scrape_until(self, label, condition, timeout=15):
        """Scrapes until condition(samples, nvml snapshot) holds; returns the last (samples, snapshot, held)."""
        deadline = time.monotonic() + timeout
        while True:
            _, samples = self.scrape(label)
            snapshot = self.snap()
            held = condition(samples, snapshot)
            if held or time.monotonic() > deadline:
                return samples, snapshot, held
            time.sleep(0.25)

    def nvml_count(self, index):
        return len(self.nvml.processes(index, graphics=True))

    def alive_holders(self):
        return {pid: gpu for pid, gpu in self.holders.items() if gv.alive(pid)}

    # ------------------------------------------------------------ set-up

    def preflight(self):
        """Host facts and which GPUs to use; the checks of gpu_validate.py's preflight are its own."""
        return self.pick_gpus()

    def start_exporter(self):
        """`gpureap exporter` on a free loopback port, scanning every second; waits until it answers."""
        self.exporter_log = open(self.work / "exporter.log", "ab")
        for _ in range(3):  # a port taken between the probe and the bind: another one
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                self.port = probe.getsockname()[1]
            command = [self.bin, "--backend", self.backend, "exporter", "--listen", f"127.0.0.1:{self.port}", "--interval", "1s"]
            self.log("$ " + " ".join(shlex.quote(a) for a in command))
            self.exporter = self.procs.popen(command, env=gv.child_env(self.tag), stdin=subprocess.DEVNULL,
                                             stdout=self.exporter_log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 15
            while self.exporter.poll() is None and time.monotonic() < deadline:
                try:
                    self.scrape("first")
                    return
                except OSError:
                    time.sleep(0.1)
            if self.exporter.poll() is None:
                raise RuntimeError("the exporter does not answer after 15 s")
            self.log(f"  the exporter exited with {self.exporter.returncode}; trying another port")
        raise RuntimeError("the exporter could not start (exporter.log)")

    def start_holders(self):
        """One holder per GPU and, on the last, a launcher with a worker, all at once; waits until all are ready."""
        for i, gpu in enumerate(self.gpus):
            self.bash(self.holder(holder_title(i), holder_gib(i), f"w{i}", gpu))
        last = self.gpus[-1]
        self.launch_job(gv.record(LAUNCHER) + "( " + self.holder(ORPHAN, ORPHAN_GIB, "orphan", last) + " ) & "
                        + f"exec -a '{LAUNCHER} --model-path meta-llama/Llama-3.1-8B' sleep 100000")
        started = time.monotonic()
        self.wait_ready(*[f"w{i}" for i in range(len(self.gpus))], "orphan", timeout=180)
        self.holders = {self.procs.pid(holder_title(i)): gpu for i, gpu in enumerate(self.gpus)}
        self.orphan = self.procs.pid(ORPHAN)
        self.holders[self.orphan] = last
        self.launcher = self.procs.pid(LAUNCHER)
        self.log(f"  {len(self.holders)} holders ready after {time.monotonic() - started:.1f} s: "
                 + ", ".join(f"{pid} on GPU {gpu}" for pid, gpu in self.holders.items()) + f"; launcher {self.launcher}")
        self.check_placement("holders", self.holders, self.snap())

    # ------------------------------------------------------------ steps

    def step_push(self):
        state = self.work / "push-state"
        state.mkdir()
        if os.geteuid() == 0:
            probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if probe.returncode != 0:
                self.r.skip("push through the fake ssh", "as root, push records what it installs in /var/lib/gpureap; "
                            f"`unshare --mount` (to keep that record in the run's directory) failed: {probe.stdout.strip()}")
                return
        dest = self.work / "push" / "gpureap"
        ssh = f"{self.ssh} --state {shlex.quote(str(state))}"
        local = self.version()
        done, _, doc = self.gpureap("push", "push", "-H", "localhost", "--ssh", ssh, "--to", str(dest), "--json", backend=False)
        code, report, error = gv.fleet_hosts(doc).get("localhost", (None, None, "no entry"))
        report = report or {}
        self.check("push -H localhost --to DIR/gpureap: installed, exit 0",
                   done.returncode == 0 and code == 0 and report.get("action") == "installed" and report.get("path") == str(dest),
                   f"{gv.exit_text(done.returncode)}; host: exit {code}, action {report.get('action')}, path {report.get('path')}, "
                   f"error {error}")
        there = subprocess.run([str(dest), "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) \
            if dest.exists() else None
        self.check("the pushed binary runs, its --version equals this one's, its sha256 this one's",
                   there is not None and there.returncode == 0 and there.stdout.strip() == local and sha256(dest) == sha256(self.bin),
                   f"{there.stdout.strip() if there else 'nothing at ' + str(dest)!r} vs {local!r}")
        record = state / "gpureap" / "pushed"
        recorded = record.read_text() if record.exists() else ""
        self.check("push recorded what it installed (in the run's directory, not the host's)",
                   f"{sha256(self.bin)} {dest}" in recorded.splitlines(), recorded.strip() or f"no {record}")
        done, _, doc = self.gpureap("push-again", "push", "-H", "localhost", "--ssh", ssh, "--to", str(dest), "--json", backend=False)
        code, report, error = gv.fleet_hosts(doc).get("localhost", (None, None, "no entry"))
        self.check("a second push says up_to_date, exit 0",
                   done.returncode == 0 and code == 0 and (report or {}).get("action") == "up_to_date",
                   f"{gv.exit_text(done.returncode)}; host: action {(report or {}).get('action')}, error {error}")
        done, _, doc = self.fleet("status-pushed", "status", "-H", "localhost", "--json", remote_bin=str(dest))
        code, report, error = gv.fleet_hosts(doc).get("localhost", (None, None, "no entry"))
        self.check("status -H through the pushed binary answers",
                   done.returncode == 0 and code == 0 and (report or {}).get("kind") == "status",
                   f"{gv.exit_text(done.returncode)}; host exit {code}, error {error}")

    def step_portable_version(self):
        if not self.portable:
            self.r.skip("portable binary: --version", "no --portable PATH given")
            return
        if not Path(self.portable).is_file():
            self.r.skip("portable binary: --version", f"{self.portable} does not exist")
            self.portable = None
            return
        done = subprocess.run([self.portable, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.check("portable binary: --version runs and says gpureap",
                   done.returncode == 0 and done.stdout.startswith("gpureap "),
                   f"{gv.exit_text(done.returncode)}: {done.stdout.strip()!r} (this one: {self.version()!r})")

    def step_check_clean(self):
        snapshot = self.snap()
        clean = [gpu for gpu in self.gpus if snapshot[gpu][0] <= gv.SLACK and not snapshot[gpu][1]]
        for gpu in sorted(set(self.gpus) - set(clean)):
            self.log(f"  GPU {gpu} not clean before the run ({snapshot[gpu][0] / GIB:.2f} GiB used): left out of this check")
        if not clean:
            self.r.skip("check on clean GPUs: exit 0", "no GPU used is clean before the run")
            return
        listed = ",".join(map(str, clean))
        done, _, _ = self.gpureap("check-clean", "check", "--gpu", listed)
        self.check(f"check --gpu {listed} on clean GPUs: exit 0 (healthy)", done.returncode == 0,
                   f"{gv.exit_text(done.returncode)}: {first_line(done.stdout)!r}")

    def step_exporter(self):
        since = time.time()

        def settled(samples, snapshot):
            stamp = gv.metric(samples, "gpureap_snapshot_timestamp_seconds")
            return stamp is not None and stamp >= since and all(
                gv.metric(samples, "gpureap_gpu_holders", gpu=gpu) == len(snapshot[gpu][1]) for gpu in self.gpus)

        samples, snapshot, held = self.scrape_until("holders", settled)
        self.check("exporter: a snapshot taken after the holders started, holders equal to NVML's count", held,
                   f"snapshot at {gv.metric(samples, 'gpureap_snapshot_timestamp_seconds')}, started at {since:.3f}")
        for gpu in self.gpus:
            used = gv.metric(samples, "gpureap_gpu_memory_used_bytes", gpu=gpu)
            ours = [pid for pid, g in self.holders.items() if g == gpu]
            allocated = sum(snapshot[gpu][1].get(pid) or 0 for pid in ours)
            self.check(f"exporter: GPU {gpu} memory used within 256 MiB of NVML's, at least its holders'",
                       used is not None and abs(used - snapshot[gpu][0]) <= gv.SLACK and used >= allocated,
                       f"{(used or 0) / GIB:.3f} GiB vs NVML {snapshot[gpu][0] / GIB:.3f} GiB (holders {allocated / GIB:.2f} GiB), "
                       f"difference {((used or 0) - snapshot[gpu][0]) / gv.MIB:.1f} MiB")
            total = gv.metric(samples, "gpureap_gpu_memory_total_bytes", gpu=gpu)
            self.check(f"exporter: GPU {gpu} memory total equals NVML's", total == self.nvml.memory(gpu).total,
                       f"{total} vs {self.nvml.memory(gpu).total}")
            holders = gv.metric(samples, "gpureap_gpu_holders", gpu=gpu)
            self.check(f"exporter: GPU {gpu} holders counts the run's holders ({len(ours)}), as NVML lists them",
                       holders == len(snapshot[gpu][1]) and set(ours) <= set(snapshot[gpu][1]),
                       f"{holders} vs NVML {sorted(snapshot[gpu][1])}, ours {ours}")
            self.check(f"exporter: GPU {gpu} up", gv.metric(samples, "gpureap_gpu_up", gpu=gpu) == 1)
        backend = self.backend.split(":")[0]
        self.check("exporter: gpureap_driver_up 1", gv.metric(samples, "gpureap_driver_up", backend=backend) == 1,
                   str([(labels, value) for name, labels, value in samples if name == "gpureap_driver_up"]))

    def step_prometheus_once(self):
        done, _, _ = self.gpureap("status-prometheus", "status", "--prometheus")
        samples = gv.parse_metrics(done.stdout)
        snapshot = self.snap()
        problems = []
        for gpu in self.gpus:
            used = gv.metric(samples, "gpureap_gpu_memory_used_bytes", gpu=gpu)
            if used is None or abs(used - snapshot[gpu][0]) > gv.SLACK:
                problems.append(f"GPU {gpu} used {used} vs NVML {snapshot[gpu][0]}")
            if gv.metric(samples, "gpureap_gpu_memory_total_bytes", gpu=gpu) != self.nvml.memory(gpu).total:
                problems.append(f"GPU {gpu} total {gv.metric(samples, 'gpureap_gpu_memory_total_bytes', gpu=gpu)}")
            if gv.metric(samples, "gpureap_gpu_holders", gpu=gpu) != len(snapshot[gpu][1]):
                problems.append(f"GPU {gpu} holders {gv.metric(samples, 'gpureap_gpu_holders', gpu=gpu)} vs NVML {len(snapshot[gpu][1])}")
        self.check("status --prometheus: exit 0; per GPU used (within 256 MiB), total and holders as NVML says",
                   done.returncode == 0 and not problems and gv.metric(samples, "gpureap_driver_up", backend=self.backend.split(":")[0]) == 1,
                   f"{gv.exit_text(done.returncode)}; {len(samples)} samples" + (f"; {problems}" if problems else ""))

    def step_fleet_status(self):
        calls = len(self.ssh_log.read_text().splitlines()) if self.ssh_log.exists() else 0
        done, wall_ms, doc = self.fleet("status-fleet", "status", "-H", "localhost,gpuhost", "--json")
        snapshot = self.snap()
        hosts = gv.fleet_hosts(doc)
        now = self.ssh_log.read_text().splitlines() if self.ssh_log.exists() else []
        self.check("status -H localhost,gpuhost: exit 0, a fleet document with both hosts, each exit 0, through the fake ssh",
                   done.returncode == 0 and doc.get("kind") == "fleet" and list(hosts) == ["localhost", "gpuhost"]
                   and all(code == 0 and (report or {}).get("kind") == "status" for code, report, _ in hosts.values())
                   and sorted(line.split("\t")[0] for line in now[calls:]) == ["gpuhost", "localhost"],
                   f"{gv.exit_text(done.returncode)}, {wall_ms:.0f} ms; hosts {[(h, c, e) for h, (c, _, e) in hosts.items()]}")
        for host, (_, report, _) in hosts.items():
            report = report or {}
            problems = gv.status_placement_problems(report, snapshot, self.holders)
            totals = [gpu for gpu in self.gpus if (gv.gpu_row(report, gpu) or {}).get("memory_total") != self.nvml.memory(gpu).total]
            self.check(f"status -H: {host}'s report lists each holder under its own GPU only, with NVML's memory (within 256 MiB)",
                       not problems and not totals,
                       gv.describe_placement(report, self.holders) if not (problems or totals) else f"{problems}; totals off on {totals}")

    def step_portable_status(self):
        if not self.portable:
            self.r.skip("portable binary: status --json agrees", "no portable binary")
            return
        theirs = subprocess.run([self.portable, "--backend", self.backend, "status", "--json"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, timeout=120)
        _, _, mine = self.gpureap("status-for-portable", "status", "--json")
        self.r.save("portable-status.json", theirs.stdout + theirs.stderr)
        try:
            document = json.loads(theirs.stdout)
        except json.JSONDecodeError:
            document = None
        problems = gv.status_differences(mine, document or {}, sorted(self.alive_holders())) if document else ["not JSON"]
        if document and str(document.get("backend")) != str(mine.get("backend")):
            problems.append(f"backend {document.get('backend')!r} vs {mine.get('backend')!r}")
        self.check("portable binary: status --json agrees with this gpureap's (GPUs, the holders' placement and memory)",
                   theirs.returncode == 0 and not problems,
                   f"{gv.exit_text(theirs.returncode)}" + (f"; {problems}" if problems else f"; backend {mine.get('backend')}")
                   + (f"; stderr {theirs.stderr.strip()!r}" if theirs.stderr.strip() else ""))

    def step_check_healthy(self):
        listed = ",".join(map(str, self.gpus))
        done, _, _ = self.gpureap("check-healthy", "check", "--gpu", listed)
        self.check(f"check --gpu {listed} with healthy holders (parents alive): exit 0", done.returncode == 0,
                   f"{gv.exit_text(done.returncode)}: {first_line(done.stdout)!r}")

    def step_orphan(self):
        last = self.gpus[-1]
        parent = gv.stat(self.orphan)["ppid"]
        self.check("the worker is the launcher's child, in its group", parent == self.launcher and gv.stat(self.orphan)["pgid"] == self.launcher,
                   f"ppid {parent}, pgid {gv.stat(self.orphan)['pgid']}, launcher {self.launcher}")
        gv.signal_identity(self.launcher, self.procs.start(self.launcher))
        reparented = self.wait_until(lambda: gv.stat(self.orphan)["ppid"] != self.launcher)
        self.check("launcher SIGKILLed; the worker is re-parented", reparented and not gv.alive(self.launcher),
                   f"parent now {gv.stat(self.orphan)['ppid']}")
        done, _, _ = self.gpureap("check-orphan", "check", "--gpu", str(last))
        self.check(f"check --gpu {last} with the orphaned worker: exit 1, the first line names GPU {last} and the orphan",
                   done.returncode == 1 and first_line(done.stdout).startswith(f"GPU {last}:") and "orphaned" in first_line(done.stdout),
                   f"{gv.exit_text(done.returncode)}: {first_line(done.stdout)!r}")
        listed = ",".join(map(str, self.gpus))
        done, _, _ = self.gpureap("check-orphan-all", "check", "--gpu", listed)
        lines = [line for line in done.stdout.splitlines() if "orphaned" in line and line.startswith("GPU ")]
        self.check(f"check --gpu {listed}: exit 1, every problem line about orphans names GPU {last} only",
                   done.returncode == 1 and lines and all(line.startswith(f"GPU {last}:") for line in lines),
                   f"{gv.exit_text(done.returncode)}: {lines}")
        if len(self.gpus) >= 2:
            others = ",".join(map(str, self.gpus[:-1]))
            done, _, _ = self.gpureap("check-others", "check", "--gpu", others)
            self.check(f"check --gpu {others} (not the orphan's GPU): exit 0", done.returncode == 0,
                       f"{gv.exit_text(done.returncode)}: {first_line(done.stdout)!r}")
        else:
            self.r.skip("check on the GPUs without the orphan: exit 0", f"needs 2 GPUs, using {self.gpus}")

        def orphan_seen(samples, _):
            return (gv.metric(samples, "gpureap_gpu_orphaned_memory_bytes", gpu=last) or 0) > 0

        samples, snapshot, _ = self.scrape_until("orphan", orphan_seen)
        orphaned = {gpu: gv.metric(samples, "gpureap_gpu_orphaned_memory_bytes", gpu=gpu) for gpu in self.gpus}
        nvml = snapshot[last][1].get(self.orphan) or 0
        self.check(f"exporter: the orphan's memory (NVML: {nvml / GIB:.2f} GiB) on GPU {last} only",
                   abs((orphaned[last] or 0) - nvml) <= gv.SLACK and nvml > 0
                   and all(orphaned[gpu] == 0 for gpu in self.gpus if gpu != last),
                   str({gpu: f"{(value or 0) / GIB:.2f} GiB" for gpu, value in orphaned.items()}))

    def step_fleet_wait(self):
        gpu = self.gpus[0]
        holder = next(pid for pid, g in self.holders.items() if g == gpu and pid != self.orphan)
        snapshot = self.snap()
        below = snapshot[gpu][0] - (snapshot[gpu][1].get(holder) or 0) + GIB // 2
        command = [self.bin, "--backend", self.backend, "wait", "-H", "localhost", "--ssh", self.ssh, "--remote-bin", self.bin,
                   "--gpu", str(gpu), "--below", str(below), "--timeout", "60s", "--json"]
        waiter = self.procs.popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=gv.child_env(self.tag),
                                  stdin=subprocess.DEVNULL)
        time.sleep(1.5)
        self.check(f"wait -H localhost --gpu {gpu} --below {below / GIB:.2f}GiB is still waiting while the holder holds memory",
                   waiter.poll() is None, f"exited: {waiter.poll()}")
        killed_at = time.monotonic()
        self.procs.kill(holder)
        try:
            out, err = waiter.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            waiter.kill()
            out, err = waiter.communicate()
        after_ms = (time.monotonic() - killed_at) * 1000
        self.r.save("gpureap/wait-fleet.txt", f"$ gpureap {' '.join(shlex.quote(a) for a in command[1:])}  # "
                    f"{gv.exit_text(waiter.returncode)}\n{out}{err}")
        try:
            doc = json.loads(out)
        except json.JSONDecodeError:
            doc = {}
        code, report, error = gv.fleet_hosts(doc).get("localhost", (None, None, "no entry"))
        report = report or {}
        self.check("wait -H exits 0 once the holder is killed, the host's report ready on that GPU",
                   waiter.returncode == 0 and code == 0 and report.get("ready") is True
                   and [x.get("index") for x in report.get("gpus", [])] == [gpu],
                   f"{gv.exit_text(waiter.returncode)} {after_ms:.0f} ms after the kill; host: exit {code}, waited "
                   f"{report.get('waited_ms')} ms, error {error}" + (f"; stderr {err.strip()!r}" if err.strip() else ""))
        self.timings.append(("wait -H: returned after the kill", f"{after_ms:.0f} ms (fake ssh and remote gpureap included)"))

    def step_fleet_free(self):
        remaining = self.alive_holders()
        before = self.snap()
        done, wall_ms, doc = self.fleet("free-fleet", "free", "-H", "localhost", "--match", self.tag, "--grace", "0", "--yes", "--json")
        after = self.snap()
        code, report, error = gv.fleet_hosts(doc).get("localhost", (None, None, "no entry"))
        report = report or {}
        self.check("free -H localhost --match TAG --grace 0: exit 0, the run's holders left are exactly the targets",
                   done.returncode == 0 and code == 0 and gv.targets(report) == sorted(remaining),
                   f"{gv.exit_text(done.returncode)}, {wall_ms:.0f} ms; host exit {code}, error {error}; targets {gv.targets(report)}, "
                   f"expected {sorted(remaining)}")
        self.check_freed("free -H", report, remaining.values())
        self.check("free -H: NVML lists none of them", not any(gv.nvml_gpus_of(after, pid) for pid in remaining),
                   {index: sorted(listed) for index, (_, listed) in after.items()})
        self.check_memory_back("free -H", before, after, list(remaining))
        self.timings.append(("free -H localhost, grace 0", f"{gv.describe_outcomes(report)}; command wall {wall_ms:.0f} ms"))

        def back(samples, snapshot):
            return all(gv.metric(samples, "gpureap_gpu_holders", gpu=gpu) == len(snapshot[gpu][1]) for gpu in self.gpus)

        samples, snapshot, held = self.scrape_until("freed", back)
        self.check("exporter follows: holders per GPU back to NVML's count",
                   held, str({gpu: (gv.metric(samples, "gpureap_gpu_holders", gpu=gpu), len(snapshot[gpu][1])) for gpu in self.gpus}))

    def step_exporter_stop(self):
        started = time.monotonic()
        self.exporter.send_signal(signal.SIGTERM)
        try:
            code = self.exporter.wait(timeout=15)
        except subprocess.TimeoutExpired:
            code = None
        self.check("exporter: SIGTERM ends it with exit 0", code == 0,
                   f"exit {code} after {(time.monotonic() - started) * 1000:.0f} ms")

    # ------------------------------------------------------------ main

    def run(self):
        self.started = started = time.monotonic()
        try:
            self.nvml = gv.Nvml(gv.load_pynvml())
        except Exception as error:  # no pynvml, no driver: nothing started, nothing checked
            self.log(f"cannot start: NVML through pynvml: {type(error).__name__}: {error}")
            self.r.close()
            return 2
        try:
            if not self.preflight():
                return 2
            self.step("push through the fake ssh", self.step_push)
            self.step("portable binary: --version", self.step_portable_version)
            self.step("check on clean GPUs", self.step_check_clean)
            self.step("exporter start", self.start_exporter)
            self.step("holders: one per GPU, and a launcher's worker on the last", self.start_holders)
            if not self.holders:
                raise RuntimeError("no holders: the checks that need them cannot run")
            self.step("exporter with the holders", self.step_exporter)
            self.step("status --prometheus", self.step_prometheus_once)
            self.step("status -H localhost,gpuhost", self.step_fleet_status)
            self.step("portable binary: status", self.step_portable_status)
            self.step("check with healthy holders", self.step_check_healthy)
            self.step("launcher SIGKILLed: check names the orphan's GPU", self.step_orphan)
            self.step("wait -H", self.step_fleet_wait)
            self.step("free -H", self.step_fleet_free)
            self.step("exporter stop", self.step_exporter_stop)
        except Exception as error:
            self.log(traceback.format_exc())
            self.check("the validation ran to the end", False, f"{type(error).__name__}: {error}")
        finally:
            self.cleanup()
            if self.exporter_log:
                self.exporter_log.close()
            shutil.rmtree(self.work / "push", ignore_errors=True)  # the pushed copy: no binary left in /tmp
        return self.finish(started, "Timings:", logs=("ssh.log", "exporter.log"))


def extra_arguments(parser):
    parser.add_argument("--portable", default=None, help="a portable gpureap build to check too (SKIP without it)")


if __name__ == "__main__":
    arguments = gv.parse_args(sys.argv[1:], __doc__.splitlines()[0], extra_arguments)
    if not os.access(arguments.binary, os.X_OK) or not Path(arguments.binary).is_file():
        print(f"no gpureap binary at {arguments.binary}: build it (cargo build --release) or give its path", file=sys.stderr)
        sys.exit(2)
    if arguments.portable:
        arguments.portable = str(Path(arguments.portable).resolve())
    sys.exit(WatchValidation(arguments).run())
