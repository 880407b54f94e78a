#!/usr/bin/env bash
# Where the peak memory of `gpureap status` and of nvidia-smi goes on a GPU
# host, and how long each phase of `status` takes (issue 28, items 1 and 2).
# With one CUDA holder of its own on GPU 0 (scripts/cuda_holder.py), five runs
# of each command through bench/rss_at_exit.so (LD_PRELOAD; its line per run:
# VmHWM, RssAnon, RssFile and the resident KiB of each mapping) and GNU time;
# gpureap's runs with GPUREAP_LOG=debug (phase timings on stderr).
# Starts and ends only its own processes.
#
#   cc -O2 -shared -fPIC -o .dev/rss_at_exit.so bench/rss_at_exit.c
#   bench/probe_memory.sh .dev/gpureap .dev/rss_at_exit.so OUT_DIR [OTHER_BUILD]
#
# CROWD=N in the environment starts bench/crowd.py's N idle processes first.
# Also measured: `gpureap --version` (start-up and exit alone) and NVML's own
# start (nvmlInit through pynvml, where Python has it).
set -u
BIN=$1
SHIM=$(realpath "$2")
OUT=$3
OTHER=${4:-}
mkdir -p "$OUT"
W=$(mktemp -d)
PY=$(python3 -c 'import sys; print(":".join(p for p in sys.path if p))')
HOLDER=
CROWDER=
cleanup() {
    [ -n "$HOLDER" ] && kill "$HOLDER" 2>/dev/null && wait "$HOLDER" 2>/dev/null
    [ -n "$CROWDER" ] && kill "$CROWDER" 2>/dev/null && wait "$CROWDER" 2>/dev/null
    rm -rf "$W"
}
trap cleanup EXIT
( PYTHONPATH=$PY exec -a "sglang::probe_TP0" python3 scripts/cuda_holder.py hold 2 "$W/ready" ) &
HOLDER=$!
until [ -e "$W/ready" ]; do
    kill -0 "$HOLDER" 2>/dev/null || { echo "FAIL: the CUDA holder did not start"; exit 1; }
    sleep 0.1
done
measure() {
    local label=$1
    shift
    for k in 1 2 3 4 5; do
        RSS_AT_EXIT_FILE="$OUT/rss-$label.txt" LD_PRELOAD=$SHIM \
            /usr/bin/time -a -o "$OUT/time-$label.txt" -f "%e s %U u %S s %M KB" \
            "$@" > "$OUT/stdout-$label.txt" 2>> "$OUT/stderr-$label.txt"
    done
}
if [ -n "${CROWD:-}" ]; then
    python3 bench/crowd.py "$CROWD" "$W/crowd" &
    CROWDER=$!
    until [ -e "$W/crowd" ]; do
        kill -0 "$CROWDER" 2>/dev/null || { echo "FAIL: the crowd did not start"; exit 1; }
        sleep 0.2
    done
fi
echo "processes on the host: $(ls /proc | grep -c '^[0-9]')" | tee "$OUT/host.txt"
for k in 1 2 3 4 5; do
    /usr/bin/time -a -o "$OUT/time-version.txt" -f "%e s %U u %S s %M KB" "$BIN" --version > /dev/null
done
python3 - > "$OUT/nvml-init.txt" 2>&1 <<'PYEOF'
import time
t0 = time.perf_counter()
import pynvml
t1 = time.perf_counter()
pynvml.nvmlInit()
t2 = time.perf_counter()
pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))
t3 = time.perf_counter()
print(f"pynvml import {1e3*(t1-t0):.1f} ms, nvmlInit {1e3*(t2-t1):.1f} ms, first process list {1e3*(t3-t2):.1f} ms")
PYEOF
measure smi nvidia-smi --query-compute-apps=pid,used_memory --format=csv
measure status env GPUREAP_LOG=debug "$BIN" status --json
measure monitors env GPUREAP_LOG=debug "$BIN" status --json --monitors
measure none "$BIN" --backend none status --json
[ -n "$OTHER" ] && measure other "$OTHER" status --json
for f in "$OUT"/time-*.txt; do echo "== $(basename "$f")"; cat "$f"; done
for f in "$OUT"/rss-*.txt; do echo "== $(basename "$f")"; cut -c1-400 "$f"; done
grep -h "descriptors read" "$OUT"/stderr-status.txt | head -2
grep -h "snapshot\|driver opened" "$OUT"/stderr-status.txt | head -4
