"""Turns what scripts/gpu_plan_vllm/corpus.sh brought back into the repository's corpus.

    python3 scripts/gpu_plan_vllm/corpus_manifest.py RESULTS_DIR [RESULTS_DIR...]

Each RESULTS_DIR is an unpacked corpus-*.tgz: one directory per case (command.txt, vllm.log,
smi-*.txt, plan*.json, timing.txt). For each case it writes the lines vLLM printed about its
configuration, memory and KV cache, after a header naming the exact command and nvidia-smi's
figures, to tests/fixtures/logs/vllm-0.26.0-<case>.log, and the figures (vLLM's and `gpureap
plan`'s on the same GPU state) to tests/fixtures/logs/corpus.json, merging with the cases already
there. Sizes vLLM prints in GiB are kept as printed (two decimals at most).
"""

import json
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests/fixtures/logs"
MODELS = "tests/fixtures/models"
ENGINE = "vllm-0.26.0"

# The lines kept from vLLM's log: its arguments and configuration, the memory it measured, the
# KV cache it sized, and why it stopped.
KEEP = re.compile(
    r"non-default args|Initializing a V1 LLM engine|Model loading took|Available KV cache memory"
    r"|GPU KV cache size|Maximum concurrency|Free memory on device|Graph capturing finished"
    r"|CUDA graph|cudagraph memory|Memory profiling|memory profil|peak activation|non-torch"
    r"|torch\.compile took|Compil(ing|ation) .*took|block.size|page size|KV cache group|kv_cache_spec"
    r"|[Hh]ybrid|sliding window|mamba|GDN|Using .*(backend|attention)|Setting attention block size"
    r"|Padding mamba|Chunked prefill is enabled|max_num_batched_tokens|max_num_seqs"
    r"|Error|error:|Traceback|Exception",
    re.IGNORECASE,
)
# Left out: CUDA graph capture's progress and per-size lines, the environment dump of
# torch.compile, the ulimit warning, and the tokenizer traceback every start with
# --skip-tokenizer-init prints.
NOISE = re.compile(
    r"CG Capture:|Capturing CUDA graphs|compilation/backends\.py:\d+\]\s+'VLLM_|ulimit|renderers/base\.py"
    r"|Loading safetensors|\bHTTP\b|uvicorn|Route: |  File \"|\^\^\^|\]     ",
)


# What a case's figures need said beside them.
NOTES = {
    "qwen3-next-12l-eager": "FlashInfer is not carried, so the gated-DeltaNet prefill kernel vLLM chose "
    "(FlashInfer, --gdn-prefill-backend auto) failed its warm-up on every linear-attention layer "
    "(ModuleNotFoundError: No module named 'flashinfer'); vLLM sized its KV cache all the same. With "
    "--gdn-prefill-backend triton (qwen3-next-12l-eager-gdn-triton) the warm-up ran on every layer and "
    "the figures barely moved: the same 2.8 GiB activation peak, 4,184,818 tokens against 4,185,249.",
    "qwen3-next-12l-eager-gdn-triton": "qwen3-next-12l-eager again with --gdn-prefill-backend triton "
    "(FlashInfer is not carried): the Triton/FLA prefill kernel's warm-up completed on every "
    "linear-attention layer, so this is a working start's profile.",
    "qwen3-30b-a3b": "qwen3-30b-a3b-eager with CUDA graphs: the V1 runner took its graph estimate "
    "(0.64 GiB, 'Estimated CUDA graph memory') out of the pool; the capture itself took 0.80 GiB.",
    "llama-u05-hold41": "A PyTorch process held 41 GiB: vLLM refused to start, as it should.",
    "llama-u05-hold36": "A PyTorch process held 36 GiB: vLLM started (free 42.06 GiB >= 39.59 requested).",
}


def gib(pattern, text, group=1):
    m = re.search(pattern, text)
    return float(m.group(group).replace(",", "")) if m else None


def integer(pattern, text):
    m = re.search(pattern, text)
    return int(m.group(1).replace(",", "")) if m else None


def smi(path):
    """nvidia-smi's name, driver, total, reserved, used, free (MiB) as corpus.sh asked them."""
    if not path.exists():
        return None
    name, driver, total, reserved, used, free = [f.strip() for f in path.read_text().strip().split(",")]
    return {"name": name, "driver": driver, "total_mib": int(total), "reserved_mib": int(reserved),
            "used_mib": int(used), "free_mib": int(free)}


def engine_figures(log):
    usage = re.search(
        r"Free memory on device \(([\d.]+)/([\d.]+) GiB\) on startup\. Desired GPU memory utilization is "
        r"\(([\d.]+), ([\d.]+) GiB\)\. Actual usage is ([\d.]+) GiB for weight, ([\d.]+) GiB for peak activation, "
        r"([\d.]+) GiB for non-torch memory, and ([\d.]+) GiB for CUDAGraph memory", log)
    refusal = re.search(r"ValueError: (Free memory on device .*)", log)
    tokens = [int(t.replace(",", "")) for t in re.findall(r"GPU KV cache size: ([\d,]+) tokens", log)]
    conc = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", log)
    fig = {
        "kv_tokens": tokens[0] if tokens else None,
        "max_concurrency": float(conc.group(2)) if conc else None,
        "tokens_per_request": int(conc.group(1).replace(",", "")) if conc else None,
        "available_kv_gib": gib(r"Available KV cache memory: ([\d.]+) GiB", log),
        "weights_gib": gib(r"Model loading took ([\d.]+) GiB", log),
        "free_at_start_gib": float(usage.group(1)) if usage else None,
        "total_gib": float(usage.group(2)) if usage else None,
        "requested_gib": float(usage.group(4)) if usage else None,
        "activation_peak_gib": float(usage.group(6)) if usage else None,
        "non_torch_gib": float(usage.group(7)) if usage else None,
        "cuda_graph_gib": float(usage.group(8)) if usage else None,
        "graph_capture_gib": gib(r"Graph capturing finished in [\d.]+ secs?, took ([\d.-]+) GiB", log),
        # Printed only where vLLM changes it (hybrid models); else its default applies.
        "block_size": integer(r"Setting attention block size to (\d+) tokens", log),
        "refusal": refusal.group(1).strip() if refusal else None,
    }
    if len(tokens) > 1:
        fig["kv_tokens_all_lines"] = tokens
    return fig


def plan_figures(path, kv_tokens, per_request):
    if not path.exists():
        return None
    rc_file = path.with_name(path.stem + ".rc")
    out = {"exit": int(rc_file.read_text()) if rc_file.exists() else None}
    try:
        doc = json.loads(path.read_text())
    except ValueError:
        err = path.with_suffix(".err")
        out["error"] = err.read_text().strip()[:400] if err.exists() else "no JSON"
        return out
    dev, budget = doc["device"], doc["budget"]
    out.update({
        "tokens": dev["tokens_per_rank"],
        "concurrency_at_max_len": round(dev["tokens_per_rank"] / per_request, 2) if per_request else None,
        "kv_gib": round(dev["kv_bytes_per_rank"] / 2**30, 3),
        "weights_gib": round(budget["weights_per_gpu"] / 2**30, 3),
        "weights_source": budget["weights_source"],
        "free_at_start_gib": round(budget["free_at_start"] / 2**30, 3),
        "starts": dev["starts"],
        "start": dev["start"]["kind"],
        "verdict": doc["fit"]["verdict"],
    })
    if kv_tokens and dev["tokens_per_rank"] is not None:
        out["error_pct"] = round(100 * (dev["tokens_per_rank"] - kv_tokens) / kv_tokens, 2)
    return out


def trimmed(command, before, running, log):
    head = [f"# command: {command}"]
    if before:
        head.append(f"# nvidia-smi before: {before['name']}, driver {before['driver']}, total {before['total_mib']} MiB, "
                    f"reserved {before['reserved_mib']} MiB, used {before['used_mib']} MiB, free {before['free_mib']} MiB")
    if running:
        head.append(f"# nvidia-smi running: used {running['used_mib']} MiB, free {running['free_mib']} MiB")
    pieces = (piece.rstrip() for line in log.splitlines() for piece in line.split("\r"))
    keep = [line for line in pieces if KEEP.search(line) and not NOISE.search(line)]
    # DEBUG repeats some lines per compiled size; a line kept once is enough.
    seen, lines = set(), []
    for line in keep:
        body = re.sub(r"^\(\w+ pid=\d+\) \w+ [\d-]+ [\d:]+ ", "", line)
        body = re.sub(r"layers\.\d+\.", "layers.N.", body)
        if body not in seen:
            seen.add(body)
            lines.append(line[:2000])
    return "\n".join(head + lines) + "\n"


def without_port(args):
    if "--port" not in args:
        return args
    at = args.index("--port")
    return args[:at] + args[at + 2:]


def case(d, version_key, commit):
    name = d.name
    command = (d / "command.txt").read_text().strip()
    argv = shlex.split(command)
    model = Path(argv[argv.index("--model") + 1]).name
    args = argv[argv.index("--model") + 2:]
    log = (d / "vllm.log").read_text(errors="replace")
    before = smi(d / "smi-before.txt")
    running = smi(d / "smi-ready.txt") or smi(d / "smi-kv.txt")
    fig = engine_figures(log)
    holder = 0
    if (d / "holder.log").exists():
        m = re.search(r"holds (\d+) GiB", (d / "holder.log").read_text())
        holder = int(m.group(1)) if m else None
    per_request = fig["tokens_per_request"] or int(args[args.index("--max-model-len") + 1])
    file = f"{ENGINE}-{name}.log"
    (LOGS / file).write_text(trimmed(command, before, running, log))
    timing = dict(kv.split("=") for kv in (d / "timing.txt").read_text().split())
    return name, {
        "file": file,
        "model_dir": f"{MODELS}/{model}",
        "vllm_args": ["--model", f"{MODELS}/{model}"] + without_port(args),
        "command": command,
        "holder_gib": holder,
        "gpu": {k: before[k] for k in ("name", "driver", "total_mib", "reserved_mib")} if before else None,
        "used_mib_before": before["used_mib"] if before else None,
        "free_mib_before": before["free_mib"] if before else None,
        "used_mib_running": running["used_mib"] if running else None,
        "started": fig["kv_tokens"] is not None,
        "ready_s": int(timing.get("ready_s", 0)),
        "engine": fig,
        "note": NOTES.get(name),
        version_key: {
            "commit": commit,
            "a_priori": plan_figures(d / "plan.json", fig["kv_tokens"], per_request),
            "with_logged_weights": plan_figures(d / "plan-weights.json", fig["kv_tokens"], per_request),
        },
    }


def main():
    dirs = [Path(p) for p in sys.argv[1:]]
    manifest_path = LOGS / "corpus.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"engine": ENGINE, "cases": {}}
    manifest["about"] = (
        "Real vLLM 0.26.0 API-server starts with --load-format dummy (random weights from the "
        "config.json alone) on one GPU, by scripts/gpu_plan_vllm/corpus.sh; this file and the logs "
        "beside it by scripts/gpu_plan_vllm/corpus_manifest.py. vLLM: the PyPI wheel less "
        "FlashAttention 2, the JIT headers and the Rust front end (scripts/gpu_plan_vllm/wheels.sh), "
        "FlashInfer not carried (VLLM_USE_FLASHINFER_SAMPLER=0), VLLM_LOGGING_LEVEL=DEBUG, under the "
        "machine's PyTorch. engine.*_gib are vLLM's printed figures; plan_<version> is `gpureap plan` "
        "on the same GPU state: a_priori before the start, with_logged_weights after it with "
        "--weights set to vLLM's 'Model loading took'; error_pct is (plan - engine) / engine tokens."
    )
    for top in dirs:
        version = (top / "gpureap-version.txt").read_text().split()
        version_key, commit = f"plan_{version[1]}", version[2].strip("(")
        for d in sorted(p for p in top.iterdir() if (p / "command.txt").exists()):
            name, entry = case(d, version_key, commit)
            manifest["cases"][name] = entry
    manifest["cases"] = dict(sorted(manifest["cases"].items()))
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{manifest_path}: {len(manifest['cases'])} cases")


if __name__ == "__main__":
    main()
