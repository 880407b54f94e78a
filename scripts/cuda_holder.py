"""A real CUDA process that holds GPU memory, for scripts/gpu_validate.py.

    python3 cuda_holder.py hold GIB READY_FILE [--ignore-term] [--gpu N] [-- CMD...]
    python3 cuda_holder.py monitor READY_FILE [--gpu N]

`hold` selects GPU N (default 0) with torch.cuda.set_device before any other
CUDA call, so that it makes a context on that GPU and no other (without it,
PyTorch's first call on the current device makes one on GPU 0 too), allocates
GIB GiB there with PyTorch (plain cudaMalloc through its caching allocator),
touches READY_FILE, and sleeps until killed; with `-- CMD...` it
first runs CMD as its child and writes CMD's stdout and exit code to
READY_FILE.out (to test that gpureap spares the process that ran it). `monitor` opens the
device nodes without creating a CUDA context, as nvidia-smi or an exporter
does, and sleeps. Titles come from the caller (`exec -a`), as SGLang's
setproctitle sets them.
"""

import os
import signal
import sys
import time


def main() -> None:
    mode, *rest = sys.argv[1:]
    command = []
    if "--" in rest:
        command = rest[rest.index("--") + 1 :]
        rest = rest[: rest.index("--")]
    ignore_term = "--ignore-term" in rest
    gpu = 0
    if "--gpu" in rest:
        gpu = int(rest[rest.index("--gpu") + 1])
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "hold":
        gib, ready = float(rest[0]), rest[1]
        import torch

        torch.cuda.set_device(gpu)  # first: every later call (synchronize too) goes to this GPU
        block = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device=f"cuda:{gpu}")
        block.fill_(1)
        torch.cuda.synchronize(gpu)
        if command:
            import subprocess

            done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            with open(ready + ".out", "w") as out:
                out.write(f"{done.returncode}\n{done.stdout}")
        open(ready, "w").close()
    elif mode == "monitor":
        ready = rest[0]
        sim = os.environ.get("GPUREAP_VALIDATE_SIM")
        # On the simulated driver (a dry run) an open GPU node means holding
        # that GPU, so a monitor there holds the control node only.
        paths = [f"{sim}/nvidiactl"] if sim else ["/dev/nvidiactl", f"/dev/nvidia{gpu}"]
        nodes = [os.open(path, os.O_RDWR) for path in paths]
        open(ready, "w").close()
    else:
        raise SystemExit(f"unknown mode {mode}")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
