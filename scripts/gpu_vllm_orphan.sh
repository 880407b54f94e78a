#!/usr/bin/env bash
# The real-engine incident of issue 41 on a real GPU (docs/gpu-validation.md; the runs in
# docs/gpu-validation/history.md, "A real vLLM EngineCore orphaned"):
#
#   scripts/gpu_vllm_orphan.sh GPUREAP [OUT]
#
# vLLM's API server (0.26.0, importable from PYTHONPATH, default /tmp/site as
# scripts/gpu_plan_vllm/setup.sh leaves it) is started in its own session (setsid) on GPU 0 with
# the Llama-3.1-8B fixture and dummy weights, and waited for until ready; a bystander PyTorch
# holder of the same user holds 4 GiB beside it. Only the API server is SIGKILLed: its
# `VLLM::EngineCore` stays, re-parented, with its memory. Then `gpureap status` must flag it
# orphaned, `gpureap check` must exit 1, and `gpureap free --orphans --yes` must take it alone:
# the bystander survives with its memory, and the engine's memory comes back (the seconds are
# printed). Only processes this script started are signalled (the server's own session, the
# bystander by PID). Prints PASS/FAIL lines; exits 0 when none failed.
set -u
G=$(realpath "$1")
out=${2:-$(mktemp -d)}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=${PYTHONPATH:-/tmp/site} PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
export CUDA_VISIBLE_DEVICES=0
failed=0
pass() { echo "PASS $*" | tee -a "$out/orphan.log"; }
fail() { echo "FAIL $*" | tee -a "$out/orphan.log"; failed=1; }
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0; }
app_mib() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p="$1" '$1 == p { print $2 }'; }
ms() { echo $(($(date +%s%N) / 1000000)); }
# The PIDs of session $1 whose command line starts with $2 (all of them without $2).
in_session() {
    python3 -c "
import os, sys
sid, prefix = int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else ''
for p in filter(str.isdigit, os.listdir('/proc')):
    try:
        stat = open(f'/proc/{p}/stat').read()
        cmd = open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode(errors='replace')
    except OSError:
        continue
    if int(stat.rsplit(')', 1)[1].split()[3]) == sid and cmd.startswith(prefix):
        print(p)" "$@"
}
api= bystander=
cleanup() {
    [ -n "$api" ] && for p in $(in_session "$api"); do kill -KILL "$p" 2>/dev/null; done
    [ -n "$bystander" ] && kill -KILL "$bystander" 2>/dev/null
}
trap cleanup EXIT

nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader -i 0 | tee "$out/gpu.txt"
base=$(used)
python3 "$root/scripts/cuda_holder.py" hold 4 "$out/bystander-ready" > "$out/bystander.log" 2>&1 &
bystander=$!
for _ in $(seq 1 240); do [ -e "$out/bystander-ready" ] && break; sleep 0.25; done
[ -e "$out/bystander-ready" ] || { fail "the bystander holder did not start: $(cat "$out/bystander.log")"; exit 1; }
bystander_mib=$(app_mib "$bystander")

t0=$SECONDS
setsid python3 -m vllm.entrypoints.openai.api_server --model "$root/tests/fixtures/models/llama-3.1-8b" \
    --load-format dummy --skip-tokenizer-init --max-model-len 8192 --enforce-eager \
    --gpu-memory-utilization 0.5 --port 18123 > "$out/vllm.log" 2>&1 &
api=$!
until grep -q "Application startup complete" "$out/vllm.log"; do
    if ! kill -0 "$api" 2>/dev/null || [ $((SECONDS - t0)) -ge 300 ]; then
        fail "vLLM not ready after $((SECONDS - t0)) s: $(grep -E 'Error|error' "$out/vllm.log" | tail -3)"
        exit 1
    fi
    sleep 0.5
done
engine=$(in_session "$api" VLLM::EngineCore | head -1)
[ -n "$engine" ] && pass "vLLM ready after $((SECONDS - t0)) s: API server $api, EngineCore $engine holding $(app_mib "$engine") MiB" \
    || { fail "no VLLM::EngineCore in the server's session: $(in_session "$api" | xargs -r ps -o pid,ppid,args -p)"; exit 1; }
engine_mib=$(app_mib "$engine")

kill -KILL "$api"; wait "$api" 2>/dev/null
sleep 1
if kill -0 "$engine" 2>/dev/null && [ -n "$(app_mib "$engine")" ]; then
    pass "API server SIGKILLed; EngineCore $engine stays (parent $(ps -o ppid= -p "$engine" | tr -d ' ')) with $(app_mib "$engine") MiB"
else
    fail "the EngineCore did not outlive its API server"
fi

"$G" status --json > "$out/status.json"
"$G" status > "$out/status.txt" 2>&1
flags=$(python3 -c "
import json, sys
doc = json.load(open('$out/status.json'))
by = {h['pid']: h for h in doc['holders']}
e, b = by.get($engine, {}), by.get($bystander, {})
print('orphaned' in e.get('flags', []), 'orphaned' in b.get('flags', []), e.get('orphan'))")
read -r engine_orphan bystander_orphan why <<<"$flags"
[ "$engine_orphan" = True ] && [ "$bystander_orphan" = False ] \
    && pass "status flags the EngineCore orphaned ($why), not the bystander" \
    || fail "status: EngineCore orphaned=$engine_orphan, bystander orphaned=$bystander_orphan: $(cat "$out/status.txt")"

"$G" check > "$out/check.txt" 2>&1
code=$?
[ "$code" = 1 ] && pass "check exits 1: $(head -1 "$out/check.txt")" || fail "check exit $code: $(cat "$out/check.txt")"

before=$(used)
start=$(ms)
"$G" free --orphans --yes > "$out/free.txt" 2>&1
code=$?
command_ms=$(($(ms) - start))
until [ "$(used)" -le $((before - engine_mib + 256)) ] || [ $(($(ms) - start)) -ge 60000 ]; do sleep 0.05; done
back_ms=$(($(ms) - start))
after=$(used)
command_s=$(printf '%d.%03d' $((command_ms / 1000)) $((command_ms % 1000)))
back_s=$(printf '%d.%03d' $((back_ms / 1000)) $((back_ms % 1000)))
[ "$code" = 0 ] && pass "free --orphans --yes: exit 0 after ${command_s} s: $(grep -o 'GPU 0: freed.*' "$out/free.txt" | head -1)" \
    || fail "free --orphans --yes: exit $code: $(cat "$out/free.txt")"
# Gone, or a zombie its new parent has not reaped yet (its memory is the driver's to count).
state=$(sed 's/.*) //' "/proc/$engine/stat" 2>/dev/null | cut -d' ' -f1)
case $state in
"" | Z) pass "the EngineCore $engine is gone${state:+ (a zombie not yet reaped by its new parent)}" ;;
*) fail "the EngineCore $engine is still there (state $state)" ;;
esac
if kill -0 "$bystander" 2>/dev/null && [ "$(app_mib "$bystander")" = "$bystander_mib" ]; then
    pass "the bystander $bystander survives, still holding $bystander_mib MiB"
else
    fail "the bystander $bystander: alive $(kill -0 "$bystander" 2>/dev/null && echo yes || echo no), holds '$(app_mib "$bystander")' MiB (had $bystander_mib)"
fi
[ "$after" -le $((before - engine_mib + 256)) ] \
    && pass "memory back: GPU 0 used $before -> $after MiB ($engine_mib MiB of the EngineCore) ${back_s} s after free started" \
    || fail "memory not back: GPU 0 used $before -> $after MiB after ${back_s} s"

kill "$bystander"; wait "$bystander" 2>/dev/null; bystander=
echo "GPU 0 used at start $base MiB, at end $(used) MiB"
exit $failed
