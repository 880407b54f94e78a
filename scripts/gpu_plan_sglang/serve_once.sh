#!/usr/bin/env bash
# Starts one SGLang server on GPU 0 (our own child, in a session of its own), waits until it logs
# that it is ready, or exits, or TIMEOUT_S passes, keeps its whole log ($OUT/NAME.log, SGLang's
# default --log-level info carries every memory line) and nvidia-smi's figures before, at the KV
# allocation, at the end and after, then ends exactly that session (SIGTERM to its process group
# and to each process of its session, SIGKILL to what is left after 20 s) and waits up to 60 s for
# GPU 0's used memory to come back to where it was. Needs the set under /tmp/sglsite (setup.sh).
# Exit 0 only when the server got ready and the memory came back.
#
#   OUT=DIR scripts/gpu_plan_sglang/serve_once.sh NAME TIMEOUT_S -- <sglang.launch_server arguments>
set -u
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT"
name=$1; to=$2; shift 3
export PYTHONPATH=/tmp/sglsite PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# SGLang's JIT kernels (tvm-ffi, built with nvcc at first use) land here; it lasts while the
# machine stays warm, so only the first start of a kind pays for the build.
export TVM_FFI_CACHE_DIR=${TVM_FFI_CACHE_DIR:-/tmp/sgl-jit-cache}
log=$OUT/$name.log
smi() { nvidia-smi --query-gpu=memory.total,memory.used,memory.free --format=csv,noheader,nounits -i 0; }
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0; }
smi > "$OUT/$name-smi-before.txt"; base=$(used)
printf '%q ' python3 -m sglang.launch_server "$@" > "$OUT/$name-command.txt"; echo >> "$OUT/$name-command.txt"
: > "$log"
setsid python3 -m sglang.launch_server "$@" >> "$log" 2>&1 &
pid=$!
sid=$(ps -o sid= -p $pid | tr -d ' ')
[ "$sid" = "$pid" ] || echo "note: server pid $pid is in session ${sid:-?}, not its own" | tee -a "$OUT/$name-stop.txt"
t0=$SECONDS; end=$((SECONDS + to)); kv=; state=timeout
while :; do
    if grep -q "The server is fired up and ready to roll" "$log"; then state=ready; break; fi
    if ! kill -0 $pid 2>/dev/null; then state=exited; break; fi
    if [ $SECONDS -ge $end ]; then state=timeout; break; fi
    if [ -z "$kv" ] && grep -q "KV Cache is allocated" "$log"; then smi > "$OUT/$name-smi-kv.txt"; kv=1; fi
    sleep 1
done
took=$((SECONDS - t0))
smi > "$OUT/$name-smi-$state.txt"
# Only what this script started: the process group and session that setsid made for $pid.
members() { [ "$sid" = "$pid" ] && ps -e -o pid=,sid= | awk -v s="$pid" '$2 == s {print $1}'; }
{ echo "at stop:"; ps -o pid,pgid,sid,etimes,args -s "$pid" 2>/dev/null | cut -c1-200; } >> "$OUT/$name-stop.txt"
kill -TERM -- -$pid 2>/dev/null; for p in $(members); do kill -TERM "$p" 2>/dev/null; done
for _ in $(seq 1 20); do [ -z "$(members)" ] && ! kill -0 $pid 2>/dev/null && break; sleep 1; done
left=$(members | tr '\n' ' ')
[ -n "$left" ] && echo "SIGKILL after 20 s: $left" >> "$OUT/$name-stop.txt"
kill -KILL -- -$pid 2>/dev/null; for p in $left; do kill -KILL "$p" 2>/dev/null; done
wait $pid 2>/dev/null; rc=$?
back=no
for _ in $(seq 1 60); do [ "$(used)" -le $((base + 256)) ] && { back=yes; break; }; sleep 1; done
smi > "$OUT/$name-smi-after.txt"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/$name-apps-after.txt" 2>&1
# The JIT builds, for carrying to a fresh machine as .sgl/jit/sgl-jit-cache.tgz (setup.sh unpacks it).
[ -d "$TVM_FFI_CACHE_DIR" ] && tar czf "$OUT/sgl-jit-cache.tgz" -C "$(dirname "$TVM_FFI_CACHE_DIR")" "$(basename "$TVM_FFI_CACHE_DIR")"
echo "== $name: $state after $took s (server exit $rc); GPU 0 used ${base} MiB before, $(used) MiB after: memory back=$back"
grep -E "Load weight begin|Load weight end|KV Cache is allocated|Memory pool end|max_total_num_tokens=|Capture .* end|fired up|Traceback|Error|error:" "$log" | cut -c1-300 | head -24
[ $state = ready ] && [ $back = yes ]
