#!/usr/bin/env bash
# Phase timings of `gpureap free --grace 0` on eight orphaned CUDA holders
# (GPUREAP_LOG=debug, no colours). Starts and kills only its own processes.
# Usage: bench/probe_free.sh PATH_TO_GPUREAP
set -u
BIN=${1:-target/release/gpureap}
W=$(mktemp -d)
PY=$(python3 -c 'import sys; print(":".join(p for p in sys.path if p))')
bash -c "for i in 0 1 2 3 4 5 6 7; do ( echo \$BASHPID >> $W/pids; PYTHONPATH=$PY exec -a sglang::probe_TP\$i python3 scripts/cuda_holder.py hold 2 $W/ready\$i ) & done" &
until [ "$(ls "$W"/ready* 2>/dev/null | wc -l)" = 8 ]; do sleep 0.1; done
sleep 0.5
NO_COLOR=1 GPUREAP_LOG=debug "$BIN" free --orphans --grace 0 --yes --json > "$W/free.json" 2> "$W/free.log"
python3 -c "import json; d=json.load(open('$W/free.json')); print('freed_after_ms', [g['freed_after_ms'] for g in d['gpus']], 'elapsed', d['elapsed_ms'])"
sed -e 's/\x1b\[[0-9;]*m//g' "$W/free.log" | head -40
