"""A stand-in for PyTorch over gpureap's simulated driver, for dry runs of the
GPU validation scripts without a GPU (see tests/gpu_sim/simulate.py).

It keeps CUDA's rules for where a process makes a context, which is what the
scripts depend on: `torch.cuda.set_device(N)` makes one on N; an allocation on
`cuda:N` makes one on N; `torch.cuda.synchronize()` without a device makes one
on the current device, GPU 0 unless set_device said otherwise. A context is
an open DIR/nvidiaN (the simulated driver then lists the process on GPU N)
with a claim of CONTEXT bytes, and each allocation adds to the claim.
"""

import os

uint8 = "uint8"
CONTEXT = 500 << 20
_held = {}  # device -> [open node, bytes]
_control = []
_current = [0]


def _dir():
    return os.environ["GPUREAP_VALIDATE_SIM"]


def _use(device, extra=0):
    device = int(device)
    if device >= cuda.device_count():
        raise RuntimeError(f"CUDA error: invalid device ordinal {device}")
    if not _control:
        _control.append(open(os.path.join(_dir(), "nvidiactl"), "rb"))
    entry = _held.setdefault(device, [None, CONTEXT])
    entry[1] += extra
    claim = os.path.join(_dir(), "claims", f"{os.getpid()}.{device}")
    with open(claim + ".tmp", "w") as out:
        out.write(str(entry[1]))
    os.replace(claim + ".tmp", claim)  # the claim first: never seen at the 1 GiB default
    if entry[0] is None:
        entry[0] = open(os.path.join(_dir(), f"nvidia{device}"), "rb")


def _index(device):
    text = str(device)
    if not text.startswith("cuda"):
        return None
    return int(text.split(":", 1)[1]) if ":" in text else _current[0]


class Tensor:
    def __init__(self, size, device):
        self.size, self.device = size, device

    def fill_(self, value):
        return self


def empty(size, dtype=None, device="cpu"):
    index = _index(device)
    if index is not None:
        _use(index, int(size))
    return Tensor(size, device)


class cuda:
    @staticmethod
    def device_count():
        count = 0
        while os.path.exists(os.path.join(_dir(), f"nvidia{count}")):
            count += 1
        return count

    @staticmethod
    def set_device(device):
        _current[0] = int(device)
        _use(_current[0])

    @staticmethod
    def current_device():
        return _current[0]

    @staticmethod
    def synchronize(device=None):
        _use(_current[0] if device is None else _index(device) if isinstance(device, str) else int(device))

    @staticmethod
    def _sleep(cycles):
        """A kernel that spins on the GPU: the next synchronize waits for it."""
        _use(_current[0])
        _spinning[0] = True


_spinning = [False]


def ones(size, device="cpu"):
    return empty(size * 4, device=device)


def _wait_forever():
    read, _ = os.pipe()
    while True:
        os.read(read, 1)


def cudaDeviceSynchronize():
    """Where the real runtime waits for a kernel still running."""
    _wait_forever()


_synchronize = cuda.synchronize


def _synchronize_spinning(device=None):
    _synchronize(device)
    if _spinning[0]:
        cudaDeviceSynchronize()


cuda.synchronize = staticmethod(_synchronize_spinning)
