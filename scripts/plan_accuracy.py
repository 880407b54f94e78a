#!/usr/bin/env python3
"""Regenerates docs/plan.md's accuracy tables (vLLM, SGLang) from the corpus of real starts.

For each case of tests/fixtures/logs/corpus.json, runs `gpureap plan --json` offline on the GPU
state the case recorded (--gpu-memory: the GPU's total less what the driver reserves, the total vLLM
saw; --gpu-free: the free memory vLLM logged at start, or in its refusal) twice: a priori
(the config alone) and with --from-log on the case's own log, and sets the KV tokens each
predicts beside the tokens vLLM logged. The table goes between the markers
`<!-- accuracy:begin -->` and `<!-- accuracy:end -->` of docs/plan.md.

For each case of the corpus's `sglang` section (SGLang 0.5.14), runs `gpureap plan --json
--engine-version 0.5.14` offline on the GPU of the total nvidia-smi showed (--gpu-memory: plan's
clean box; with a holder, --gpu-free: that box's free memory less the holder's, as plan prices a
process it reads), a priori and with --from-log on the case's own log (the tokens plan predicts
from the log's free memory and weights), beside the tokens, the default fraction and the weights
SGLang logged; between `<!-- accuracy-sglang:begin -->` and `<!-- accuracy-sglang:end -->`.

Usage: scripts/plan_accuracy.py GPUREAP [--check]   (run from the repository root; --check
prints the table and exits 1 when docs/plan.md differs, writing nothing)
"""
import json
import re
import subprocess
import sys
from pathlib import Path

BEGIN, END = "<!-- accuracy:begin -->", "<!-- accuracy:end -->"
SGL_BEGIN, SGL_END = "<!-- accuracy-sglang:begin -->", "<!-- accuracy-sglang:end -->"
MIB, GIB = 1 << 20, 1 << 30


def plan(gpureap, case, from_log=None):
    eng = case["engine"]
    free = eng["free_at_start_gib"]
    if free is None:  # a refused start says what it saw free: "(37.06/79.18 GiB)"
        free = re.search(r"\((\d+\.\d+)/", eng["refusal"]).group(1)
    cmd = [gpureap, "plan", "--json", "--gpu-memory", f"{case['gpu']['total_mib'] - case['gpu']['reserved_mib']}MiB",
           "--gpu-free", f"{free}GiB"]
    if from_log:
        cmd += ["--from-log", from_log]
    cmd += ["--", "python3", "-m", "vllm.entrypoints.openai.api_server"] + case["vllm_args"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode not in (0, 1, 4):
        return None, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
    return json.loads(out.stdout), None


def figure(result):
    device = result["device"]
    if device["start"]["kind"] != "starts":
        return "refuses"
    return (device.get("engine_log") or {}).get("kv_cache_tokens") or device["tokens_per_rank"]


def concurrency(result):
    device = result["device"]
    if device["start"]["kind"] != "starts":
        return None
    return (device.get("engine_log") or {}).get("max_concurrency")


def cell(engine_tokens, predicted):
    if isinstance(predicted, str):
        return predicted, None
    if engine_tokens is None:
        return f"{predicted:,}", None
    err = (predicted - engine_tokens) / engine_tokens * 100
    return f"{predicted:,} ({err:+.2f} %)", err


def plan_sglang(gpureap, case, free_mib=None, from_log=None):
    cmd = [gpureap, "plan", "--json", "--engine-version", "0.5.14", "--gpu-memory", f"{case['gpu']['total_mib']}MiB"]
    if free_mib is not None:
        cmd += ["--gpu-free", f"{free_mib}MiB"]
    if from_log:
        cmd += ["--from-log", from_log]
    cmd += ["--", "python3", "-m", "sglang.launch_server"] + case["sglang_args"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode not in (0, 1, 4):
        sys.exit(f"{case['file']}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def sglang_rows(gpureap, cases):
    rows = ["| case | SGLang 0.5.14 logged | plan a priori | plan `--from-log` (its own log) | mem fraction: logged, plan | weights GiB: logged, plan a priori |",
            "|---|---|---|---|---|---|"]
    for name, case in sorted(cases.items()):
        eng = case["engine"]
        free = None
        if case["holder_mib"]:
            clean = plan_sglang(gpureap, case)
            free = clean["budget"]["free_at_start"] // MIB - case["holder_mib"]
        a_priori = plan_sglang(gpureap, case, free)
        own = plan_sglang(gpureap, case, free, f"tests/fixtures/logs/{case['file']}")
        tokens = eng["kv_tokens"]
        a_cell = cell(tokens, a_priori["device"]["tokens_per_rank"])[0]
        l_cell = cell(tokens, own["calibration"]["predicted_tokens"])[0]
        fraction = f"{eng['mem_fraction_static']:g}, {a_priori['device']['mem_fraction']:g}"
        weights = f"{eng['weights_gib']:.2f}, {a_priori['budget']['weights_per_gpu'] / GIB:.2f}"
        rows.append(f"| {name} | {tokens:,} | {a_cell} | {l_cell} | {fraction} | {weights} |")
    return "\n".join(rows)


def between(text, begin, end, table):
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + "\n" + table + "\n" + text[stop:]


def main():
    gpureap = sys.argv[1]
    check = "--check" in sys.argv[2:]
    corpus = json.loads(Path("tests/fixtures/logs/corpus.json").read_text())
    rows = ["| case | vLLM 0.26.0 logged | plan a priori | plan `--from-log` (its own log) | concurrency: logged, a priori |",
            "|---|---|---|---|---|"]
    for name, case in sorted(corpus["cases"].items()):
        eng = case["engine"]
        engine = f"{eng['kv_tokens']:,}" if eng["kv_tokens"] else "refuses"
        log = f"tests/fixtures/logs/{case['file']}"
        a_priori, err = plan(gpureap, case)
        a_cell = err if err else cell(eng["kv_tokens"], figure(a_priori))[0]
        logged, err = plan(gpureap, case, log)
        l_cell = err if err else cell(eng["kv_tokens"], figure(logged))[0]
        mine = a_priori and concurrency(a_priori)
        if eng["max_concurrency"] and mine:
            err = (mine - eng["max_concurrency"]) / eng["max_concurrency"] * 100
            c_cell = f"{eng['max_concurrency']:.2f}x, {mine:.2f}x ({err:+.2f} %)"
        else:
            c_cell = "—"
        rows.append(f"| {name} | {engine} | {a_cell} | {l_cell} | {c_cell} |")
    table = "\n".join(rows)
    sglang = sglang_rows(gpureap, corpus["sglang"]["cases"])
    doc = Path("docs/plan.md")
    text = doc.read_text()
    new = between(between(text, BEGIN, END, table), SGL_BEGIN, SGL_END, sglang)
    print(table)
    print()
    print(sglang)
    if check:
        sys.exit(0 if new == text else 1)
    doc.write_text(new)


if __name__ == "__main__":
    main()
