#!/usr/bin/env bash
# Starts one vLLM server (our own child, in its own process group), waits for its KV cache lines
# or its exit, keeps its log ($OUT/vllm-NAME.log) and nvidia-smi's figures, then ends exactly
# that group. The ground truth of docs/gpu-validation/history.md's vLLM table came from these runs.
#
#   OUT=DIR scripts/gpu_plan_vllm/serve_once.sh NAME TIMEOUT_S -- <api_server arguments>
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT"
name=$1; to=$2; shift 3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
log=$OUT/vllm-$name.log
nvidia-smi --query-gpu=memory.total,memory.used,memory.free --format=csv,noheader,nounits > $OUT/smi-$name-before.txt
setsid python3 -m vllm.entrypoints.openai.api_server "$@" > $log 2>&1 &
pid=$!
end=$((SECONDS+to))
while kill -0 $pid 2>/dev/null && [ $SECONDS -lt $end ]; do
  if grep -q -E "Maximum concurrency|Application startup complete|Starting vLLM API server" $log; then
    nvidia-smi --query-gpu=memory.total,memory.used,memory.free --format=csv,noheader,nounits > $OUT/smi-$name-running.txt
    break
  fi
  sleep 1
done
kill -TERM -- -$pid 2>/dev/null; for i in $(seq 1 10); do kill -0 $pid 2>/dev/null || break; sleep 1; done
kill -KILL -- -$pid 2>/dev/null; wait $pid 2>/dev/null
echo "== $name rc=$? after $SECONDS s"; grep -E "Model loading took|Available KV cache memory|GPU KV cache size|Maximum concurrency|Free memory on device|Error|block_size|Using .* backend" $log | head -20
