#!/usr/bin/env python3
"""Check `gpureap run` on real GPUs: a fake SGLang server whose workers hold
CUDA memory, one tensor-parallel rank per GPU, stalls after "Load weight end"
on its first start; gpureap must detect the hang, write a bundle, free every
GPU the workers held (checked through NVML, GPU by GPU), restart, see it ready,
and stop it cleanly on SIGTERM.

    python3 scripts/gpu_run_validate.py [PATH_TO_GPUREAP] [--gpu LIST] [--out DIR]

Needs NVIDIA GPUs, python3 with PyTorch, and pynvml (nvidia-ml-py). Uses every
GPU no other process uses (or --gpu LIST): max(2, GPUs) ranks, rank r on GPU
r mod GPUs (on one GPU both ranks share it, and the checks that need two GPUs
say SKIP). Signals only the gpureap it started, and, should that gpureap not
stop, the processes of this run left behind (each known by PID and start time,
found through a tag in their environment). Prints gpureap's events,
PASS/FAIL/SKIP lines and `N passed, M failed, K skipped`; exit 1 on failure,
2 if it could not start. With --out DIR it writes its log (run-validate.log),
gpureap's events with timestamps (run-events.txt), the server's log
(run-server.log), the bundle (run-bundle.json) and gpureap status outputs.
"""

import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import gpuval as gv

HERE = Path(__file__).resolve().parent
FAKE = HERE.parent / "tests" / "fake_sglang.py"
GIB = gv.GIB
GIB_PER_WORKER = 4


def rank_of(pid):
    return gv.rank_in(gv.cmdline(pid))


def main():
    args = gv.parse_args(sys.argv[1:], __doc__.splitlines()[0])
    r = gv.Report(args.out, "run-validate.log")
    tag = gv.new_tag()
    work = Path(tempfile.mkdtemp(prefix=f"gpureap-run-{tag}-"))
    procs = gv.Processes(work / "pids", tag)
    backend = gv.backend()
    nvml = gv.Nvml(gv.load_pynvml())
    version = subprocess.run([args.binary, "--version"], stdout=subprocess.PIPE, text=True).stdout.strip()
    r.log(f"date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {version}; driver {nvml.driver()}; NVML reports {nvml.count} GPU(s); "
          f"backend {backend}; run tag {tag}; work dir {work}")
    busy = {}
    for index in range(nvml.count):
        listed = nvml.processes(index, graphics=True)
        busy[index] = sorted(listed)
        r.log(f"  GPU {index}: {nvml.name(index)}, {nvml.memory(index).used / GIB:.2f} GiB used, {len(listed)} process(es)")
    gpus = gv.usable_gpus(r.log, nvml.count, args.gpu, busy)
    if not gpus:
        return 2
    tp = max(2, len(gpus))
    place = {rank: gv.spread(gpus, rank) for rank in range(tp)}
    per_gpu = {gpu: sum(1 for g in place.values() if g == gpu) for gpu in gpus}
    r.log(f"using GPU(s) {gpus}: {tp} ranks, " + ", ".join(f"TP{rank} on GPU {gpu}" for rank, gpu in place.items()))
    baseline = nvml.snapshot(gpus)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        args.binary, "--backend", backend, "run", "--ready-url", f"http://127.0.0.1:{port}/health", "--stall-timeout", "20s",
        "--startup-timeout", "5m", "--grace", "5s", "--backoff", "1s", "--state-dir", str(work / "state"),
        "--log", str(work / "server.log"), "--",
        "python3", str(FAKE), "--port", str(port), "--tp", str(tp), "--cuda", "--gib", str(GIB_PER_WORKER),
        "--devices", ",".join(map(str, gpus)), "--fault", "stall", "--fault-once", str(work / "fault-once"), "--sim", str(work),
    ]
    r.log("$ " + " ".join(command))
    started = time.monotonic()
    events = []

    def ended():
        """gpureap has exited and all it said is read: nothing more will come."""
        return gpureap.poll() is not None and not reader.is_alive()

    def wait_for(text, nth=1, timeout=240):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for _, line in events if text in line]
            if len(found) >= nth:
                return found[nth - 1]
            if ended():
                break
            time.sleep(0.05)
        return None

    def wait_freed(nth, timeout=120):
        """gpureap's nth 'GPU g: freed' line for each GPU used: {gpu: line or None}."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [line for _, line in events]
            found = {gpu: (gv.freed_lines(lines, gpu)[nth - 1:nth] or [None])[0] for gpu in gpus}
            if all(found.values()) or time.monotonic() > deadline or ended():
                return found
            time.sleep(0.05)

    def nvml_clear():
        """Problems with NVML's view now: each GPU used back to its baseline (+0.5 GiB), no process listed."""
        now = nvml.snapshot(gpus)
        problems = [f"GPU {gpu}: {used / GIB:.2f} GiB used (was {baseline[gpu][0] / GIB:.2f}), processes {sorted(listed)}"
                    for gpu, (used, listed) in now.items() if used > baseline[gpu][0] + GIB // 2 or listed]
        summary = "; ".join(f"GPU {gpu}: {used / GIB:.2f} GiB, processes {sorted(listed)}" for gpu, (used, listed) in now.items())
        return problems, summary

    def workers_now():
        """{pid: rank} of the fake workers NVML lists on the GPUs used."""
        now = nvml.snapshot(gpus)
        pids = {pid for _, listed in now.values() for pid in listed}
        return {pid: rank_of(pid) for pid in pids if rank_of(pid) is not None}, now

    gpureap = procs.popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=gv.child_env(tag))

    def collect():
        for line in gpureap.stderr:
            stamp = time.monotonic() - started
            events.append((stamp, line.rstrip()))
            r.log(f"[{stamp:6.1f}s] {line.rstrip()}")

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    try:
        # The stall is seen 20 s after the last line; starting takes a few seconds more.
        hang = wait_for("hang: no log output", timeout=120)
        bundle = wait_for("diagnostic bundle:", timeout=10 if hang else 1)
        freed = wait_freed(1, timeout=60 if hang else 1)
        left = wait_for("nothing left behind", 1, 30 if hang else 1)
        clear_problems, clear_summary = nvml_clear()
        second_ready = wait_for("ready after", 1, timeout=120 if hang else 1)
        r.check("hang detected after the stall", hang is not None and "stalled at log line" in hang, hang or "none")
        r.check("diagnostic bundle written", bundle is not None, bundle or "none")
        if bundle:
            path = Path(bundle.rsplit(": ", 1)[1])
            raw = (path / "bundle.json").read_text()
            r.save("run-bundle.json", raw)
            data = json.loads(raw)
            workers = {m["pid"]: m for m in data["members"] if gv.rank_in(m.get("cmdline")) is not None}
            r.check(f"bundle: all {tp} stalled workers with state and CPU use",
                    len(workers) == tp and all(m["state"] in ("S", "R", "D") and m["cpu_percent"] is not None for m in workers.values()),
                    ", ".join(f"{m['pid']} {m['state']} {m['cpu_percent']:.0f}% wchan {m['wchan']}" for m in workers.values() if m["cpu_percent"] is not None))
            status = data["gpu"]
            memory = {gpu: (gv.gpu_row(status, gpu) or {}).get("memory_used") or 0 for gpu in gpus}
            r.check("bundle: GPU state from NVML shows each GPU's workers' memory",
                    all(memory[gpu] >= per_gpu[gpu] * GIB_PER_WORKER * GIB for gpu in gpus),
                    "; ".join(f"GPU {gpu}: {memory[gpu] / GIB:.2f} GiB used at the hang ({per_gpu[gpu]} worker(s))" for gpu in gpus))
            expected = {pid: place[gv.rank_in(m["cmdline"])] for pid, m in workers.items()}
            wrong = {pid: gv.listed_by_driver_on(status, pid) for pid, gpu in expected.items() if gv.listed_by_driver_on(status, pid) != [gpu]}
            r.check("bundle: each worker listed by the driver under its own GPU only", expected and not wrong,
                    ", ".join(f"{pid} on GPU {gpu}" for pid, gpu in expected.items()) if not wrong else f"{wrong}, expected {expected}")
            r.check("bundle: last log line is 'Load weight end'", any("Load weight end" in line for line in data["log_tail"][-3:]),
                    data["log_tail"][-1] if data["log_tail"] else "empty")
        r.check("hang: every GPU the workers held is freed (a 'GPU N: freed' line for each)", all(freed.values()),
                "; ".join(f"GPU {gpu}: {line}" for gpu, line in freed.items()))
        r.check("hang: nothing left behind, and NVML shows each GPU back, no process listed", left is not None and not clear_problems,
                clear_summary if not clear_problems else "; ".join(clear_problems))
        r.check("restarted and ready", second_ready is not None, second_ready or "none")
        deadline = time.monotonic() + 20
        while True:
            ranks, running = workers_now()
            if len(ranks) >= tp or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        expected = {pid: place[rank] for pid, rank in ranks.items()}
        wrong = gv.placement_problems(running, expected)
        r.check(f"the restarted server holds the GPUs again: {tp} workers, each listed by NVML on its own GPU only",
                sorted(ranks.values()) == list(range(tp)) and not wrong
                and all(running[gpu][0] >= per_gpu[gpu] * GIB_PER_WORKER * GIB for gpu in gpus),
                "; ".join(f"GPU {gpu}: {running[gpu][0] / GIB:.2f} GiB used by {sorted(running[gpu][1])}" for gpu in gpus)
                + (f"; wrong GPU: {wrong}" if wrong else ""))
        if len(gpus) >= 2:
            r.check("the workers are spread over the GPUs (one rank per GPU)",
                    len({gpu for gpu in expected.values()}) == len(gpus), str({pid: f"GPU {gpu}" for pid, gpu in expected.items()}))
        else:
            r.skip("the workers are spread over the GPUs (one rank per GPU)", f"needs 2 GPUs, using {gpus}")
        done = subprocess.run([args.binary, "--backend", backend, "status", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        r.save("run-status.json", done.stdout)
        try:
            status = json.loads(done.stdout)
        except json.JSONDecodeError:
            status = {}
        problems = gv.status_placement_problems(status, nvml.snapshot(gpus), expected)
        r.check("status: each worker under its own GPU only, with NVML's memory (within 256 MiB)", expected and not problems,
                gv.describe_placement(status, expected) if not problems else str(problems))
        r.check("status flags the workers supervised", expected and all("supervised" in gv.holder(status, pid).get("flags", []) for pid in expected),
                str({pid: gv.holder(status, pid).get("flags") for pid in expected}))

        stop_at = time.monotonic()
        gpureap.send_signal(signal.SIGTERM)
        code = gpureap.wait(timeout=120)
        reader.join(timeout=5)
        stopped = wait_freed(2, timeout=1)
        final_problems, final_summary = nvml_clear()
        r.check("SIGTERM: clean stop, exit 0, nothing left, each GPU freed",
                code == 0 and wait_for("nothing left behind", 2, 1) is not None and all(stopped.values()),
                f"exit {code} after {time.monotonic() - stop_at:.1f}s; " + "; ".join(f"GPU {gpu}: {line}" for gpu, line in stopped.items()))
        r.check("NVML: each GPU back, no process listed", not final_problems, final_summary if not final_problems else "; ".join(final_problems))
    except Exception as error:
        r.log(traceback.format_exc())
        r.check("the run validation ran to the end", False, f"{type(error).__name__}: {error}")
    finally:
        if gpureap.poll() is None:
            gpureap.send_signal(signal.SIGTERM)
            try:
                gpureap.wait(timeout=60)
            except subprocess.TimeoutExpired:
                gpureap.kill()
                gpureap.wait()
        # Should gpureap not have stopped its server, what is left of this run.
        killed = procs.kill_all()
        if killed:
            r.log(f"cleanup: SIGKILLed {len(killed)} process(es) of this run still running: {killed}")
        r.save("run-events.txt", "\n".join(f"[{t:6.1f}s] {line}" for t, line in events) + "\n")
        if (work / "server.log").exists():
            r.save("run-server.log", (work / "server.log").read_text(errors="replace"))
    line, failed, code = r.summary()
    r.log(f"\ntotal {time.monotonic() - started:.0f} s")
    if failed:
        r.log("failed: " + "; ".join(failed))
    r.log(line)
    r.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
