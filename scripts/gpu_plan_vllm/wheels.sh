#!/usr/bin/env bash
# Builds, on a machine that reaches PyPI, the vLLM 0.26.0 set carried to a GPU machine that
# reaches nothing (docs/gpu-validation/history.md, "`plan` against real vLLM 0.26.0"), in pieces of at
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
# What vLLM 0.26.0's API server imports that the GPU image (torch 2.11, transformers 5.17, …)
# lacks: resolved from vLLM's requirements against the image's package list, less the kernel
# packages it does not need there (flashinfer, tilelang, cutlass-dsl, …). These exact versions
# ran on the H200 on 2026-12-02.
for p in \
    annotated-types==0.8.0 anthropic==2.15.0 apache-tvm-ffi==0.1.11 astor==0.8.1 blake3==1.0.11  \
    cachetools==8.0.2 cbor2==6.3.0 cffi==2.1.1 compressed-tensors==0.17.0 cryptography==50.0.2  \
    cuda-tile==1.7.0 depyf==0.20.0 dill==0.4.1 docstring-parser==0.18.0 fastapi==0.165.0  \
    googleapis-common-protos==1.76.0 httpcore2==2.16.2 httpx2==2.16.2 ijson==3.6.0  \
    interegular==0.3.3 jiter==0.19.0 jmespath==1.1.0 jsonschema-specifications==2025.9.1  \
    jsonschema==4.26.0 lark==1.2.2 llguidance==1.7.6 lm-format-enforcer==0.11.3 loguru==0.7.3  \
    mcp-types==2.3.0 mcp==2.3.0 mistral-common==1.13.1 model-hosting-container-standards==0.1.16  \
    msgspec==0.23.0 nvidia-cuda-crt==13.5.37 nvtx==0.2.15 openai-harmony==0.0.8 openai==3.57.0  \
    opentelemetry-api==1.45.2 opentelemetry-exporter-http-transport==0.66b2  \
    opentelemetry-exporter-otlp-common==0.66b2 opentelemetry-exporter-otlp-proto-common==1.45.2  \
    opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2  \
    opentelemetry-exporter-otlp==1.45.2 opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2  \
    opentelemetry-semantic-conventions-ai==0.5.1 opentelemetry-semantic-conventions==0.66b2  \
    outlines-core==0.2.14 partial-json-parser==0.2.1.1.post7  \
    prometheus-fastapi-instrumentator==8.1.0 pybase64==1.5.1 pycountry==26.2.16 pycparser==3.12  \
    pydantic-core==2.50.5 pydantic-extra-types==2.11.1 pydantic==2.14.4 pyelftools==0.33  \
    pyjwt==2.15.1 python-json-logger==4.2.0 python-multipart==0.0.34 pyzmq==27.3.0  \
    referencing==0.37.0 rpds-py==2026.9.1 setproctitle==1.3.8 sniffio==1.3.1 sse-starlette==3.7.0  \
    starlette==1.10.0 supervisor==4.3.0 torch-c-dlpack-ext==0.1.5 truststore==0.10.5  \
    typing-inspection==0.4.5 uvicorn==0.54.0 watchfiles==1.3.0 xgrammar==0.2.9; do
    get "$p"
done
mv "$dir"/dl/*.whl "$dir/deps/"
mv "$dir"/deps/vllm-0.26.0-*.whl "$dir/dl/"
work=$(mktemp -d); (cd "$work" && unzip -q "$dir"/dl/vllm-0.26.0-*.whl)
rm -f "$work"/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$work"/vllm/vllm-rs "$work"/vllm/third_party/deep_gemm/_C.cpython-31[34]-*.so
rm -rf "$work"/vllm/third_party/deep_gemm/include "$work"/vllm/third_party/fmha_sm100/cutlass
(cd "$work" && tar cf - vllm vllm-0.26.0.dist-info) | xz -T2 -4 > "$work/vllm.tar.xz"
split -b 60000000 "$work/vllm.tar.xz" "$work/vllm-part-"
mv "$work/vllm-part-aa" "$dir/part1/"; mv "$work/vllm-part-ab" "$dir/part2/"
rm -rf "$work"; du -sh "$dir"/part1 "$dir"/part2 "$dir"/deps
