#!/usr/bin/env python3
"""Check `gpureap run` on a real GPU: a fake SGLang server whose workers hold
CUDA memory stalls after "Load weight end" on its first start; gpureap must
detect the hang, write a bundle, free the workers' GPU memory (checked through
NVML), restart, see it ready, and stop it cleanly on SIGTERM.

    python3 scripts/gpu_run_validate.py [PATH_TO_GPUREAP] [--out DIR]

Needs an NVIDIA GPU, python3 with PyTorch, and pynvml (nvidia-ml-py). Signals
only the gpureap it started (everything else is gpureap's to stop). Prints
gpureap's events, PASS/FAIL lines and `N passed, M failed`; exit 1 on failure.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pynvml

HERE = Path(__file__).resolve().parent
FAKE = HERE.parent / "tests" / "fake_sglang.py"
GIB = 1 << 30

args = sys.argv[1:]
OUT = None
if "--out" in args:
    OUT = Path(args.pop(args.index("--out") + 1))
    args.remove("--out")
BIN = str(Path(args[0]).resolve()) if args else str(HERE.parent / "target/release/gpureap")
RESULTS = []


def check(name, passed, detail=""):
    RESULTS.append(bool(passed))
    print(f"{'PASS' if passed else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def used_gib():
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    return info.used / GIB, pids


def main():
    pynvml.nvmlInit()
    before, listed = used_gib()
    print(f"date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))}; "
          f"driver {pynvml.nvmlSystemGetDriverVersion()}; before: {before:.2f} GiB used, {len(listed)} process(es)", flush=True)
    if listed:
        print(f"refusing to run: NVML lists processes this script did not start: {listed}")
        return 2
    work = Path(tempfile.mkdtemp(prefix="gpureap-run-validate-"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    python_path = os.pathsep.join(path for path in sys.path if path)
    command = [
        BIN, "run", "--ready-url", f"http://127.0.0.1:{port}/health", "--stall-timeout", "20s",
        "--startup-timeout", "5m", "--grace", "5s", "--backoff", "1s", "--state-dir", str(work / "state"),
        "--log", str(work / "server.log"), "--",
        "python3", str(FAKE), "--port", str(port), "--tp", "2", "--cuda", "--gib", "4",
        "--fault", "stall", "--fault-once", str(work / "fault-once"), "--sim", str(work),
    ]
    print("$ " + " ".join(command), flush=True)
    started = time.monotonic()
    gpureap = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=python_path))
    events = []

    def collect():
        for line in gpureap.stderr:
            stamp = time.monotonic() - started
            events.append((stamp, line.rstrip()))
            print(f"[{stamp:6.1f}s] {line.rstrip()}", flush=True)

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()

    def wait_for(text, nth=1, timeout=240):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for _, line in events if text in line]
            if len(found) >= nth:
                return found[nth - 1]
            time.sleep(0.05)
        return None

    hang = None
    try:
        hang = wait_for("hang: no log output")
        bundle = wait_for("diagnostic bundle:")
        freed = wait_for("GPU 0: freed")
        after_free, pids_after_free = used_gib()
        second_ready = wait_for("ready after", 1)
        check("hang detected after the stall", hang is not None and "stalled at log line" in hang, hang or "none")
        check("diagnostic bundle written", bundle is not None, bundle or "none")
        if bundle:
            path = Path(bundle.rsplit(": ", 1)[1])
            data = json.loads((path / "bundle.json").read_text())
            workers = [m for m in data["members"] if (m.get("cmdline") or "").startswith("sglang::scheduler_TP")]
            check("bundle: both stalled workers with state and CPU use",
                  len(workers) == 2 and all(m["state"] in ("S", "R", "D") and m["cpu_percent"] is not None for m in workers),
                  ", ".join(f"{m['pid']} {m['state']} {m['cpu_percent']:.0f}% wchan {m['wchan']}" for m in workers if m["cpu_percent"] is not None))
            check("bundle: GPU state from NVML shows the workers' memory",
                  (data["gpu"]["gpus"][0]["memory_used"] or 0) >= 8 * GIB,
                  f"{(data['gpu']['gpus'][0]['memory_used'] or 0) / GIB:.2f} GiB used at the hang")
            check("bundle: last log line is 'Load weight end'", any("Load weight end" in line for line in data["log_tail"][-3:]),
                  data["log_tail"][-1] if data["log_tail"] else "empty")
        check("GPU memory freed and verified through NVML", freed is not None and after_free < before + 0.5,
              f"{freed}; NVML now {after_free:.2f} GiB used, processes {pids_after_free}")
        check("restarted and ready", second_ready is not None, second_ready or "none")
        time.sleep(2)
        running, running_pids = used_gib()
        check("the restarted server holds the GPU again", running >= 8 and len(running_pids) == 2,
              f"{running:.2f} GiB used by {running_pids}")
        stop_at = time.monotonic()
        gpureap.send_signal(signal.SIGTERM)
        code = gpureap.wait(timeout=120)
        reader.join(timeout=5)
        final, final_pids = used_gib()
        check("SIGTERM: clean stop, exit 0, nothing left", code == 0 and wait_for("nothing left behind", 2, 1) is not None,
              f"exit {code} after {time.monotonic() - stop_at:.1f}s")
        check("NVML: memory back, no process listed", final < before + 0.5 and not final_pids, f"{final:.2f} GiB, {final_pids}")
    finally:
        if gpureap.poll() is None:
            gpureap.send_signal(signal.SIGTERM)
            try:
                gpureap.wait(timeout=60)
            except subprocess.TimeoutExpired:
                gpureap.kill()
        if OUT:
            (OUT / "run-events.txt").write_text("\n".join(f"[{t:6.1f}s] {line}" for t, line in events) + "\n")
            if (work / "server.log").exists():
                (OUT / "run-server.log").write_text((work / "server.log").read_text())
    passed = sum(RESULTS)
    print(f"\n{passed} passed, {len(RESULTS) - passed} failed")
    return 0 if passed == len(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
