#!/usr/bin/env python3
"""Exercise gpureap's MIG support read-only on a GPU whose MIG mode must not change.

    python3 scripts/gpu_mig_readonly.py PATH_TO_GPUREAP [--out DIR]

MIG mode is never changed (no `nvidia-smi -mig`, no NVML setter): this script
only reads. It checks, for every GPU:

- `gpureap --backend nvml status --json` gives `gpus[].mig_mode` as
  `nvidia-smi --query-gpu=mig.mode.current` says it (Disabled: false, Enabled:
  true, [N/A]: null), and `instances` empty where MIG is disabled (the NVML
  calls gpureap makes: nvmlDeviceGetMigMode, then, only with MIG on,
  nvmlDeviceGetMaxMigDeviceCount, nvmlDeviceGetMigDeviceHandleByIndex, the
  instance's memory info, process list and GPU/compute-instance ids);
- `status --gpu GPU-<uuid>` (the GPU by its UUID) shows that GPU, exit 0;
- `status --gpu N:0` on a GPU with MIG disabled exits 2, saying it is not in
  MIG mode; `--gpu MIG-<uuid of no instance>` exits 2, not on this host;
- `reset --gpu N:0` exits 2 before anything is reset (a reset is of whole GPUs);
- `check --gpu GPU-<uuid>` runs (exit 0 or 1, never 2 or 3);
- where pynvml is importable, its own nvmlDeviceGetMigMode agrees (read-only).

It starts no GPU process and signals nothing. It prints one PASS/FAIL line per
check and writes what it measured (commands, exit codes, timings, outputs) to
DIR/mig_readonly.json; exit 1 if any check failed. What stays untested on
hardware is in docs/mig.md.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

FAKE_MIG = "MIG-00000000-0000-0000-0000-000000000000"


def run(argv, timeout=120):
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    except (OSError, subprocess.TimeoutExpired) as error:
        code, stdout, stderr = 127, "", f"{argv[0]}: {error}"
    return {
        "argv": argv,
        "code": code,
        "stdout": stdout,
        "stderr": stderr,
        "seconds": round(time.monotonic() - started, 3),
    }


def smi_modes():
    done = run(["nvidia-smi", "--query-gpu=index,uuid,mig.mode.current", "--format=csv,noheader"])
    modes = {}
    for line in done["stdout"].splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            modes[int(parts[0])] = {"uuid": parts[1], "mode": parts[2]}
    return done, modes


def expected_mode(text):
    return {"Enabled": True, "Disabled": False}.get(text)


def pynvml_modes():
    try:
        import pynvml  # noqa: PLC0415 (optional)
    except ImportError:
        return None
    pynvml.nvmlInit()
    try:
        modes = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
                modes[index] = bool(current)
            except pynvml.NVMLError:
                modes[index] = None
        return modes
    finally:
        pynvml.nvmlShutdown()


def main(argv):
    out = None
    if "--out" in argv:
        at = argv.index("--out")
        out = Path(argv[at + 1])
        del argv[at : at + 2]
    if not argv:
        print(__doc__)
        return 2
    gpureap = str(Path(argv[0]).resolve())
    base = [gpureap, "--backend", "nvml"]
    record = {"runs": [], "checks": []}
    failed = 0

    def check(name, ok, detail=""):
        nonlocal failed
        record["checks"].append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}")
        failed += 0 if ok else 1

    def gp(*args):
        done = run(base + list(args))
        record["runs"].append(done)
        return done

    try:
        smi, modes = smi_modes()
        record["nvidia_smi"] = smi
        check("nvidia-smi reports MIG mode", smi["code"] == 0 and modes, smi["stderr"][-300:])
        status = gp("status", "--json")
        check("status --json exits 0", status["code"] == 0, status["stderr"][-300:])
        document = json.loads(status["stdout"]) if status["stdout"].strip() else {"gpus": []}
        record["status_seconds"] = status["seconds"]
        check("status lists every GPU nvidia-smi lists", modes and len(document.get("gpus", [])) == len(modes))
        for gpu in document.get("gpus", []):
            index = gpu["index"]
            smi_gpu = modes.get(index, {})
            want = expected_mode(smi_gpu.get("mode", ""))
            check(
                f"GPU {index}: mig_mode {gpu.get('mig_mode')} as nvidia-smi's {smi_gpu.get('mode')}",
                gpu.get("mig_mode") == want,
                json.dumps({"gpureap": gpu.get("mig_mode"), "nvidia-smi": smi_gpu}),
            )
            if want is False:
                check(f"GPU {index}: no instances with MIG disabled", gpu.get("instances") == [])
                wrong = gp("status", "--gpu", f"{index}:0")
                check(
                    f"status --gpu {index}:0 exits 2: not in MIG mode",
                    wrong["code"] == 2 and "is not in MIG mode" in wrong["stderr"],
                    wrong["stderr"][-300:],
                )
                refused = gp("reset", "--gpu", f"{index}:0")
                check(
                    f"reset --gpu {index}:0 exits 2: a reset is of whole GPUs",
                    refused["code"] == 2 and "reset resets whole GPUs" in refused["stderr"],
                    refused["stderr"][-300:],
                )
            uuid = gpu.get("uuid")
            if uuid:
                by_uuid = gp("status", "--gpu", uuid, "--json")
                shown = json.loads(by_uuid["stdout"]).get("gpus", []) if by_uuid["code"] == 0 else []
                check(
                    f"status --gpu {uuid} shows GPU {index}",
                    [g["index"] for g in shown] == [index],
                    by_uuid["stderr"][-300:],
                )
                checked = gp("check", "--gpu", uuid)
                check(
                    f"check --gpu {uuid} judges GPU {index} (exit 0 or 1)",
                    checked["code"] in (0, 1),
                    (checked["stdout"] + checked["stderr"])[-300:],
                )
        elsewhere = gp("status", "--gpu", FAKE_MIG)
        check(
            "status --gpu MIG-<not here> exits 2",
            elsewhere["code"] == 2 and "is not on this host" in elsewhere["stderr"],
            elsewhere["stderr"][-300:],
        )
        own = pynvml_modes()
        record["pynvml_modes"] = own
        if own is None:
            print("SKIP pynvml not importable: NVML's MIG mode read through gpureap only")
        else:
            for gpu in document.get("gpus", []):
                check(
                    f"GPU {gpu['index']}: pynvml nvmlDeviceGetMigMode agrees",
                    own.get(gpu["index"]) == gpu.get("mig_mode"),
                )
    finally:
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "mig_readonly.json").write_text(json.dumps(record, indent=2))
    print(f"{'FAIL' if failed else 'PASS'} gpu_mig_readonly: {len(record['checks'])} checks, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
