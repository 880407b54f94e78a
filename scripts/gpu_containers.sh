#!/bin/bash
# A real CUDA holder in a cgroup laid out as the kubelet and containerd lay out a pod's container
# (docs/gpu-validation.md): what status (table, --tree, JSON), the exposition and check make of
# it through NVML; then gpureap in a PID namespace of its own, as in a container without the
# host's PIDs (the holder hidden, the note and its remedy); then the free (by pod where this build
# has `free --pod`, else by PID).
#
#   bash scripts/gpu_containers.sh GPUREAP OUTDIR   (as root, from the repository's root, on GPU 0)
G=$1; OUT=$2; set -u
export PYTHONPATH=$(python3 -c "import sys; print(':'.join(p for p in sys.path if p))") CUDA_DEVICE_ORDER=PCI_BUS_ID
mount=$(awk '{split($0, sides, " - "); split(sides[2], right, " "); if (right[1] == "cgroup2") {split(sides[1], left, " "); print left[5]; exit}}' /proc/self/mountinfo)
[ -n "$mount" ] || { echo "no cgroup v2 mount"; exit 3; }
home="$mount$(sed -n 's/^0:://p' /proc/self/cgroup)"
uid=8c1f2a3b-4d5e-6f70-8192-a3b4c5d6e7f8
id=4444444444444444444444444444444444444444444444444444444444444444
root="$mount/gpureap-gpu-$$"
scope="$root/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${uid//-/_}.slice/cri-containerd-$id.scope"
mkdir -p "$scope" || { echo "cannot make $scope"; exit 3; }
ready=$(mktemp -u /tmp/containers.XXXXXX)
# Into the pod's cgroup first, then CUDA: the context is made inside it, as a container's is.
( echo $BASHPID > "$scope/cgroup.procs" && exec -a vllm-worker python3 scripts/cuda_holder.py hold 2 $ready --gpu 0 ) &
pid=$!
cleanup() {
  kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
  for dir in $(find "$root" -depth -type d); do
    for p in $(cat "$dir/cgroup.procs" 2>/dev/null); do echo $p > "$home/cgroup.procs"; done
    rmdir "$dir"
  done
  rm -f "$ready"
}
trap cleanup EXIT
for i in $(seq 300); do [ -e $ready ] && break; sleep 0.1; done
echo "holder pid $pid in $(sed -n 's/^0:://p' /proc/$pid/cgroup)"
"$G" status > $OUT/c-status.txt; echo "status exit $?"
"$G" status --tree > $OUT/c-tree.txt; echo "tree exit $?"
"$G" status --json > $OUT/c-status.json; echo "json exit $?"
python3 - "$OUT/c-status.json" $pid $id $uid <<'EOF'
import json, sys
document, pid, cid, uid = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3], sys.argv[4]
holder = next(h for h in document["holders"] if h["pid"] == pid)
container = holder["container"]
print("container", json.dumps(container))
print("ATTRIBUTED" if container and container["runtime"] == "containerd" and container["id"] == cid
      and container["pod_uid"] == uid else "NOT ATTRIBUTED")
EOF
grep -c "containerd:444444444444" $OUT/c-status.txt
grep "\[container containerd:444444444444\]" $OUT/c-tree.txt | head -1
"$G" status --prometheus --per-process > $OUT/c-metrics.prom; echo "prometheus exit $?"
grep "pid=\"$pid\"" $OUT/c-metrics.prom | grep -o "runtime=\"[^\"]*\"\|container_id=\"[^\"]*\"\|pod_uid=\"[^\"]*\""
# A container without the host's PIDs: NVML lists the host PID, which names nothing there.
unshare --pid --fork --mount-proc "$G" status > $OUT/c-ns-status.txt; echo "status in own PID namespace exit $?"
unshare --pid --fork --mount-proc "$G" status --json > $OUT/c-ns-status.json
python3 -c "import json; v = json.load(open('$OUT/c-ns-status.json'))['visibility']; print('visibility', json.dumps(v))"
unshare --pid --fork --mount-proc "$G" check --gpu 0 > $OUT/c-ns-check.txt; echo "check in own PID namespace exit $?"
head -1 $OUT/c-ns-check.txt
if "$G" free --help | grep -q -- "--pod"; then
  "$G" free --pod $uid --grace 1s --yes > $OUT/c-free.txt; echo "free --pod exit $?"
else
  "$G" free --pid $pid --grace 1s --yes > $OUT/c-free.txt; echo "free --pid (no --pod in this build) exit $?"
fi
cat $OUT/c-free.txt
"$G" wait --gpu 0 --timeout 5s; echo "wait exit $?"
