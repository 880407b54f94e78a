#!/usr/bin/env bash
# Peak memory of `gpureap status --json` on a real NVIDIA host against nvidia-smi's
# (`--query-compute-apps`), at about 100 and 5,000 extra idle processes (bench/crowd.py),
# 9 runs each, interleaved, with the binary's own malloc arena cap (1) beside
# MALLOC_ARENA_MAX=2 and glibc's default (8 per core: MALLOC_ARENA_MAX=8*cores), and the
# figures at exit (RssAnon, RssFile, malloc arenas: GPUREAP_LOG=debug, or gdb where present).
# Issue 28 item 2: peak RSS at most nvidia-smi's.
#
#   scripts/gpu_memory.sh PATH_TO_GPUREAP --out DIR
#
# Writes DIR/memory.md (the tables), DIR/memory.md.json (every run) and prints PASS/FAIL:
# status's median peak at 100 extra processes at most nvidia-smi's median peak. Starts only
# its own processes (the crowd, ended by bench/crowd.py on every path); about 3 minutes on
# 16 cores. Exits non-zero on a FAIL or an error.
set -euo pipefail
BIN=$(realpath "${1:?usage: scripts/gpu_memory.sh PATH_TO_GPUREAP --out DIR}")
[ "${2:-}" = "--out" ] || { echo "usage: scripts/gpu_memory.sh PATH_TO_GPUREAP --out DIR" >&2; exit 2; }
OUT=${3:?usage: scripts/gpu_memory.sh PATH_TO_GPUREAP --out DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
CORES=$(nproc)
python3 bench/memory.py --gpu --crowds 100,5000 --runs 9 --out "$OUT/memory.md" \
    "capped=$BIN" "arena2=$BIN,MALLOC_ARENA_MAX=2" "glibc=$BIN,MALLOC_ARENA_MAX=$((8 * CORES))" \
    nvidia-smi=nvidia-smi
python3 - "$OUT/memory.md.json" <<'EOF'
import json, statistics, sys
runs = json.load(open(sys.argv[1]))
ok = True
for crowd, configs in runs.items():
    smi = statistics.median(configs["nvidia-smi"]["peak_kib"])
    for name, figures in configs.items():
        if name == "nvidia-smi":
            continue
        peak = statistics.median(figures["peak_kib"])
        verdict = "PASS" if peak <= smi else "FAIL"
        if crowd == "100" and name == "capped":
            ok = ok and peak <= smi
        else:
            verdict = "INFO"
        print(f"{verdict}: {crowd} extra processes, {name}: status peak {peak / 1024:.1f} MiB, "
              f"nvidia-smi {smi / 1024:.1f} MiB; at exit {figures['at_exit']} {figures['mappings']}")
sys.exit(0 if ok else 1)
EOF
