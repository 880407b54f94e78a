#!/usr/bin/env python3
"""Check, on a real GPU, that a holder in a Kubernetes pod's cgroup is attributed and freed by pod.

    sudo python3 scripts/gpu_container_validate.py [PATH_TO_GPUREAP] [--gpu N] [--gib G] [--out DIR]

Needs root (it makes cgroups), a cgroup v2 mount, python3 with PyTorch, nvidia-smi. It makes
a cgroup laid out as a kubelet with the systemd driver and containerd make a pod's container
(`kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID_>.slice/
cri-containerd-<ID>.scope`, under a root of its own, `gpureap-validate-<PID>`, in the v2
mount), starts a PyTorch holder in it (scripts/cuda_holder.py, titled as a vLLM server) that
holds G GiB (default 8) on GPU N (default 0), then:

  - `gpureap status --json` and the table: the holder's `container` is containerd, the id, the
    pod UID, and its local PID is none (no PID namespace of its own);
  - `gpureap free --pod UID --dry-run --json`: the holder is the one target, nothing signalled;
  - `gpureap free --pod UID --grace 5s --timeout 30s --yes --json`: exit 0, the GPU verified
    freed, the holder gone;
  - memory.used from nvidia-smi before the holder, while it holds, and after the free.

It prints one PASS/FAIL line per check, the figures, and a summary; exit 1 if a check failed.
It signals only what it started (by PID and start time) and removes its cgroups. With
GPUREAP_VALIDATE_SIM=DIR (tests/gpu_sim/simulate.py) it dry-runs on the simulated driver, where
the memory figures are the simulated driver's (status's), not nvidia-smi's.
Results are recorded in docs/gpu-validation.md.
"""

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import gpuval
from gpuval import GIB, Processes, Report, backend, child_env, exit_text, new_tag, record, sim_dir

HERE = Path(__file__).resolve().parent
HOLDER = HERE / "cuda_holder.py"
TITLE = "python3 -m vllm.entrypoints.openai.api_server --model meta-llama/Llama-3.1-8B-Instruct"


def cgroup2_mount():
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split() and right.split()[0] == "cgroup2":
            return Path(left.split()[4])
    return None


def gpureap(binary, report, name, *args):
    """Runs gpureap with the backend; saves and returns (exit code, stdout)."""
    command = [binary, "--backend", backend(), *args]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=180)
    report.save(f"{name}.txt", f"$ {' '.join(command)}\n{done.stdout}\n--- stderr\n{done.stderr}exit {done.returncode}\n")
    return done.returncode, done.stdout, done.stderr


def memory_used(binary, report, gpu):
    """memory.used of GPU `gpu` in bytes: nvidia-smi's, or the simulated driver's."""
    if sim_dir():
        _, out, _ = gpureap(binary, report, "sim-memory", "status", "--json")
        return next(row["memory_used"] for row in json.loads(out)["gpus"] if row["index"] == gpu)
    out = subprocess.run(
        ["nvidia-smi", f"--id={gpu}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return int(out.strip().splitlines()[0]) * (1 << 20)


def remove_tree(path):
    """Removes an emptied cgroup tree, deepest first, retrying while a reaped process keeps it busy."""
    deadline = time.time() + 10
    while path.exists():
        try:
            for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                sub.rmdir()
            path.rmdir()
        except OSError:
            if time.time() > deadline:
                return False
            time.sleep(0.05)
    return True


def gib(value):
    return "?" if value is None else f"{value / GIB:.2f} GiB"


def main():
    args = gpuval.parse_args(
        sys.argv[1:],
        __doc__.splitlines()[0],
        lambda parser: parser.add_argument("--gib", type=float, default=8.0, help="GiB the holder allocates"),
    )
    gpu = (args.gpu or [0])[0]
    report = Report(args.out, "gpu_container_validate.log")
    mount = cgroup2_mount()
    if mount is None or not Path("/proc/self/cgroup").exists():
        report.skip("cgroup v2", "no cgroup2 mount")
        return finish(report)
    uid = str(uuid.uuid4())
    container_id = secrets.token_hex(32)
    root = mount / f"gpureap-validate-{os.getpid()}"
    leaf = (
        root
        / "kubepods.slice/kubepods-burstable.slice"
        / f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
        / f"cri-containerd-{container_id}.scope"
    )
    tag = new_tag()
    pids_file = Path(args.out or "/tmp") / f"gpureap-container-validate-{tag}.pids"
    processes = Processes(pids_file, tag)
    try:
        leaf.mkdir(parents=True)
        report.log(f"pod UID {uid}, container {container_id}")
        report.log(f"cgroup {leaf}")
        before = memory_used(args.binary, report, gpu)
        ready = pids_file.with_suffix(".ready")
        script = (
            f"echo $$ > '{leaf}/cgroup.procs' && {record(TITLE)}"
            f"exec -a '{TITLE}' python3 '{HOLDER}' hold {args.gib} '{ready}' --gpu {gpu}"
        )
        processes.popen(
            ["bash", "-c", script],
            env=child_env(tag, P=str(pids_file)),
            stdin=subprocess.DEVNULL,
        )
        deadline = time.time() + 180
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.1)
        if not report.check("the holder allocated its memory in the pod's cgroup", ready.exists()):
            return finish(report)
        pid = processes.pid(TITLE)
        in_cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        line = next((line for line in in_cgroup.splitlines() if container_id in line), in_cgroup.strip())
        report.check("the holder runs in the cgroup", container_id in line, line)
        held = memory_used(args.binary, report, gpu)

        code, out, err = gpureap(args.binary, report, "status-json", "status", "--json")
        status = json.loads(out) if out.strip() else {}
        holder = next((h for h in status.get("holders", []) if h.get("pid") == pid), None)
        container = (holder or {}).get("container") or {}
        report.check("status --json lists the holder", holder is not None, exit_text(code))
        report.check("its runtime is containerd", container.get("runtime") == "containerd", container)
        report.check("its container id", container.get("id") == container_id)
        report.check("its pod UID", container.get("pod_uid") == uid)
        code, table, _ = gpureap(args.binary, report, "status", "status")
        report.log(table)
        report.check("the table shows the container", container_id[:12] in table)

        code, out, err = gpureap(args.binary, report, "free-dry-run", "free", "--pod", uid, "--dry-run", "--json")
        plan = json.loads(out) if out.strip() else {}
        planned = [target["pid"] for target in plan.get("targets", [])]
        report.check("free --pod UID --dry-run plans the holder alone", code == 0 and planned == [pid], f"{exit_text(code)}, {planned} {err.strip()}")
        report.check("the dry run signalled nothing", gpuval.alive(pid))

        started = time.time()
        code, out, err = gpureap(
            args.binary, report, "free", "free", "--pod", uid, "--grace", "5s", "--timeout", "30s", "--yes", "--json"
        )
        took = time.time() - started
        freed = json.loads(out) if out.strip() else {}
        outcome = next((row for row in freed.get("gpus", []) if row.get("index") == gpu), {})
        report.check("free --pod UID exits 0", code == 0, f"{exit_text(code)} {err.strip()}")
        report.check("it took the holder", [t["pid"] for t in freed.get("targets", [])] == [pid])
        report.check(f"GPU {gpu} verified freed", outcome.get("freed") is True, outcome.get("reasons"))
        report.check("the holder is gone", not gpuval.alive(pid))
        after = memory_used(args.binary, report, gpu)
        source = "simulated driver" if sim_dir() else "nvidia-smi"
        report.log(f"memory.used on GPU {gpu} ({source}): before {gib(before)}, holding {gib(held)}, after free {gib(after)}")
        report.log(
            f"gpureap free: {exit_text(code)} in {took:.2f} s; freed {gib(outcome.get('freed_bytes'))}"
            f" after {outcome.get('freed_after_ms')} ms; memory {gib(outcome.get('memory_before'))} -> {gib(outcome.get('memory_after'))}"
        )
        report.check("memory came back to within 256 MiB of before", after is not None and after <= before + gpuval.SLACK, f"{gib(before)} -> {gib(after)}")
    finally:
        processes.kill_all()
        removed = remove_tree(root)
        report.check("its cgroups are removed", removed, str(root))
        pids_file.unlink(missing_ok=True)
        pids_file.with_suffix(".ready").unlink(missing_ok=True)
    return finish(report)


def finish(report):
    line, failed, code = report.summary()
    report.log(line + (f" (failed: {', '.join(failed)})" if failed else ""))
    report.close()
    return code


if __name__ == "__main__":
    if shutil.which("bash") is None:
        raise SystemExit("needs bash")
    sys.exit(main())
