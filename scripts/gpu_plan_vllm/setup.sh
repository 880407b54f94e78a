#!/usr/bin/env bash
# On the GPU machine: assembles the set wheels.sh built (its pieces copied to /tmp/vstore and
# DIR/deps) under /tmp/site, for PYTHONPATH=/tmp/site.
#   scripts/gpu_plan_vllm/setup.sh DEPS_DIR
set -euo pipefail
mkdir -p /tmp/site
cat /tmp/vstore/vllm-part-* | xz -d | tar x -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$1"/*.whl
PYTHONPATH=/tmp/site python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
