#!/usr/bin/env bash
# Times `gpureap slurm epilog` as slurmd runs it, on the simulated driver:
# a job without GPUs, a clean job with 2 GPUs, and a job whose escaped worker
# (uid nobody, SLURM_JOB_ID in its environment) still holds GPU 0.
# Usage (as root, from the repository): cargo build --release && contrib/slurm/bench-epilog.sh
set -euo pipefail
gpureap=${GPUREAP:-$(cd "$(dirname "$0")/../.." && pwd)/target/release/gpureap}
command -v hyperfine >/dev/null || { echo "needs hyperfine (apt-get install hyperfine)" >&2; exit 2; }
D=$(mktemp -d /tmp/gpureap-bench-epilog-XXXXXX)
trap 'rm -rf "$D"' EXIT
chmod 755 "$D"; mkdir -m 1777 "$D/claims"
touch "$D/nvidia0" "$D/nvidia1" "$D/nvidiactl"; chmod 666 "$D"/nvidia*
export GPUREAP_BACKEND=sim:$D SLURM_JOB_ID=42 SLURM_JOB_UID=65534 SLURMD_NODENAME=bench
# Start the leftover: nobody's process, detached from this shell, holding GPU 0.
leftover="setsid setpriv --reuid=65534 --regid=65534 --clear-groups \
  bash -c 'exec 3<$D/nvidia0; exec -a leftover_worker sleep 1000' </dev/null >/dev/null 2>&1 &
  until pgrep -f -u 65534 '^leftover_worker' >/dev/null; do sleep 0.01; done"
echo "processes on this host: $(ls -d /proc/[0-9]* | wc -l)"
hyperfine -N --warmup 5 --runs ${RUNS:-50} \
  -n 'gpureap --version (starting the binary)' "$gpureap --version" \
  -n 'no GPUs' "env -u SLURM_JOB_GPUS $gpureap slurm epilog" \
  -n 'clean, 2 GPUs' "env SLURM_JOB_GPUS=0,1 $gpureap slurm epilog"
hyperfine --warmup 2 --runs ${RUNS:-50} --prepare "$leftover" \
  -n 'leftover on GPU 0' "SLURM_JOB_GPUS=0,1 $gpureap slurm epilog --grace 2s"
