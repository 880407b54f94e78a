"""A stand-in for pynvml over gpureap's simulated driver, for dry runs of
scripts/gpu_validate.py and scripts/gpu_run_validate.py without a GPU (see
simulate.py). The driver is the directory in GPUREAP_VALIDATE_SIM, read as
docs/simulated-driver.md describes it: GPU N's processes are the live holders
of DIR/nvidiaN, each using DIR/claims/PID.N bytes (1 GiB without a claim),
plus DIR/leak.N held by no process.
"""

import os
from types import SimpleNamespace

GIB = 1 << 30
nvmlMemory_v2 = 0x02000028


class NVMLError(Exception):
    pass


def _dir():
    return os.environ["GPUREAP_VALIDATE_SIM"]


def _lines():
    try:
        with open(os.path.join(_dir(), "gpus")) as gpus:
            return gpus.read().splitlines()
    except FileNotFoundError:
        return []


def _read_int(path, default):
    try:
        with open(path) as file:
            return int(file.read().strip() or default)
    except (FileNotFoundError, ValueError):
        return default


def _holders(index):
    """PIDs with DIR/nvidiaINDEX open (zombies have no descriptors)."""
    node = os.path.realpath(os.path.join(_dir(), f"nvidia{index}"))
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") == node:
                    pids.append(int(entry))
                    break
            except OSError:
                continue
    return sorted(pids)


def nvmlInit():
    if not os.path.isdir(_dir()):
        raise NVMLError("no simulated driver")


def nvmlShutdown():
    pass


def nvmlSystemGetDriverVersion():
    return "sim"


def nvmlDeviceGetCount():
    count = 0
    while os.path.exists(os.path.join(_dir(), f"nvidia{count}")):
        count += 1
    return count


def nvmlDeviceGetHandleByIndex(index):
    if index >= nvmlDeviceGetCount():
        raise NVMLError(f"no GPU {index}")
    return index


def nvmlDeviceGetName(handle):
    lines = _lines()
    parts = lines[handle].split(None, 1) if handle < len(lines) else []
    return parts[1] if len(parts) > 1 else "Simulated GPU"


def _total(handle):
    lines = _lines()
    return int(lines[handle].split()[0]) if handle < len(lines) and lines[handle].strip() else 80 * GIB


def _claim(pid, handle):
    return _read_int(os.path.join(_dir(), "claims", f"{pid}.{handle}"), GIB)


def nvmlDeviceGetComputeRunningProcesses(handle):
    return [SimpleNamespace(pid=pid, usedGpuMemory=_claim(pid, handle)) for pid in _holders(handle)]


def nvmlDeviceGetGraphicsRunningProcesses(handle):
    return []


def nvmlDeviceGetMemoryInfo(handle, version=None):
    used = sum(_claim(pid, handle) for pid in _holders(handle)) + _read_int(os.path.join(_dir(), f"leak.{handle}"), 0)
    total = _total(handle)
    info = SimpleNamespace(total=total, used=used, free=total - used)
    if version == nvmlMemory_v2:
        info.reserved = 0
    return info
