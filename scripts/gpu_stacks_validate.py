#!/usr/bin/env python3
"""Check on real GPUs that a hung server's bundle says where it hangs: the
Python and native stacks of a server-like process tree stuck on the GPU.

    python3 scripts/gpu_stacks_validate.py [PATH_TO_GPUREAP] [--gpu LIST] [--out DIR]
                                           [--py-spy FILE]

Two servers, each a launcher with ranks titled `sglang::scheduler_TP<r>` (as
SGLang's setproctitle titles them):

  nccl   two ranks join a real NCCL process group (torch.distributed, a TCP
         store); rank 0 calls all_reduce on a CUDA tensor in
         `hang_in_nccl_allreduce`, rank 1 never joins the collective, so rank 0
         waits in NCCL's communicator set-up for a peer that never comes. Run
         under `gpureap run` with a readiness line that never comes: while it
         hangs, `gpureap run --dump` must get a bundle from the supervisor;
         then the stall must write a bundle whose stacks name NCCL and the
         Python function, before the stop's first signal, and the GPUs must
         be freed.
  cuda   one rank launches a kernel that spins on the GPU (torch.cuda._sleep)
         and waits for it in `wait_for_cuda_kernel` (torch.cuda.synchronize).
         Read with `gpureap dump --pid LAUNCHER` and `gpureap dump --gpu G`:
         the stacks must name the synchronize call and the Python function.

What to carry to a GPU machine that reaches no registry: py-spy, as PyPI's
wheel, in the repository's ignored `.whl/` folder:

    python3 -m pip download -q --no-deps py-spy==0.4.3 -d .whl
    (py_spy-0.4.3-py2.py3-none-manylinux1_x86_64.manylinux_2_5_x86_64.whl, 2.9 MB)

and run with `carry: [".whl"]`. The script takes py-spy from --py-spy (a wheel
or the binary), else from PATH, else from `.whl/py_spy-*.whl`; a wheel is
unpacked into the work folder (its `py-spy` binary; nothing is installed).
Without any, the checks that need py-spy say SKIP, and the kernel stacks and
the install note are checked instead. A dry run without a GPU:
`python3 tests/gpu_sim/simulate.py 2 -- python3 scripts/gpu_stacks_validate.py
target/debug/gpureap` (the stand-ins of tests/gpu_sim mimic where NCCL and
CUDA wait, in Python; the native-frame checks say SKIP there). Needs NVIDIA GPUs, PyTorch with CUDA and NCCL,
pynvml; root (py-spy attaches with ptrace; kernel stacks are root's). Uses the
GPUs no other process uses (or --gpu LIST), one or two. Signals only what it
started (known by PID and start time, tagged in their environment). Prints
PASS/FAIL/SKIP lines and `N passed, M failed, K skipped`; exit 1 on failure, 2
if it could not start. With --out DIR it keeps its log, gpureap's events and
both bundles (stacks.txt, summary.txt, bundle.json).
"""

import glob
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zipfile
from pathlib import Path

import gpuval as gv

HERE = Path(__file__).resolve().parent
SCRIPT = Path(__file__).resolve()
# About 500 s of spinning at an H200's 1.98 GHz: longer than the check.
SPIN_CYCLES = 1_000_000_000_000


# ---------------------------------------------------------------- the server (roles)


def hang_in_nccl_allreduce(device):
    """Rank 0: the first collective creates the NCCL communicator, which
    waits for rank 1 in NCCL's bootstrap."""
    import torch
    import torch.distributed as dist

    tensor = torch.ones(1, device=f"cuda:{device}")
    dist.all_reduce(tensor)
    torch.cuda.synchronize(device)


def wait_outside_the_collective():
    """Rank 1: joined the group, never calls the collective."""
    while True:
        time.sleep(3600)


def wait_for_cuda_kernel(device):
    """A kernel that spins on the GPU, and the host waiting for it."""
    import torch

    torch.cuda._sleep(SPIN_CYCLES)
    torch.cuda.synchronize(device)


def rank_main(scenario, rank, world, port, device):
    import torch

    torch.cuda.set_device(device)
    torch.ones(1, device=f"cuda:{device}")  # a context, so the driver lists this rank on its GPU
    print(f"[TP{rank}] Init torch distributed begin.", flush=True)
    if scenario == "nccl":
        import torch.distributed as dist

        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        print(f"[TP{rank}] Init torch distributed ends.", flush=True)
        if rank == 0:
            print("[TP0] entering all_reduce", flush=True)
            hang_in_nccl_allreduce(device)
        else:
            print("[TP1] waiting outside the collective", flush=True)
            wait_outside_the_collective()
    else:
        print("[TP0] entering the spinning kernel", flush=True)
        wait_for_cuda_kernel(device)


def server_main(scenario, devices, port):
    """The launcher: ranks titled as SGLang's, then it waits on them."""
    world = 2 if scenario == "nccl" else 1
    print(f"server_args=ServerArgs(scenario={scenario!r}, tp_size={world})", flush=True)
    ranks = []
    for rank in range(world):
        device = devices[rank % len(devices)]
        argv = [f"sglang::scheduler_TP{rank}", str(SCRIPT), "rank", scenario, str(rank), str(world), str(port), str(device)]
        ranks.append(subprocess.Popen(argv, executable=sys.executable))
    for child in ranks:
        child.wait()


# ---------------------------------------------------------------- py-spy


def find_py_spy(given, work):
    """The py-spy binary: --py-spy (a wheel or a binary), PATH, `.whl/`."""
    candidates = [given] if given else []
    on_path = shutil.which("py-spy")
    if on_path:
        candidates.append(on_path)
    candidates += sorted(glob.glob(str(gv.ROOT / ".whl" / "py_spy-*.whl")))
    for candidate in candidates:
        if candidate.endswith(".whl"):
            with zipfile.ZipFile(candidate) as wheel:
                names = [name for name in wheel.namelist() if name.endswith("/scripts/py-spy")]
                if not names:
                    continue
                target = work / "py-spy-bin" / "py-spy"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(wheel.read(names[0]))
                target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
                return target
        elif os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


# ---------------------------------------------------------------- checks


def frames_of(process):
    return [frame for thread in process.get("threads", []) for frame in thread.get("frames", [])]


def find_process(bundle, label):
    for process in bundle.get("stacks", {}).get("processes", []):
        if process.get("label") == label:
            return process
    return None


def check_rank(r, name, bundle, label, python_function, native_words, with_py_spy):
    """The rank's stacks name its Python function and a native frame with one of `native_words`."""
    process = find_process(bundle, label)
    if not r.check(f"{name}: the bundle has {label}'s stacks", process is not None, bundle.get("stacks", {}).get("summary")):
        return
    frames = frames_of(process)
    r.log(f"  {label}: source {process.get('source')}, waits in {process.get('waits_in')!r}, note {process.get('note')!r}")
    for frame in frames[:40]:
        r.log(f"    {frame}")
    if not with_py_spy:
        kernel = [frame for thread in process.get("threads", []) for frame in thread.get("kernel", []) + [thread.get("wchan") or ""]]
        r.check(f"{name}: without py-spy, {label}'s kernel stacks or wchan are read", any(kernel), kernel[:5])
        r.skip(f"{name}: {label}'s Python and native frames", "no py-spy (see the header: carry the wheel)")
        return
    r.check(f"{name}: py-spy read {label}", process.get("source") == "py-spy", process.get("note"))
    r.check(f"{name}: {label}'s stacks name {python_function}", any(frame.startswith(python_function + " (") for frame in frames))
    if gv.sim_dir():
        r.skip(f"{name}: {label}'s native frames", "a dry run: the stand-ins have no native frames")
        return
    # Native frames only (`ncclCommInitRank (libnccl.so.2)`), not Python ones (`f (x.py:3)`).
    native = [frame for frame in frames if ".py:" not in frame.rsplit(" (", 1)[-1]]
    matching = [frame for frame in native if any(word in frame.lower() for word in native_words)]
    r.check(f"{name}: {label}'s native frames show {'/'.join(native_words)}", bool(matching), matching[:5])


def keep_bundle(r, folder, prefix):
    for name in ("summary.txt", "stacks.txt", "bundle.json", "processes.txt"):
        path = Path(folder) / name
        if path.exists():
            r.save(f"{prefix}-{name}", path.read_text(errors="replace"))


def read_lines(stream, sink, seen):
    for raw in iter(stream.readline, ""):
        line = raw.rstrip("\n")
        sink.append((time.time(), line))
        seen.set()


def wait_for_line(lines, text, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if any(text in line for _, line in list(lines)):
            return True
        time.sleep(0.1)
    return False


def free_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def nccl_under_run(r, args, work, env, gpus, with_py_spy):
    """The NCCL hang under `gpureap run`: stall, bundle with stacks, stop, freed."""
    state = work / "state"
    devices = ",".join(str(gpu) for gpu in gpus)
    command = [
        args.binary, "--backend", gv.backend(), "run", "--ready-log", "NEVER-READY-LINE", "--stall-timeout", "30s",
        "--startup-timeout", "5m", "--grace", "5s", "--restart", "never", "--state-dir", str(state), "--",
        sys.executable, str(SCRIPT), "server", "nccl", devices, str(free_port()),
    ]
    r.log("$ " + " ".join(command))
    events, seen, output = [], threading.Event(), []
    supervisor = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader = threading.Thread(target=read_lines, args=(supervisor.stderr, events, seen), daemon=True)
    reader.start()
    threading.Thread(target=read_lines, args=(supervisor.stdout, output, threading.Event()), daemon=True).start()
    # While it hangs, before the stall is judged: a bundle on demand.
    if r.check("nccl: TP0 reaches its all_reduce", wait_for_line(output, "[TP0] entering all_reduce", 150)):
        asked = subprocess.run([args.binary, "run", "--dump", "--state-dir", str(state)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=150)
        r.log(f"$ gpureap run --dump --state-dir {state}: {gv.exit_text(asked.returncode)}; {asked.stdout.strip()} {asked.stderr.strip()}")
        folder = asked.stdout.strip().rsplit(": ", 1)[-1] if asked.returncode == 0 else ""
        if r.check("nccl: gpureap run --dump gets a bundle from the supervisor", folder.endswith("-dump"), asked.stdout.strip()):
            on_demand = json.loads((Path(folder) / "bundle.json").read_text())
            keep_bundle(r, folder, "nccl-on-demand")
            r.log(f"  on demand: {on_demand['stacks']['summary']}; read in {on_demand['stacks']['seconds']:.1f}s")
    try:
        code = supervisor.wait(timeout=240)
    except subprocess.TimeoutExpired:
        supervisor.send_signal(signal.SIGTERM)
        code = supervisor.wait(timeout=120)
    reader.join(timeout=5)
    text = "\n".join(f"{stamp:.3f} {line}" for stamp, line in events)
    r.save("nccl-run-events.txt", text)
    for _, line in events:
        if line.startswith("gpureap run:"):
            r.log("  " + line)
    lines = [line for _, line in events]
    r.check("nccl: gpureap run exits 1 (hung, not restarted)", code == 1, gv.exit_text(code))
    hang_at = next((i for i, line in enumerate(lines) if "gpureap run: hang:" in line), len(lines))
    stacks_at = next((i for i, line in enumerate(lines) if i > hang_at and "gpureap run: stacks:" in line), None)
    stopping_at = next((i for i, line in enumerate(lines) if "gpureap run: stopping" in line), None)
    r.check("nccl: after the stall, the stacks are read before the stop's first signal",
            stacks_at is not None and stopping_at is not None and stacks_at < stopping_at, (hang_at, stacks_at, stopping_at))
    bundle_line = next((line for line in lines if "diagnostic bundle:" in line and line.endswith("-hang")), None)
    if not r.check("nccl: the stall's bundle is written", bundle_line is not None):
        return
    folder = bundle_line.rsplit(": ", 1)[1]
    keep_bundle(r, folder, "nccl")
    bundle = json.loads((Path(folder) / "bundle.json").read_text())
    r.log(f"  summary: {bundle['stacks']['summary']}")
    r.log(f"  stacks read in {bundle['stacks']['seconds']:.1f}s; notes {bundle['stacks']['notes']}")
    # NCCL's set-up, or (where the communicator is made without blocking) the wait for its kernel.
    check_rank(r, "nccl", bundle, "sglang::scheduler_TP0", "hang_in_nccl_allreduce", ["nccl", "synchronize"], with_py_spy)
    check_rank(r, "nccl", bundle, "sglang::scheduler_TP1", "wait_outside_the_collective", ["sleep"], with_py_spy)
    if with_py_spy:
        r.check("nccl: the summary says where TP0 waits", "sglang::scheduler_TP0 in " in bundle["stacks"]["summary"],
                bundle["stacks"]["summary"])
    else:
        r.check("nccl: the summary notes the missing py-spy", any("pip install py-spy" in note for note in bundle["stacks"]["notes"]))
    freed = [line for line in lines if "freed" in line and line.startswith("gpureap run: GPU")]
    r.check("nccl: every GPU the ranks held is freed", len(freed) == len(gpus), freed)


def cuda_with_dump(r, args, work, env, gpus, procs, with_py_spy):
    """A rank spinning in a CUDA kernel, read with `gpureap dump`."""
    gpu = gpus[0]
    lines, seen = [], threading.Event()
    server = procs.popen([sys.executable, str(SCRIPT), "server", "cuda", str(gpu), "0"], env=env,
                         stdout=subprocess.PIPE, text=True)
    threading.Thread(target=read_lines, args=(server.stdout, lines, seen), daemon=True).start()
    if not r.check("cuda: the rank reaches its spinning kernel", wait_for_line(lines, "entering the spinning kernel", 120)):
        return
    out = work / "dumps"
    bundle, attempts = None, 0
    deadline = time.time() + 60
    # The first look may come while the launch is still being queued: look again until the wait shows.
    while time.time() < deadline:
        attempts += 1
        run = subprocess.run([args.binary, "--backend", gv.backend(), "dump", "--pid", str(server.pid), "--out", str(out)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        r.log(f"$ gpureap dump --pid {server.pid}: {gv.exit_text(run.returncode)}; {run.stdout.strip()} {run.stderr.strip()}")
        folder = run.stdout.splitlines()[0].rsplit(": ", 1)[1] if run.returncode == 0 and run.stdout else None
        if folder:
            bundle = json.loads((Path(folder) / "bundle.json").read_text())
            keep_bundle(r, folder, "cuda")
            process = find_process(bundle, "sglang::scheduler_TP0")
            if not with_py_spy or (process and any(f.startswith("wait_for_cuda_kernel (") for f in frames_of(process))):
                break
        time.sleep(3)
    r.log(f"  {attempts} dump(s)")
    if not r.check("cuda: gpureap dump --pid writes a bundle", bundle is not None):
        return
    r.log(f"  summary: {bundle['stacks']['summary']}; read in {bundle['stacks']['seconds']:.1f}s")
    check_rank(r, "cuda", bundle, "sglang::scheduler_TP0", "wait_for_cuda_kernel", ["synchronize", "libcuda"], with_py_spy)
    by_gpu = subprocess.run([args.binary, "--backend", gv.backend(), "dump", "--gpu", str(gpu), "--out", str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    r.log(f"$ gpureap dump --gpu {gpu}: {gv.exit_text(by_gpu.returncode)}; {by_gpu.stdout.strip()} {by_gpu.stderr.strip()}")
    r.check(f"cuda: gpureap dump --gpu {gpu} takes the spinning rank", by_gpu.returncode == 0 and "sglang::scheduler_TP0" in by_gpu.stdout,
            by_gpu.stdout.strip())
    r.check("cuda: the dump signalled nothing (the rank still spins)", server.poll() is None)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        scenario, rank, world, port, device = sys.argv[2], *map(int, sys.argv[3:7])
        return rank_main(scenario, rank, world, port, device)
    if len(sys.argv) > 1 and sys.argv[1] == "server":
        return server_main(sys.argv[2], [int(d) for d in sys.argv[3].split(",")], int(sys.argv[4]))

    args = gv.parse_args(sys.argv[1:], __doc__.splitlines()[0],
                         extra=lambda parser: parser.add_argument("--py-spy", default=None, help="py-spy: its wheel or its binary"))
    r = gv.Report(args.out, "stacks-validate.log")
    tag = gv.new_tag()
    work = Path(tempfile.mkdtemp(prefix=f"gpureap-stacks-{tag}-"))
    procs = gv.Processes(work / "pids", tag)
    nvml = gv.Nvml(gv.load_pynvml())
    busy = {index: sorted(nvml.processes(index, graphics=True)) for index in range(nvml.count)}
    gpus = gv.usable_gpus(r.log, nvml.count, args.gpu, busy)
    if not gpus:
        return 2
    gpus = gpus[:2]
    py_spy = find_py_spy(args.py_spy, work)
    env = gv.child_env(tag)
    if py_spy:
        env["PATH"] = f"{py_spy.parent}{os.pathsep}{env.get('PATH', '')}"
        version = subprocess.run([str(py_spy), "--version"], stdout=subprocess.PIPE, text=True).stdout.strip()
    else:
        version = "none"
    scope = Path("/proc/sys/kernel/yama/ptrace_scope")
    r.log(f"date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; driver {nvml.driver()}; GPUs {gpus}; py-spy {py_spy} ({version}); "
          f"uid {os.getuid()}; yama ptrace_scope {scope.read_text().strip() if scope.exists() else 'absent'}; work {work}")
    try:
        nccl_under_run(r, args, work, env, gpus, py_spy is not None)
        cuda_with_dump(r, args, work, env, gpus, procs, py_spy is not None)
    except Exception:  # a broken check is a failure, and the processes still end
        r.check("the checks ran to their end", False, traceback.format_exc())
    finally:
        left = procs.kill_all()
        r.log(f"ended what this run started: {left}")
    line, failed, code = r.summary()
    r.log(line)
    if failed:
        r.log("failed: " + "; ".join(failed))
    r.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
