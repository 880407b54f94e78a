#!/usr/bin/env bash
# On the GPU machine: gathers the pieces wheels.sh built (DIR/part*/, carried in one call or in
# several) in /tmp/sglstore, which lasts while the machine stays warm, and once every piece that
# MANIFEST lists is there and checks out, unpacks the set to /tmp/sglsite, for
# PYTHONPATH=/tmp/sglsite. Safe to run after every call: it keeps what came, says what is still
# missing (exit 3), and does nothing more once the set is unpacked.
#
#   scripts/gpu_plan_sglang/setup.sh [DIR]        (DIR: the checkout's .sgl by default)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$root/.sgl}
store=/tmp/sglstore site=/tmp/sglsite
mkdir -p "$store"
if [ -e "$site/.complete" ]; then
    echo "SGLang set already unpacked in $site"
else
    for f in "$dir"/part*/sglang-part-* "$dir"/part*/MANIFEST; do
        if [ -e "$f" ]; then cp -u "$f" "$store/"; fi
    done
    [ -e "$store/MANIFEST" ] || { echo "no piece of the SGLang set has arrived (looked in $dir)"; exit 3; }
    missing=$(cd "$store" && while read -r _ f; do [ -e "$f" ] || echo "$f"; done < MANIFEST)
    if [ -n "$missing" ]; then
        echo "SGLang set: still to come:" $missing; exit 3
    fi
    (cd "$store" && sha256sum --quiet -c MANIFEST)
    rm -rf "$site.partial"; mkdir -p "$site.partial"
    (cd "$store" && cat $(awk '{print $2}' MANIFEST)) | xz -d | tar x -C "$site.partial"
    rm -rf "$site"; mv "$site.partial" "$site"; touch "$site/.complete"
    echo "SGLang set unpacked in $site ($(du -sh "$site" | cut -f1))"
fi
# SGLang's JIT builds from an earlier machine (serve_once.sh's sgl-jit-cache.tgz), if carried.
if [ -e "$dir/jit/sgl-jit-cache.tgz" ] && [ ! -d /tmp/sgl-jit-cache ]; then
    tar xzf "$dir/jit/sgl-jit-cache.tgz" -C /tmp && echo "JIT builds unpacked in /tmp/sgl-jit-cache"
fi
PYTHONPATH=$site python3 -c "
import importlib.metadata as m, torch, transformers, sgl_kernel, sglang, flashinfer
print('sglang', sglang.__version__, '| sgl_kernel', sgl_kernel.__version__, sgl_kernel.common_ops.__file__.split('/')[-2],
      '| flashinfer', flashinfer.__version__, '| transformers', transformers.__version__,
      '| tokenizers', m.version('tokenizers'), '| torch', torch.__version__, torch.cuda.get_device_name(0))"
