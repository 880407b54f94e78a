"""What the benchmarks share about a simulated GPU host (docs/simulated-driver.md) and a
gpureap waiting on it. Imported by bench/bench.py, exporter_memory.py, memory.py,
watch_idle.py and wait_exit.py; `option` reads the command line for exporter_memory.py,
memory.py and watch_idle.py.
"""

import os
import shutil
import signal
import subprocess
import sys
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


def start_server(host, work, gpus=8):
    """A healthy SGLang-like server on `host`: a launcher and `gpus` workers
    (`sglang::scheduler_TP<rank>`), each holding 70 GiB of its GPU through
    its node, in a process group of their own; each worker touches
    `work`/ready<rank> once its claim is written."""
    parts = []
    for rank in range(gpus):
        parts.append(f'( exec 3<"{host}/nvidia{rank}" 9<"{host}/nvidiactl"; '
                     f'echo {70 * GIB} > "{host}/claims/$BASHPID.{rank}"; touch {work}/ready{rank}; '
                     f'exec -a sglang::scheduler_TP{rank} sleep 100000 ) & ')
    script = "".join(parts) + f"exec -a 'python3 -m sglang.launch_server --tp {gpus}' sleep 100000"
    return subprocess.Popen(["bash", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            process_group=0)


def option(name, default):
    """The word after `name` on the command line, or `default`."""
    args = sys.argv[1:]
    return args[args.index(name) + 1] if name in args else default


def stop(gpureap, crowd, server, *dirs):
    """Ends what a benchmark on the simulated host started: the gpureap it watches (SIGTERM, if
    it got as far as starting one), bench/crowd.py's crowd (SIGTERM), the server's process group
    (SIGKILL), then removes `dirs`."""
    if gpureap is not None:
        gpureap.send_signal(signal.SIGTERM)
        gpureap.wait(timeout=60)
    crowd.send_signal(signal.SIGTERM)
    crowd.wait()
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)


def sleeping(pid):
    """Whether every thread of `pid` is asleep (state S): a waiting gpureap."""
    try:
        return all(Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"
                   for task in os.listdir(f"/proc/{pid}/task"))
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False
