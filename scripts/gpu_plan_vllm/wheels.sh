#!/usr/bin/env bash
# Builds, on a machine that reaches PyPI, the vLLM 0.26.0 set carried to a GPU machine that
# reaches nothing (docs/gpu-validation.md, "`plan` against real vLLM 0.26.0"), in pieces of at
# most 64 MiB under DIR/part1, DIR/part2 (vLLM itself, slimmed and xz-compressed) and DIR/deps
# (the wheels of what it imports that the GPU image lacks: the image's list is in the device
# notes). Slimmed: FlashAttention 2's kernels (the H200 runs FlashAttention 3), the JIT headers
# of deep_gemm and fmha_sm100 and the opt-in Rust front end are left out; FlashInfer is not
# carried (start vLLM with VLLM_USE_FLASHINFER_SAMPLER=0).
#
#   scripts/gpu_plan_vllm/wheels.sh DIR
set -euo pipefail
dir=$(realpath -m "$1"); mkdir -p "$dir"/{dl,part1,part2,deps}
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64)
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d "$dir/dl" "$@"; }
get vllm==0.26.0
# What vLLM 0.26.0's API server imports that the GPU image (torch 2.11, transformers 5.17, …) lacks.
for p in cachetools blake3 py-cpuinfo 'fastapi<0.137' starlette openai 'pydantic>=2.12' pydantic-core \
    annotated-types typing-inspection prometheus-fastapi-instrumentator lm-format-enforcer==0.11.3 \
    interegular 'llguidance<1.8,>=1.7' outlines-core==0.2.14 lark==1.2.2 'xgrammar<1.0' apache-tvm-ffi==0.1.10 \
    partial-json-parser pyzmq msgspec mistral-common pycountry pydantic-extra-types jsonschema \
    jsonschema-specifications referencing rpds-py compressed-tensors==0.17.0 depyf==0.20.0 astor dill \
    watchfiles python-json-logger pybase64 cbor2 ijson setproctitle openai-harmony anthropic jiter \
    docstring-parser sniffio model-hosting-container-standards mcp sse-starlette uvicorn python-multipart \
    opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions opentelemetry-semantic-conventions-ai \
    nvtx==0.2.15 torch-c-dlpack-ext cuda-tile; do get "$p"; done
mv "$dir"/dl/*.whl "$dir/deps/"
mv "$dir"/deps/vllm-0.26.0-*.whl "$dir/dl/"
work=$(mktemp -d); (cd "$work" && unzip -q "$dir"/dl/vllm-0.26.0-*.whl)
rm -f "$work"/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$work"/vllm/vllm-rs "$work"/vllm/third_party/deep_gemm/_C.cpython-31[34]-*.so
rm -rf "$work"/vllm/third_party/deep_gemm/include "$work"/vllm/third_party/fmha_sm100/cutlass
(cd "$work" && tar cf - vllm vllm-0.26.0.dist-info) | xz -T2 -4 > "$work/vllm.tar.xz"
split -b 60000000 "$work/vllm.tar.xz" "$work/vllm-part-"
mv "$work/vllm-part-aa" "$dir/part1/"; mv "$work/vllm-part-ab" "$dir/part2/"
rm -rf "$work"; du -sh "$dir"/part1 "$dir"/part2 "$dir"/deps
