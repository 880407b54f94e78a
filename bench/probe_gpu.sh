#!/usr/bin/env bash
# Where gpureap's time goes on a real GPU: phase timings (GPUREAP_LOG=debug) for
# status, free --grace 0 on eight CUDA holders, and wait. Starts and kills only
# its own processes. Usage: bench/probe_gpu.sh PATH_TO_GPUREAP
set -u
BIN=${1:-target/release/gpureap}
W=$(mktemp -d)
PY=$(python3 -c 'import sys; print(":".join(p for p in sys.path if p))')
start_holders() {
    rm -f "$W"/ready* "$W"/pids
    for i in 0 1 2 3 4 5 6 7; do
        ( echo $BASHPID >> "$W/pids"; PYTHONPATH=$PY exec -a "sglang::probe_TP$i" python3 scripts/cuda_holder.py hold 2 "$W/ready$i" ) &
    done
    until [ "$(ls "$W"/ready* 2>/dev/null | wc -l)" = 8 ]; do sleep 0.1; done
}
start_holders
echo "== status (x3), then nvidia-smi (x3), then backend none (x3)"
for k in 1 2 3; do /usr/bin/time -f "gpureap status: %e s %M KB" env GPUREAP_LOG=debug "$BIN" status --json >/dev/null; done
for k in 1 2 3; do /usr/bin/time -f "nvidia-smi: %e s %M KB" nvidia-smi --query-compute-apps=pid,used_memory --format=csv >/dev/null; done
for k in 1 2 3; do /usr/bin/time -f "gpureap none: %e s %M KB" "$BIN" --backend none status --json >/dev/null; done
echo "== free --grace 0 on 8 holders"
/usr/bin/time -f "free: %e s %M KB" env GPUREAP_LOG=debug "$BIN" free --match 'sglang::probe_TP' --grace 0 --yes --json > "$W/free.json"
python3 -c "import json; d=json.load(open('$W/free.json')); print('freed_after_ms', [g['freed_after_ms'] for g in d['gpus']], 'exited', [t['exited_after_ms'] for t in d['targets']])"
echo "== wait"
start_holders
GPUREAP_LOG=trace "$BIN" wait --gpu 0 --below 1GiB --timeout 60s > /dev/null 2> "$W/wait.log" &
WAITER=$!
sleep 1
python3 - "$W/pids" <<'PYEOF'
import os, signal, sys, time, pynvml
pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
pids = [int(p) for p in open(sys.argv[1]).read().split()]
t0 = time.perf_counter()
for p in pids: os.kill(p, signal.SIGKILL)
while pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used > (1 << 30): pass
print(f"probe: memory back {1000*(time.perf_counter()-t0):.1f} ms after the kill (NVML busy poll)", flush=True)
PYEOF
wait $WAITER
grep -E "wait poll" "$W/wait.log" | tail -4
tail -2 "$W/wait.log"
