#!/usr/bin/env bash
# `gpureap plan` and `gpureap run --plan` beside real vLLM 0.26.0 starts on one GPU (GPU 0):
# the figures of docs/gpu-validation/history.md, "`plan` against real vLLM 0.26.0". Needs vLLM under
# /tmp/site (setup.sh) and PyTorch. Starts PyTorch holders of 60 and 80 GiB and vLLM servers,
# and signals only those, by PID or their own process group.
#
#   OUT=DIR scripts/gpu_plan_vllm/plan_vs_vllm.sh [GPUREAP]
set -u
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT"
G=$(realpath "${1:-target/portable/gpureap}")
root=$(cd "$(dirname "$0")/../.." && pwd)
M=$root/tests/fixtures/models
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
L=(python3 -m vllm.entrypoints.openai.api_server --model $M/llama-3.1-8b --load-format dummy --skip-tokenizer-init --max-model-len 8192 --enforce-eager)
D=(python3 -m vllm.entrypoints.openai.api_server --model $M/deepseek-v2-lite --load-format dummy --skip-tokenizer-init --max-model-len 8192 --enforce-eager)
p() { local name=$1; shift; "$G" plan "$@" > $OUT/plan-$name.txt 2>&1; echo "== plan $name: exit $?"; grep -E "free at start|weights  |  now |clean GPUs|GPU 0:|logged|Verdict" $OUT/plan-$name.txt | head -9; }
holder() { python3 -c "
import torch,time
torch.cuda.set_device(0)
x=torch.empty($1<<30,dtype=torch.uint8,device='cuda')
print('held',flush=True)
time.sleep(900)" > $OUT/holder-$2.txt 2>&1 &
  HP=$!; for i in $(seq 1 120); do grep -q held $OUT/holder-$2.txt && break; sleep 0.5; done; echo "holder $2 pid $HP"; }
until_grep() { local f=$1 pat=$2 lim=$3; local end=$((SECONDS+lim)); until grep -q -E "$pat" "$f"; do [ $SECONDS -ge $end ] && return 1; sleep 0.5; done; }
nvidia-smi --query-gpu=memory.total,memory.reserved,memory.used,memory.free --format=csv > $OUT/smi-start.txt; cat $OUT/smi-start.txt
p llama-u05 -- "${L[@]}" --gpu-memory-utilization 0.5
"$G" plan --json -- "${L[@]}" --gpu-memory-utilization 0.5 > $OUT/plan-llama-u05.json
p llama-default -- "${L[@]}"
p llama-u05-fromlog --from-log $root/tests/fixtures/logs/vllm-0.26.0-llama-3.1-8b-u05.log -- "${L[@]}" --gpu-memory-utilization 0.5
p llama-default-fromlog05 --from-log $root/tests/fixtures/logs/vllm-0.26.0-llama-3.1-8b-u05.log -- "${L[@]}"
p dsv2-u06 --weights 29.34GiB -- "${D[@]}" --gpu-memory-utilization 0.6
holder 60 n60; p llama-u05-n60 -- "${L[@]}" --gpu-memory-utilization 0.5; kill $HP; wait $HP 2>/dev/null
holder 80 n80; p llama-u05-n80 -- "${L[@]}" --gpu-memory-utilization 0.5
# run --plan: must refuse with the 80 GiB holder, nothing spawned
"$G" run --plan --restart never --ready-log 'Application startup complete' --state-dir /tmp/st1 -- "${L[@]}" --gpu-memory-utilization 0.5 --port 18010 > $OUT/run-refused.txt 2>&1
echo "== run --plan with 80 GiB held: exit $? ; vLLM processes started: $(pgrep -f '^python3 -m vllm.entrypoints.openai.api_server.*18010' | wc -l)"; head -20 $OUT/run-refused.txt
# run --plan --wait-for-fit: waits, starts once the holder is gone, shows planned vs logged
"$G" run --plan --wait-for-fit 3m --restart never --ready-log 'Application startup complete' --state-dir /tmp/st2 -- "${L[@]}" --gpu-memory-utilization 0.5 --port 18011 > $OUT/run-wait.txt 2>&1 &
RP=$!
until_grep $OUT/run-wait.txt "holders to go|waiting" 60 && echo "== waiting; vLLM processes started: $(pgrep -f '^python3 -m vllm.entrypoints.openai.api_server.*18011' | wc -l)"
t0=$SECONDS; kill $HP; wait $HP 2>/dev/null
until_grep $OUT/run-wait.txt "capacity:" 300 && echo "== capacity line after $((SECONDS-t0)) s"
grep -E "plan|capacity|ready|started|wait" $OUT/run-wait.txt | head -20
cat /tmp/st2/capacity.json 2>/dev/null; echo; grep -h "GPU KV cache size" -r /tmp/st2 2>/dev/null | tail -1
kill -TERM $RP; wait $RP; echo "== run stopped: exit $?"
nvidia-smi --query-gpu=memory.used,memory.free --format=csv
bash $root/scripts/gpu_run_plan_validate.sh "$G" 0 $OUT/fake 2>&1 | tail -12
