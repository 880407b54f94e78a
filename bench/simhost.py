"""What the benchmarks share about a simulated GPU host (docs/simulated-driver.md) and a
gpureap waiting on it. Imported by bench/bench.py, exporter_memory.py, memory.py,
watch_idle.py and wait_exit.py; nothing here reads the command line.
"""

import os
import tempfile
from pathlib import Path

GIB = 1 << 30


def simulated_host(prefix, gpus=8, total=150 * GIB):
    """A new simulated host directory (its name starting with `prefix`): `gpus` GPU nodes and
    nvidiactl, an empty claims/, and a `gpus` file of `total` bytes each ("Simulated H200").
    The caller removes it."""
    host = Path(tempfile.mkdtemp(prefix=prefix))
    for index in range(gpus):
        (host / f"nvidia{index}").touch()
    (host / "nvidiactl").touch()
    (host / "claims").mkdir()
    (host / "gpus").write_text("".join(f"{total} Simulated H200\n" for _ in range(gpus)))
    return host


def sleeping(pid):
    """Whether every thread of `pid` is asleep (state S): a waiting gpureap."""
    try:
        return all(Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"
                   for task in os.listdir(f"/proc/{pid}/task"))
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False
