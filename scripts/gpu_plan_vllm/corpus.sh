#!/usr/bin/env bash
# The corpus of real vLLM 0.26.0 starts (tests/fixtures/logs/corpus.json, issue 43 item 6): each
# case starts the API server for real on GPU 0 with dummy weights from a fixture's config.json,
# keeps its whole log (VLLM_LOGGING_LEVEL=DEBUG) and nvidia-smi's memory before, while running
# and after, and runs `gpureap plan` on the same GPU state: before the start (a priori) and after
# it (with `--weights` set to what vLLM logged it loaded). A holder case starts a PyTorch process
# holding N GiB first and keeps it through the plans. Needs vLLM under /tmp/site (setup.sh).
# Only what this script started is signalled: the server's own session (setsid), the holder by PID.
#
#   OUT=DIR scripts/gpu_plan_vllm/corpus.sh GPUREAP MODELS_DIR SECONDS CASE...
#   OUT=DIR scripts/gpu_plan_vllm/corpus.sh GPUREAP MODELS_DIR SECONDS @QUEUE_FILE
#
# SECONDS bounds the whole batch: a case that could not finish inside it is left for later and
# said so. With @QUEUE_FILE the cases are read from that file (one a line) and those done are
# taken out of it, so that consecutive calls on one warm machine work through one list. What
# this call ran lands in $OUT/corpus-HHMMSS.tgz (re-made after each case, so a batch cut short
# still brings back what it did), with a summary per case on stdout.
set -u
G=$(realpath "$1"); M=$(realpath "$2"); budget=$3; shift 3
root=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT"
W=/tmp/corpus; mkdir -p "$W"
end=$((SECONDS + budget))
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_LOGGING_LEVEL=DEBUG
API=(python3 -m vllm.entrypoints.openai.api_server)
COMMON=(--load-format dummy --skip-tokenizer-init)

# NAME -> "HOLDER_GIB MODEL SECONDS_NEEDED ARGS...": SECONDS_NEEDED is what the start is given.
spec() {
    case $1 in
    llama-u09) echo "0 llama-3.1-8b 200 --max-model-len 8192 --gpu-memory-utilization 0.9" ;;
    llama-u07) echo "0 llama-3.1-8b 150 --max-model-len 8192 --gpu-memory-utilization 0.7" ;;
    llama-u05) echo "0 llama-3.1-8b 150 --max-model-len 8192 --gpu-memory-utilization 0.5" ;;
    llama-u09-eager) echo "0 llama-3.1-8b 100 --max-model-len 8192 --gpu-memory-utilization 0.9 --enforce-eager" ;;
    llama-u09-fp8kv) echo "0 llama-3.1-8b 200 --max-model-len 8192 --gpu-memory-utilization 0.9 --kv-cache-dtype fp8" ;;
    llama-len2048-eager) echo "0 llama-3.1-8b 100 --max-model-len 2048 --gpu-memory-utilization 0.9 --enforce-eager" ;;
    llama-len131072-eager) echo "0 llama-3.1-8b 100 --max-model-len 131072 --gpu-memory-utilization 0.9 --enforce-eager" ;;
    llama-u05-hold36) echo "36 llama-3.1-8b 100 --max-model-len 8192 --gpu-memory-utilization 0.5 --enforce-eager" ;;
    llama-u05-hold41) echo "41 llama-3.1-8b 100 --max-model-len 8192 --gpu-memory-utilization 0.5 --enforce-eager" ;;
    qwen3-4b) echo "0 qwen3-4b 200 --max-model-len 8192 --gpu-memory-utilization 0.9" ;;
    qwen3-4b-eager) echo "0 qwen3-4b 100 --max-model-len 8192 --gpu-memory-utilization 0.9 --enforce-eager" ;;
    olmoe-eager) echo "0 olmoe-1b-7b 120 --max-model-len 4096 --gpu-memory-utilization 0.9 --enforce-eager" ;;
    qwen3-30b-a3b-eager) echo "0 qwen3-30b-a3b 150 --max-model-len 8192 --gpu-memory-utilization 0.9 --enforce-eager" ;;
    dsv2-lite-eager) echo "0 deepseek-v2-lite 120 --max-model-len 8192 --gpu-memory-utilization 0.9 --enforce-eager" ;;
    gemma3-1b-eager) echo "0 gemma-3-1b-it 100 --max-model-len 8192 --gpu-memory-utilization 0.9 --enforce-eager" ;;
    gemma3-1b-len32768-eager) echo "0 gemma-3-1b-it 100 --max-model-len 32768 --gpu-memory-utilization 0.9 --enforce-eager" ;;
    qwen3-next-12l-eager) echo "0 qwen3-next-80b-a3b-12l 180 --max-model-len 8192 --gpu-memory-utilization 0.9 --enforce-eager" ;;
    qwen3-next-12l-eager-gdn-triton) echo "0 qwen3-next-80b-a3b-12l 180 --max-model-len 8192 --gpu-memory-utilization 0.9 --enforce-eager --gdn-prefill-backend triton" ;;
    qwen3-30b-a3b) echo "0 qwen3-30b-a3b 240 --max-model-len 8192 --gpu-memory-utilization 0.9" ;;
    *) return 1 ;;
    esac
}
smi() { nvidia-smi --query-gpu=name,driver_version,memory.total,memory.reserved,memory.used,memory.free --format=csv,noheader,nounits -i 0; }
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0; }
# Waits up to $2 s for GPU 0's used memory to fall to $1 MiB or less.
until_used() { local lim=$((SECONDS + $2)); until [ "$(used)" -le "$1" ]; do [ $SECONDS -ge $lim ] && return 1; sleep 0.3; done; }
stamp=$(date +%H%M%S)
done_here=(gpureap-version.txt "smi-$stamp.txt" "nvidia-smi-$stamp.txt")
pack() { tar czf "$OUT/corpus-$stamp.tgz.partial" -C "$W" "${done_here[@]}" && mv "$OUT/corpus-$stamp.tgz.partial" "$OUT/corpus-$stamp.tgz"; }

queue=
if [ "${1#@}" != "$1" ]; then queue=${1#@}; set -- $(cat "$queue"); fi
port=$((18000 + 10#$(date +%S) * 20))
"$G" --version > "$W/gpureap-version.txt"; smi > "$W/smi-$stamp.txt"; nvidia-smi > "$W/nvidia-smi-$stamp.txt" 2>&1
for name in "$@"; do
    port=$((port + 1))
    line=$(spec "$name") || { echo "== $name: unknown case"; continue; }
    read -r hold model need args <<<"$line"
    if [ $((SECONDS + need + 25)) -gt $end ]; then echo "== $name: LEFT FOR LATER, $((end - SECONDS)) s left of the batch"; continue; fi
    d=$W/$name; mkdir -p "$d"
    # shellcheck disable=SC2206
    argv=("${API[@]}" --model "$M/$model" "${COMMON[@]}" $args --port $port)
    printf '%q ' "${argv[@]}" > "$d/command.txt"; echo >> "$d/command.txt"
    base=$(used); hp=
    if [ "$hold" != 0 ]; then
        python3 "$root/scripts/cuda_holder.py" hold "$hold" "$d/holder-ready" > "$d/holder.log" 2>&1 &
        hp=$!
        for _ in $(seq 1 240); do [ -e "$d/holder-ready" ] && break; sleep 0.25; done
        echo "holder pid $hp holds $hold GiB" >> "$d/holder.log"
    fi
    smi > "$d/smi-before.txt"
    "$G" plan --json -- "${argv[@]}" > "$d/plan.json" 2> "$d/plan.err"; echo $? > "$d/plan.rc"
    "$G" plan -- "${argv[@]}" > "$d/plan.txt" 2>&1
    t0=$SECONDS
    : > "$d/vllm.log"
    setsid "${argv[@]}" > "$d/vllm.log" 2>&1 &
    pid=$!; ran=
    # Eager: the memory breakdown is vLLM's last memory line; with graphs, wait for the server.
    ready="Application startup complete"
    case " $args " in *" --enforce-eager "*) ready="$ready|Actual usage is .* for CUDAGraph memory" ;; esac
    lim=$((SECONDS + need))
    while kill -0 $pid 2>/dev/null && [ $SECONDS -lt $lim ]; do
        if [ -z "$ran" ] && grep -q "GPU KV cache size" "$d/vllm.log"; then smi > "$d/smi-kv.txt"; ran=1; fi
        if grep -q -E "$ready" "$d/vllm.log"; then smi > "$d/smi-ready.txt"; break; fi
        sleep 0.5
    done
    alive=$(kill -0 $pid 2>/dev/null && echo yes || echo no)
    echo "ready_s=$((SECONDS - t0)) alive_at_end=$alive" > "$d/timing.txt"
    kill -KILL -- -$pid 2>/dev/null; pkill -KILL -s $pid 2>/dev/null; wait $pid 2>/dev/null; echo "rc=$?" >> "$d/timing.txt"
    if [ -n "$hp" ]; then until_used $((base + hold * 1024 + 1024)) 60; else until_used $((base + 300)) 60; fi
    smi > "$d/smi-after.txt"
    w=$(grep -o "Model loading took [0-9.]* GiB" "$d/vllm.log" | head -1 | grep -o "[0-9.]* GiB" | tr -d ' ')
    if [ -n "$w" ]; then
        "$G" plan --json --weights "$w" -- "${argv[@]}" > "$d/plan-weights.json" 2> "$d/plan-weights.err"; echo $? > "$d/plan-weights.rc"
    fi
    if [ -n "$hp" ]; then kill $hp; wait $hp 2>/dev/null; until_used $((base + 300)) 60; fi
    done_here+=("$name")
    [ -n "$queue" ] && { grep -vx "$name" "$queue" > "$queue.next"; mv "$queue.next" "$queue"; }
    pack
    echo "== $name: $(cat "$d/timing.txt" | tr '\n' ' ')plan rc $(cat "$d/plan.rc")"
    grep -E "Model loading took|Available KV cache memory|GPU KV cache size|Maximum concurrency|Actual usage|Error|error:" "$d/vllm.log" | cut -c1-400 | head -8
done
pack
echo "batch done after $SECONDS s${queue:+; left in the queue: $(cat "$queue" | tr '\n' ' ')}"
