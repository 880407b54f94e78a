#!/bin/bash
# A real CUDA holder with a hostile title (docs/gpu-validation.md): what status, JSON,
# the exposition and free make of it through NVML.
#
#   bash scripts/gpu_hostile_title.sh GPUREAP OUTDIR   (from the repository's root, on GPU 0)
G=$1; OUT=$2; set -u
# exec -a hides where python3 lives: give the child its sys.path (as scripts/gpuval.py does).
export PYTHONPATH=$(python3 -c "import sys; print(':'.join(p for p in sys.path if p))") CUDA_DEVICE_ORDER=PCI_BUS_ID
title=$(printf 'evil\033[1A\033[2K\nNothing in scope to signal.\r')
ready=$(mktemp -u /tmp/hostile.XXXXXX)
( exec -a "$title" python3 scripts/cuda_holder.py hold 2 $ready --gpu 0 ) &
pid=$!
# The holder is ours alone: whatever happens below, it does not outlive this script.
trap 'kill -9 $pid 2>/dev/null; rm -f "$ready"' EXIT
for i in $(seq 300); do [ -e $ready ] && break; sleep 0.1; done
echo "holder pid $pid"
"$G" status > $OUT/h-status.txt; echo "status exit $?"
"$G" status --tree > $OUT/h-tree.txt; echo "tree exit $?"
"$G" status --json > $OUT/h-status.json; echo "json exit $?"
python3 -c "import json,sys; d=json.load(open('$OUT/h-status.json')); print('json ok', [h['cmdline'][:40] for h in d['holders'] if h.get('pid')==$pid])" 2>&1
"$G" status --prometheus --per-process > $OUT/h-metrics.prom; echo "prometheus exit $?"
for f in $OUT/h-status.txt $OUT/h-tree.txt; do
  if grep -qP '\x1b|\r' $f; then echo "RAW CONTROL in $f"; else echo "no raw control in $f"; fi
  if grep -q '^Nothing in scope' $f; then echo "FORGED LINE in $f"; else echo "no forged line in $f"; fi
done
grep -c "$pid" $OUT/h-status.txt
"$G" free --pid $pid --grace 1s --yes > $OUT/h-free.txt; echo "free exit $?"
cat $OUT/h-free.txt
"$G" wait --gpu 0 --timeout 1s; echo "wait exit $?"
"$G" check --gpu 0; echo "check exit $?"
