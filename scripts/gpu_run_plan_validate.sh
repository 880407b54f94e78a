#!/usr/bin/env bash
# `gpureap run --plan` on a real GPU through NVML (docs/gpu-validation.md):
#
#   scripts/gpu_run_plan_validate.sh GPUREAP [GPU] [OUT]
#
# A real CUDA holder (scripts/cuda_holder.py, PyTorch) takes 10 GiB on GPU (default 0);
# the engine is the tests' fake SGLang (tests/fake_engine: `python3 -m sglang.launch_server`,
# which records that it started), planned for the Llama-3.1-8B fixture. Checks: the plan sees
# the holder (exit 1) and run --plan starts nothing (exit 1, no start recorded); with
# --wait-for-fit, the server starts once the holder is killed; planned vs logged capacity is
# said once ready; the plan on the clean GPU exits 0. Only processes this script started are
# signalled, by PID. Prints PASS/FAIL lines; exits 0 when none failed.
set -u
gpureap=$(realpath "$1")
gpu=${2:-0}
out=${3:-$(mktemp -d)}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
failed=0
pass() { echo "PASS $*" | tee -a "$out/validate.log"; }
fail() { echo "FAIL $*" | tee -a "$out/validate.log"; failed=1; }
# Waits up to $1 seconds for the command in the rest to succeed.
until_ok() {
    local limit=$1; shift
    local deadline=$((SECONDS + limit))
    until "$@"; do
        [ "$SECONDS" -ge "$deadline" ] && return 1
        sleep 0.1
    done
}
export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=$gpu
export PYTHONPATH="$root/tests/fake_engine" FAKE_ENGINE_STARTED="$work/started"
export FAKE_ENGINE_TOKENS=400000
engine=(python3 -m sglang.launch_server --model-path "$root/tests/fixtures/models/llama-3.1-8b" --tp 1)

python3 "$root/scripts/cuda_holder.py" hold 10 "$work/holder-ready" --gpu "$gpu" >"$out/holder.log" 2>&1 &
holder=$!
until_ok 120 test -e "$work/holder-ready" || { fail "the CUDA holder did not start"; cat "$out/holder.log"; exit 1; }

"$gpureap" plan -- "${engine[@]}" >"$out/plan-held.txt" 2>&1
code=$?
[ "$code" = 1 ] && grep -q "pid $holder" "$out/plan-held.txt" \
    && pass "plan with a 10 GiB holder: exit 1, the holder named" \
    || fail "plan with a 10 GiB holder: exit $code: $(cat "$out/plan-held.txt")"

"$gpureap" run --plan --restart never --state-dir "$work/state" -- "${engine[@]}" >"$out/run-refused.txt" 2>&1
code=$?
[ "$code" = 1 ] && [ ! -e "$work/started" ] && grep -q "not starting: .*pid $holder" "$out/run-refused.txt" \
    && pass "run --plan refuses: exit 1, nothing started" \
    || fail "run --plan: exit $code, started: $(test -e "$work/started" && echo yes || echo no): $(cat "$out/run-refused.txt")"

"$gpureap" run --plan --wait-for-fit 2m --restart never --ready-log 'fired up' \
    --state-dir "$work/state" -- "${engine[@]}" >"$out/run-wait.txt" 2>&1 &
run=$!
if until_ok 60 grep -q "for the holders to go" "$out/run-wait.txt" && [ ! -e "$work/started" ]; then
    pass "run --plan --wait-for-fit waits, nothing started"
else
    fail "run --plan --wait-for-fit: $(cat "$out/run-wait.txt")"
fi
kill "$holder"; wait "$holder" 2>/dev/null
if until_ok 60 grep -q "capacity:" "$out/run-wait.txt" && [ -e "$work/started" ]; then
    pass "started once the holder was gone: $(grep -o 'plan: fits after [^:]*' "$out/run-wait.txt")"
    pass "$(grep -o 'capacity: .*' "$out/run-wait.txt")"
else
    fail "not started after the holder went: $(cat "$out/run-wait.txt")"
fi
kill -TERM "$run"; wait "$run"; code=$?
[ "$code" = 0 ] && pass "stopped: exit 0" || fail "stop: exit $code"

"$gpureap" plan -- "${engine[@]}" >"$out/plan-clean.txt" 2>&1
code=$?
[ "$code" = 0 ] && pass "plan on the clean GPU: exit 0" || fail "plan on the clean GPU: exit $code: $(cat "$out/plan-clean.txt")"
rm -rf "$work"
exit $failed
