#!/usr/bin/env bash
# Each GPU's activity and reserved memory as `gpureap status --json` reads them through NVML,
# against nvidia-smi's on the same host, one look each (issue 41, item 12 and "Also"):
# utilization only in 0..100 (it moves between the two looks), temperature within 3 °C,
# power draw within 15%, power limit within 1 W, reserved memory within 1 MiB. A figure
# nvidia-smi gives as [N/A] or [Not Supported] must be null in gpureap's JSON (never 0).
#
#   scripts/gpu_figures_validate.sh PATH_TO_GPUREAP
#
# Prints a PASS or FAIL line per GPU and figure; exits non-zero on a FAIL or an error.
# Starts nothing and changes nothing on the host.
set -euo pipefail
BIN=$(realpath "${1:?usage: scripts/gpu_figures_validate.sh PATH_TO_GPUREAP}")
SMI=$(nvidia-smi --query-gpu=index,utilization.gpu,temperature.gpu,power.draw,power.limit,memory.reserved \
    --format=csv,noheader,nounits)
STATUS=$("$BIN" --backend nvml status --json || true)
python3 - "$SMI" "$STATUS" <<'EOF'
import json, sys
smi, status = sys.argv[1], json.loads(sys.argv[2])
gpus = {gpu["index"]: gpu for gpu in status["gpus"]}
failed = False

def number(text):
    try:
        return float(text)
    except ValueError:
        return None  # [N/A], [Not Supported]

def check(index, what, ours, theirs, close):
    global failed
    if theirs is None:
        ok, why = ours is None, "nvidia-smi gives none: null expected"
    elif ours is None:
        ok, why = False, "gpureap says null"
    else:
        ok, why = close(ours, theirs), ""
    failed |= not ok
    print(f"{'PASS' if ok else 'FAIL'} GPU {index} {what}: gpureap {ours}, nvidia-smi {theirs} {why}".rstrip())

for line in smi.strip().splitlines():
    index, utilization, temperature, power, limit, reserved = (f.strip() for f in line.split(","))
    gpu = gpus.get(int(index))
    if gpu is None:
        print(f"FAIL GPU {index}: not in gpureap's status")
        failed = True
        continue
    mib = gpu["memory_reserved"] / 2**20 if gpu["memory_reserved"] is not None else None
    check(index, "utilization %", gpu["utilization_percent"], number(utilization),
          lambda ours, _: 0 <= ours <= 100)
    check(index, "temperature °C", gpu["temperature_celsius"], number(temperature),
          lambda ours, theirs: abs(ours - theirs) <= 3)
    check(index, "power draw W", gpu["power_draw_watts"], number(power),
          lambda ours, theirs: abs(ours - theirs) <= 0.15 * max(theirs, 1))
    check(index, "power limit W", gpu["power_limit_watts"], number(limit),
          lambda ours, theirs: abs(ours - theirs) <= 1)
    check(index, "reserved MiB", mib, number(reserved), lambda ours, theirs: abs(ours - theirs) <= 1)
sys.exit(1 if failed else 0)
EOF
