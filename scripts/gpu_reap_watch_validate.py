#!/usr/bin/env python3
"""Check `gpureap reap --watch` on a real GPU: a launcher SIGKILLed leaves a worker holding memory;
the watch frees it once it is older than the configured age, and its log line's figures are NVML's.

    python3 scripts/gpu_reap_watch_validate.py [PATH_TO_GPUREAP] [--gpu LIST] [--out DIR] [--age S]

Needs an NVIDIA GPU, python3 with PyTorch, and pynvml (nvidia-ml-py). Uses the first GPU no
other process uses (or the first of --gpu LIST). On it:

- a healthy server (`python3 serve.py`, 2 GiB, its parent alive) that no rule names, and an
  SGLang-like launcher whose worker (`sglang::scheduler_TP0`, scripts/cuda_holder.py, 6 GiB)
  holds the GPU;
- `gpureap reap --watch --orphans --match TAG --older-than AGE --interval 1s --grace 2s
  --enforce --log DIR/reap.jsonl --listen 127.0.0.1:0` (AGE 20 s by default; --match on the
  run's tag: it can take nothing this run did not start);
- the launcher is SIGKILLed as soon as the worker is ready: the worker is an orphan younger
  than AGE. Checked: it is still alive while younger than AGE - 2 s; the watch frees it (one
  `freed` line, verdict `freed`, rule `orphaned`, signals SIGTERM); the line's time is at least
  AGE after the worker started and its `age_ms` at least AGE; the line's GPU figures against
  NVML's: `memory_before` within 256 MiB of NVML's used memory before the kill,
  `memory_after` within 256 MiB of NVML's after, `freed_bytes` within 256 MiB of the worker's
  memory as NVML listed it; NVML no longer lists the worker; the healthy server is alive with
  its memory, and no line names it; `gpureap_reaped_bytes_total{reason="orphaned"}` equals the
  line's `freed_bytes`;
- SIGTERM ends the watch with exit 0 and a `stopped` line, and no process of this run is left
  stopped (state T).

It never signals anything it did not start: its processes are known by PID and start time and
all killed before it exits; it never resets a GPU or changes its settings. Prints one
PASS/FAIL/SKIP line per check and `N passed, M failed, K skipped`; exits 1 if any check failed,
2 if it could not start. With --out DIR it keeps its log (reap-watch-validate.log), the
decision log (reap.jsonl), the watch's stderr (watch.log), and children.log.

A dry run on the simulated driver checks this script's logic, not the driver:
    python3 tests/gpu_sim/simulate.py 1 -- python3 scripts/gpu_reap_watch_validate.py target/release/gpureap --age 6
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
import urllib.request
from pathlib import Path

import gpuval as gv
from gpu_validate import Validation

GIB = gv.GIB
MIB = 1 << 20
LAUNCHER = "python3 -m sglang.launch_server"
WORKER = "sglang::scheduler_TP0"
SERVER = "python3 serve.py"
WORKER_GIB = 6
SERVER_GIB = 2
SLACK = 256 * MIB


def boot_time():
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


def started_at(start_ticks):
    """A process's start time as Unix seconds, from its start time in ticks since boot."""
    return boot_time() + start_ticks / os.sysconf("SC_CLK_TCK")


class ReapWatchValidation(Validation):
    def __init__(self, args):
        super().__init__(args, "reap-watch-validate.log")
        self.age = args.age
        self.watch = None
        self.watch_log = None
        self.decisions = self.work / "reap.jsonl"

    def lines(self):
        try:
            return [json.loads(line) for line in self.decisions.read_text().splitlines() if line.strip()]
        except FileNotFoundError:
            return []

    def wait_line(self, what, found, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines():
                if found(line):
                    return line
            if self.watch.poll() is not None:
                raise RuntimeError(f"the watch ended ({self.watch.returncode}) before {what} (watch.log)")
            time.sleep(0.1)
        raise RuntimeError(f"no {what} within {timeout:.0f} s")

    def metrics_port(self):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/", (self.work / "watch.log").read_text())
            if found:
                return int(found.group(1))
            time.sleep(0.1)
        raise RuntimeError("the watch does not say where its metrics are")

    def start_watch(self):
        self.watch_log = open(self.work / "watch.log", "ab")
        command = [self.bin, "--backend", self.backend, "reap", "--watch", "--orphans", "--match", self.tag,
                   "--older-than", f"{self.age}s", "--interval", "1s", "--grace", "2s", "--enforce",
                   "--log", str(self.decisions), "--listen", "127.0.0.1:0"]
        self.log("$ gpureap " + " ".join(command[1:]))
        self.watch = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self.watch_log, stderr=self.watch_log)
        self.wait_line("a started line", lambda line: line.get("action") == "started", 30)

    def case_orphan(self):
        gpu = self.gpus[0]
        self.start_watch()
        self.bash(self.holder(SERVER, SERVER_GIB, "server", gpu))
        self.launch_job(gv.record(LAUNCHER) + "( " + self.holder(WORKER, WORKER_GIB, "worker", gpu) + " ) & "
                        + f"exec -a '{LAUNCHER} --model-path meta-llama/Llama-3.1-8B' sleep 100000")
        self.wait_ready("server", "worker", timeout=180)
        worker, launcher, server = self.procs.pid(WORKER), self.procs.pid(LAUNCHER), self.procs.pid(SERVER)
        worker_start = started_at(self.procs.start(worker))
        before = self.snap()
        used_before, listed_before = before[gpu]
        worker_memory = listed_before.get(worker)
        self.check("NVML lists the worker and the server on the GPU", worker_memory and listed_before.get(server),
                   f"GPU {gpu}: {used_before / GIB:.2f} GiB used, listed {listed_before}")
        gv.signal_identity(launcher, self.procs.start(launcher))
        killed_at = time.time()
        reparented = self.wait_until(lambda: (gv.stat(worker) or {}).get("ppid") != launcher)
        age_at_kill = killed_at - worker_start
        self.check(f"launcher SIGKILLed, the worker re-parented, younger than the age ({self.age} s)",
                   reparented and age_at_kill < self.age - 3, f"worker {worker} {age_at_kill:.1f} s old at the kill")

        # While younger than the age (less 2 s of margin), the worker lives.
        young_until = worker_start + self.age - 2
        survived = True
        while time.time() < young_until:
            survived = survived and gv.alive(worker)
            time.sleep(0.2)
        self.check("the orphan is not touched while younger than --older-than", survived,
                   f"alive {self.age - 2} s after it started")

        line = self.wait_line("a freed line for the worker",
                              lambda line: line.get("action") == "freed" and (line.get("target") or {}).get("pid") == worker,
                              self.age + 90)
        after = self.snap()
        used_after, listed_after = after[gpu]
        freed_at = line["time_unix_ms"] / 1000
        self.log(f"  the line: {json.dumps(line)}")
        self.check("one freed line: rule orphaned, verdict freed, SIGTERM",
                   line.get("rule") == "orphaned" and line.get("verdict") == "freed"
                   and [event["signal"] for event in line["target"]["signals"]] == ["SIGTERM"],
                   f"rule {line.get('rule')}, verdict {line.get('verdict')}, signals {line['target']['signals']}")
        self.check(f"freed after the age: the line {freed_at - worker_start:.1f} s after the worker started, age_ms {line.get('age_ms')}",
                   freed_at - worker_start >= self.age and (line.get("age_ms") or 0) >= self.age * 1000, "")
        row = next((gpu_line for gpu_line in line.get("gpus", []) if gpu_line.get("index") == gpu), {})
        before_ok = row.get("memory_before") is not None and abs(row["memory_before"] - used_before) <= SLACK
        after_ok = row.get("memory_after") is not None and abs(row["memory_after"] - used_after) <= SLACK
        freed_ok = row.get("freed_bytes") is not None and worker_memory and abs(row["freed_bytes"] - worker_memory) <= SLACK
        self.check("the line's memory_before is NVML's used memory before the kill (within 256 MiB)", before_ok,
                   f"line {row.get('memory_before')}, NVML {used_before}")
        self.check("the line's memory_after is NVML's used memory after (within 256 MiB)", after_ok,
                   f"line {row.get('memory_after')}, NVML {used_after}")
        self.check("the line's freed_bytes is the worker's memory as NVML listed it (within 256 MiB)", freed_ok,
                   f"line {row.get('freed_bytes')}, NVML {worker_memory}; freed after {row.get('freed_after_ms')} ms")
        self.timings.append(("reap --watch: the worker's release", f"{row.get('freed_bytes', 0) / GIB:.2f} GiB back in {row.get('freed_after_ms')} ms"))
        self.check("NVML no longer lists the worker; the server keeps its memory",
                   worker not in listed_after and listed_after.get(server) == listed_before.get(server) and gv.alive(server),
                   f"listed after {listed_after}")
        self.check("no line names the server", not any((l.get("target") or {}).get("pid") == server for l in self.lines()), "")
        port = self.metrics_port()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        samples = gv.parse_metrics(body)
        reaped = gv.metric(samples, "gpureap_reaped_bytes_total", reason="orphaned")
        self.check("gpureap_reaped_bytes_total{reason=orphaned} is the line's freed_bytes", reaped == row.get("freed_bytes"),
                   f"{reaped} vs {row.get('freed_bytes')}")
        self.stop()

    def stop(self):
        """SIGTERM to the watch, before this case's processes are cleaned up."""
        self.watch.send_signal(signal.SIGTERM)
        try:
            code = self.watch.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
        last = (self.lines() or [{}])[-1]
        self.check("SIGTERM ends the watch with exit 0 and a stopped line", code == 0 and last.get("action") == "stopped",
                   f"exit {code}, last line {last.get('action')}")
        stopped = [pid for pid, start, _ in self.procs.records() if gv.alive(pid, start) and (gv.stat(pid) or {}).get("state") == "T"]
        self.check("no process of this run is left stopped", not stopped, str(stopped))

    def run(self):
        self.started = started = time.monotonic()
        try:
            self.nvml = gv.Nvml(gv.load_pynvml())
        except Exception as error:
            self.log(f"cannot start: NVML through pynvml: {type(error).__name__}: {error}")
            self.r.close()
            return 2
        try:
            if not self.pick_gpus():
                return 2
            self.case(f"a launcher SIGKILLed; reap --watch frees its worker after {self.age} s, then SIGTERM", self.case_orphan)
        except Exception as error:
            self.log(traceback.format_exc())
            self.check("the validation ran to the end", False, f"{type(error).__name__}: {error}")
        finally:
            if self.watch is not None and self.watch.poll() is None:
                self.watch.kill()
                self.watch.wait()
            self.cleanup()
            if self.watch_log:
                self.watch_log.close()
            if self.decisions.exists():
                self.r.save("reap.jsonl", self.decisions.read_text())
        return self.finish(started, "Timings:", logs=("watch.log",))


def extra_arguments(parser):
    parser.add_argument("--age", type=int, default=20, help="the watch's --older-than, in seconds (default 20)")


if __name__ == "__main__":
    arguments = gv.parse_args(sys.argv[1:], __doc__.splitlines()[0], extra_arguments)
    if not os.access(arguments.binary, os.X_OK) or not Path(arguments.binary).is_file():
        print(f"no gpureap binary at {arguments.binary}: build it (cargo build --release) or give its path", file=sys.stderr)
        sys.exit(2)
    sys.exit(ReapWatchValidation(arguments).run())
