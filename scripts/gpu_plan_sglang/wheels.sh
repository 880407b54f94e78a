#!/usr/bin/env bash
# Builds, on a machine that reaches PyPI, the SGLang 0.5.14 set carried to a GPU machine that
# reaches nothing (docs/gpu-validation/sglang-route.md): SGLang, its kernel package and every
# package it imports that the GPU image lacks, installed into one tree (as `pip install --target`
# for CPython 3.12 on x86-64 would), packed as one xz tarball and split into pieces of at most
# 60 MB, DIR/part1/sglang-part-aa, DIR/part2/sglang-part-ab, … (today one piece of about 45 MB).
# Each piece's folder holds MANIFEST, the checksums of all pieces, for setup.sh.
#
# Left out of sglang-kernel 0.4.4 (615 MB wheel, 1.8 GB unpacked): sgl_kernel/flash_ops.abi3.so,
# its FlashAttention 3 library (1.76 GB unpacked; imported only by sgl_kernel/flash_attn.py, which
# the fa3/fa4 attention backends, a few vision encoders and the MiMo models import), and
# sgl_kernel/sm100 (the Blackwell build of common_ops; on Hopper sgl_kernel loads sgl_kernel/sm90).
# So the server must run with an attention backend other than fa3/fa4: --attention-backend triton.
# FlashInfer is carried as its JIT-only Python package (sglang imports flashinfer.sampling and, for
# DeepSeek, flashinfer.gemm at module level on CUDA) without its precompiled cubins
# (flashinfer-cubin); it is not called with --attention-backend triton --sampling-backend pytorch.
# Not carried (not imported on that path): flash-attn-4, nvidia-cutlass-dsl, tilelang, sgl-deep-gemm,
# tokenspeed_mla, quack-kernels, torchao, torch_memory_saver, xgrammar/outlines/llguidance (no
# grammar backend under --skip-tokenizer-init), datasets, modelscope, the HF `kernels` package.
#
#   scripts/gpu_plan_sglang/wheels.sh DIR
set -euo pipefail
dir=$(realpath -m "$1"); rm -rf "$dir"/dl "$dir"/part*; mkdir -p "$dir/dl"
plat=(--platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
      --platform manylinux1_x86_64)
py=(--only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}")
get() { python3 -m pip download -q --no-deps "${py[@]}" -d "$dir/dl" "$@"; }
get sglang==0.5.14 sglang-kernel==0.4.4 flashinfer-python==0.6.12
# What SGLang 0.5.14's server imports on that path that the GPU image (torch 2.11, transformers
# 5.17, tokenizers 0.23.2, …) lacks, found by importing it in a venv holding only the image's
# packages. transformers is SGLang's pin (5.8.1: under 5.17 SGLang's own qwen3_asr config clashes
# with the one 5.17 ships), and 5.8.1 wants tokenizers <= 0.23.0. Versions shared with
# gpu_plan_vllm/wheels.sh are the same.
for p in \
    annotated-types==0.8.0 apache-tvm-ffi==0.1.9 asttokens==3.0.2 cffi==2.1.1  \
    compressed-tensors==0.20.1 dill==0.4.1 distro==1.9.0 executing==2.3.0 fastapi==0.165.0  \
    gguf==0.19.0 interegular==0.3.3 ipython==9.19.1 ipython-pygments-lexers==1.1.1 jedi==0.20.1  \
    jiter==0.19.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 loguru==0.7.3  \
    matplotlib-inline==0.2.2 msgspec==0.23.0 openai==2.6.1 opentelemetry-api==1.45.2  \
    orjson==3.13.0 parso==0.8.7 partial-json-parser==0.2.1.1.post7 pexpect==4.9.0  \
    prompt-toolkit==3.0.53 ptyprocess==0.7.0 pure-eval==0.2.4 pybase64==1.5.1 pycparser==3.12  \
    pydantic==2.14.4 pydantic-core==2.50.5 python-multipart==0.0.34 pyzmq==27.3.0  \
    referencing==0.37.0 rpds-py==2026.9.1 setproctitle==1.3.8 sniffio==1.3.1 soundfile==0.13.1  \
    stack-data==0.6.3 starlette==1.10.0 tokenizers==0.22.2 traitlets==5.16.1 transformers==5.8.1  \
    typing-inspection==0.4.5 uvicorn==0.54.0 wcwidth==0.9.5; do
    get "$p"
done
work=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile "${py[@]}" --target "$work/site" "$dir"/dl/*.whl
rm -rf "$work"/site/sgl_kernel/flash_ops.abi3.so "$work"/site/sgl_kernel/sm100 "$work/site/bin"
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
(cd "$work/site" && tar cf - --sort=name .) | xz -T2 -6 > "$work/sglang.tar.xz"
split -b 60000000 "$work/sglang.tar.xz" "$work/sglang-part-"
(cd "$work" && sha256sum sglang-part-* > MANIFEST)
n=1
for f in "$work"/sglang-part-*; do
    mkdir -p "$dir/part$n"; mv "$f" "$dir/part$n/"; cp "$work/MANIFEST" "$dir/part$n/"; n=$((n + 1))
done
(cd "$dir/dl" && ls -1) > "$dir/wheels.txt"
rm -rf "$work" "$dir/dl"; du -sh "$dir"/part*
