#!/usr/bin/env bash
# Hardware evidence and `reset --plan` on a real GPU through NVML (docs/evidence.md,
# docs/gpu-validation.md). Read-only: it resets nothing, signals only what it started.
#
#   scripts/gpu_evidence_validate.sh GPUREAP [GPU] [OUT]
#
# 1. What gpureap reads (status --json: gpus[].evidence) beside what nvidia-smi -q says of the
#    same GPU: PCI bus id, ECC uncorrectable volatile/aggregate, retired pages pending, row
#    remapping pending/failure, recovery action, persistence mode; the Xids in the kernel log
#    (dmesg) beside gpus[].evidence.xid_counts. A value nvidia-smi shows as N/A must be null
#    in gpureap's JSON, never 0.
# 2. The exporter's families for them (status --prometheus).
# 3. `gpureap reset --plan --gpu GPU` on the idle GPU, then with a real CUDA holder
#    (scripts/cuda_holder.py, PyTorch) on it: the holder must be named as a CUDA user and the
#    exit code must be 1; the GPU's memory and the holder are checked untouched after.
# 4. A user's forged Xid line written to /dev/kmsg (as root: facility user) must not count.
#    Skipped unless GPUREAP_VALIDATE_KMSG_WRITE=1: it adds one line to the host's kernel log.
# Prints PASS/FAIL lines; exits 0 when none failed.
set -u
gpureap=$(realpath "$1")
gpu=${2:-0}
out=${3:-$(mktemp -d)}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
failed=0
pass() { echo "PASS $*" | tee -a "$out/validate.log"; }
fail() { echo "FAIL $*" | tee -a "$out/validate.log"; failed=1; }
info() { echo "INFO $*" | tee -a "$out/validate.log"; }

# 1. The fields, gpureap's and nvidia-smi's.
"$gpureap" status --gpu "$gpu" --json > "$out/status.json"; echo "status exit $?" >> "$out/validate.log"
nvidia-smi -q -i "$gpu" > "$out/nvidia-smi-q.txt" 2>&1
nvidia-smi -q -i "$gpu" -d ECC,PAGE_RETIREMENT,ROW_REMAPPER > "$out/nvidia-smi-ecc.txt" 2>&1
python3 - "$out/status.json" "$out/nvidia-smi-q.txt" "$gpu" <<'EOF' | tee -a "$out/validate.log"
import json, re, sys
doc = json.load(open(sys.argv[1]))
smi = open(sys.argv[2]).read()
gpu = [g for g in doc["gpus"] if g["index"] == int(sys.argv[3])][0]
ev = gpu.get("evidence")
if ev is None:
    print("FAIL no gpus[].evidence in status --json"); sys.exit(0)
print("INFO evidence", json.dumps(ev, sort_keys=True))
print("INFO advice", json.dumps(gpu.get("advice")))
bus = re.search(r"^\s*Bus Id\s*:\s*(\S+)", smi, re.M)
if bus and ev["pci_bus_id"] and bus.group(1).lower() == ev["pci_bus_id"].lower():
    print("PASS pci_bus_id", ev["pci_bus_id"], "= nvidia-smi", bus.group(1))
else:
    print("FAIL pci_bus_id", ev["pci_bus_id"], "nvidia-smi", bus and bus.group(1))
def smi_after(section, key):
    # The value of `key` in the first block after the line `section`.
    # Within that block only (until the next line indented no deeper than the
    # section's), and the value up to the end of its own line.
    m = re.search(r"^([ \t]*)" + re.escape(section) + r"[ \t]*$", smi, re.M)
    if not m:
        return None
    block = []
    for line in smi[m.end():].splitlines()[1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= len(m.group(1)):
            break
        block.append(line)
    for line in block:
        k = re.match(r"^\s*" + re.escape(key) + r"\s*:\s*([^\n]*?)\s*$", line)
        if k:
            return k.group(1)
    return None
checks = [
    ("ecc_volatile_uncorrected", smi_after("Volatile", "DRAM Uncorrectable") or smi_after("Volatile", "Total")),
    ("ecc_aggregate_uncorrected", smi_after("Aggregate", "DRAM Uncorrectable") or smi_after("Aggregate", "Total")),
    ("row_remap_pending", smi_after("Remapped Rows", "Pending")),
    ("row_remap_failure", smi_after("Remapped Rows", "Remapping Failure Occurred")),
    ("retired_pages_pending", smi_after("Retired Pages", "Pending Page Blacklist") or smi_after("Retired Pages", "Pending")),
]
for field, shown in checks:
    ours = ev.get(field)
    if shown is None or shown.startswith("N/A"):
        verdict = "PASS" if ours is None else ("INFO" if ours in (0, False) else "FAIL")
    elif shown in ("Yes", "No"):
        verdict = "PASS" if ours == (shown == "Yes") else "FAIL"
    elif shown.isdigit():
        verdict = "PASS" if ours == int(shown) else "FAIL"
    else:
        verdict = "INFO"
    print(verdict, field, "gpureap", json.dumps(ours), "nvidia-smi", repr(shown))
print("INFO recovery_action", json.dumps(ev.get("recovery_action")))
persistence = re.search(r"^\s*Persistence Mode\s*:\s*(\S+)", smi, re.M)
print("INFO nvidia-smi persistence mode", persistence and persistence.group(1))
EOF
# The kernel log's Xids for this GPU, as dmesg shows them, beside gpureap's counts.
bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "$gpu" | tr 'A-F' 'a-f' | sed 's/^0000//; s/\.0$//')
dmesg 2>/dev/null | grep -F "NVRM: Xid (PCI:$bus)" > "$out/dmesg-xid.txt"
info "dmesg Xid lines for PCI:$bus: $(wc -l < "$out/dmesg-xid.txt") (gpureap's counts: $(python3 -c "import json; d=json.load(open('$out/status.json')); print([g['evidence']['xid_counts'] for g in d['gpus'] if g['index']==$gpu][0])"))"

# 2. The exposition.
"$gpureap" status --prometheus > "$out/metrics.prom"
grep -E '^gpureap_gpu_(xid_events_total|row_remap|retired_pages|ecc_uncorrected|recovery_action)' "$out/metrics.prom" | grep "gpu=\"$gpu\"" | tee -a "$out/validate.log"
if command -v promtool >/dev/null; then
    promtool check metrics < "$out/metrics.prom" && pass "promtool check metrics" || fail "promtool check metrics"
fi

# 3. reset --plan, idle and with a real CUDA holder. Never a reset.
before=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$gpu")
"$gpureap" reset --plan --gpu "$gpu" > "$out/reset-plan-idle.txt"; code=$?
cat "$out/reset-plan-idle.txt" | tee -a "$out/validate.log"
info "reset --plan on the idle GPU: exit $code (0: a reset could run now; 1: blockers named above)"
ready=$(mktemp -u /tmp/evidence.XXXXXX)
CUDA_DEVICE_ORDER=PCI_BUS_ID python3 "$root/scripts/cuda_holder.py" hold 2 "$ready" --gpu "$gpu" &
holder=$!
trap 'kill -9 $holder 2>/dev/null; rm -f "$ready"' EXIT
for _ in $(seq 600); do [ -e "$ready" ] && break; sleep 0.1; done
"$gpureap" reset --plan --gpu "$gpu" > "$out/reset-plan-held.txt"; code=$?
cat "$out/reset-plan-held.txt" | tee -a "$out/validate.log"
[ "$code" = 1 ] && pass "reset --plan with a CUDA holder exits 1" || fail "reset --plan with a CUDA holder exits $code"
grep -q "blocker pid $holder (.*CUDA user)" "$out/reset-plan-held.txt" \
    && pass "the holder $holder is named as a CUDA user" || fail "the holder $holder is not named as a CUDA user"
kill -0 $holder 2>/dev/null && pass "the holder is untouched" || fail "the holder is gone"
after=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$gpu")
info "memory used before the holder ${before} MiB, with it ${after} MiB"
kill -9 $holder 2>/dev/null; wait $holder 2>/dev/null

# 4. A forged Xid through /dev/kmsg (opt-in: it writes to the host's kernel log).
if [ "${GPUREAP_VALIDATE_KMSG_WRITE:-0}" = 1 ]; then
    count79() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print([g['evidence']['xid_counts'] for g in d['gpus'] if g['index']==$gpu][0].get('79', 0))" "$1"; }
    before79=$(count79 "$out/status.json")
    printf '<3>NVRM: Xid (PCI:%s): 79, pid=1, name=forged, written by gpu_evidence_validate.sh\n' "$bus" > /dev/kmsg
    "$gpureap" status --gpu "$gpu" --json > "$out/status-forged.json"
    after79=$(count79 "$out/status-forged.json")
    [ "$before79" = "$after79" ] && pass "forged Xid 79 not counted ($after79 before and after)" \
        || fail "forged Xid 79 counted: $before79 before, $after79 after"
else
    info "forged /dev/kmsg line skipped (GPUREAP_VALIDATE_KMSG_WRITE=1 to run it)"
fi
echo "results in $out"
exit $failed
