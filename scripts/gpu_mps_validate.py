#!/usr/bin/env python3
"""MPS for real: gpureap lists clients with their server, frees one client
and leaves the other client, the server and the daemon, and plans the
deliberate stop of the server naming the client it would take down.

    python3 scripts/gpu_mps_validate.py target/release/gpureap --out DIR [--gpu N] [--sim]

It starts `nvidia-cuda-mps-control -d` with a private CUDA_MPS_PIPE_DIRECTORY
and CUDA_MPS_LOG_DIRECTORY under a temporary directory (never the default
/tmp/nvidia-mps, which other users of the host share), then two PyTorch
clients in that pipe directory, each holding memory on GPU N (default 0).
Checks, each a PASS/FAIL line:

1. `gpureap status --json` lists both clients with role `client` and the
   server they go through, the server with its daemon, and the GPU is not
   held by no process; `status` and `status --tree` say the same in text.
2. `gpureap free --pid CLIENT1 --yes` exits 0: client 1 is gone, client 2,
   the server and the daemon are alive; gpureap's memory figure for the GPU
   matches nvidia-smi's, and each process's, where nvidia-smi lists it.
3. `gpureap free --mps-server SERVER --dry-run` names client 2 as a client
   of that server; `free --pid SERVER` is refused (exit 2).

Whatever happens, the clients are ended (by PID and start time), then the
daemon is stopped with `echo quit | nvidia-cuda-mps-control` in the same
environment, then anything left of this run is ended. Outputs (every
gpureap command, nvidia-smi's views, the MPS log) go to --out.

--sim runs the same steps on gpureap's simulated driver (a temporary DIR,
the PyTorch stand-in of tests/gpu_sim, a daemon and server played by
processes of those names, clients marked as the driver's MPS list marks
them: DIR/mps/PID.N): the script's own logic, tested without a GPU
(tests/mps.rs runs it). It says nothing about the real driver.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpuval as gv  # noqa: E402

HOLDER = str(Path(__file__).resolve().parent / "cuda_holder.py")
CLIENT_GIB = (2, 3)
MPS_BIN = "/usr/local/nvidia/bin"
# gpureap's and nvidia-smi's readings of one GPU's memory, taken a moment
# apart while nothing allocates: equal in practice; this much is allowed.
MEMORY_TOLERANCE = 32 * gv.MIB


def program(name):
    found = shutil.which(name) or shutil.which(name, path=MPS_BIN)
    if not found:
        raise RuntimeError(f"{name} not found on PATH nor in {MPS_BIN}")
    return found


def environ_of(pid):
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def comm(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def mps_processes(pipe):
    """(daemons, servers) of this pipe directory: PID -> start, by name and
    by the CUDA_MPS_PIPE_DIRECTORY in their environment (a server's is its
    daemon's, which it inherits; a server with no variable counts when its
    parent is one of these daemons)."""
    daemons, servers, parents = {}, {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or comm(int(entry)) != "nvidia-cuda-mps":
            continue
        pid = int(entry)
        now = gv.stat(pid)
        if now is None or now["state"] in ("Z", "X"):
            continue
        argv0 = os.path.basename(gv.cmdline(pid).split(" ", 1)[0])
        theirs = environ_of(pid).get("CUDA_MPS_PIPE_DIRECTORY")
        if argv0 == "nvidia-cuda-mps-control" and theirs == pipe:
            daemons[pid] = now["start"]
        elif argv0 == "nvidia-cuda-mps-server":
            parents[pid] = (now["ppid"], now["start"], theirs)
    for pid, (ppid, start, theirs) in parents.items():
        if ppid in daemons or theirs == pipe:
            servers[pid] = start
    return daemons, servers


class Busy(Exception):
    """The GPU is someone else's now: nothing was started."""


class MpsValidation:
    def __init__(self, args):
        self.bin = args.binary
        self.gpu = (args.gpu or [0])[0]
        self.sim = args.sim
        self.r = gv.Report(args.out, "mps.log")
        self.tag = gv.new_tag()
        self.work = Path(tempfile.mkdtemp(prefix=f"gpureap-mps-{self.tag}-"))
        self.pipe = str(self.work / "pipe")
        self.mps_log = self.work / "log"
        os.makedirs(self.pipe)
        os.makedirs(self.mps_log)
        if self.sim:
            self.make_sim()
        self.procs = gv.Processes(self.work / "pids", self.tag)
        self.env = gv.child_env(
            self.tag, H=HOLDER, R=self.work, P=self.work / "pids",
            CUDA_MPS_PIPE_DIRECTORY=self.pipe, CUDA_MPS_LOG_DIRECTORY=self.mps_log,
            CUDA_VISIBLE_DEVICES=self.gpu,
        )
        self.backend = gv.backend()
        self.child_log = open(self.work / "children.log", "ab")
        self.commands = 0
        self.daemon = None  # (pid, start)
        self.server = None

    # ------------------------------------------------------------ plumbing

    def make_sim(self):
        """A simulated host of two GPUs, as tests/gpu_sim/simulate.py makes one."""
        sim = self.work / "sim"
        os.makedirs(sim / "claims")
        os.makedirs(sim / "mps")
        for index in range(2):
            (sim / f"nvidia{index}").touch()
        (sim / "nvidiactl").touch()
        (sim / "gpus").write_text("143771336704 NVIDIA H200 (simulated)\n" * 2)
        os.environ[gv.SIM_VAR] = str(sim)

    def check(self, name, passed, detail=""):
        return self.r.check(name, passed, detail)

    def gpureap(self, label, *arguments):
        command = [self.bin, "--backend", self.backend, *arguments]
        started = time.monotonic()
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL, timeout=120)
        wall_ms = (time.monotonic() - started) * 1000
        self.commands += 1
        text = f"$ gpureap {' '.join(shlex.quote(a) for a in command[1:])}  # {gv.exit_text(done.returncode)}, {wall_ms:.0f} ms\n{done.stdout}"
        if done.stderr:
            text += f"[stderr]\n{done.stderr}"
        self.r.save(f"gpureap/{self.commands:02d}-{label}.txt", text)
        parsed = {}
        if "--json" in arguments:
            try:
                parsed = json.loads(done.stdout)
            except ValueError:
                pass
        return done, parsed

    def nvidia_smi(self, label, *arguments):
        """nvidia-smi's answer, saved; None on the simulated driver or without it."""
        if self.sim:
            return None
        try:
            done = subprocess.run([program("nvidia-smi"), *arguments], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=60)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
            self.r.log(f"nvidia-smi {' '.join(arguments)}: {error}")
            return None
        self.r.save(f"nvidia-smi/{label}.txt", f"$ nvidia-smi {' '.join(arguments)}\n{done.stdout}")
        return done.stdout

    def wait_until(self, condition, timeout):
        deadline = time.time() + timeout
        while not condition() and time.time() < deadline:
            time.sleep(0.05)
        return condition()

    # ------------------------------------------------------------ MPS

    def start_daemon(self):
        if self.sim:
            self.start_sim_daemon()
        else:
            subprocess.run([program("nvidia-cuda-mps-control"), "-d"], env=self.env, check=True, timeout=30,
                           stdin=subprocess.DEVNULL, stdout=self.child_log, stderr=subprocess.STDOUT)
        if not self.wait_until(lambda: mps_processes(self.pipe)[0], 15):
            raise RuntimeError("the MPS control daemon did not start")
        pid, start = next(iter(mps_processes(self.pipe)[0].items()))
        self.daemon = (pid, start)

    def start_sim_daemon(self):
        """The daemon and server played by sleep under their names, in a
        session of their own as `-d` leaves the real daemon; the server
        holds 64 MiB on the GPU at once (the real one starts with the first
        client)."""
        bin_dir = self.work / "bin"
        os.makedirs(bin_dir)
        sleep = shutil.which("sleep")
        for name in ("nvidia-cuda-mps-server", "nvidia-cuda-mps-control-daemon"):
            os.symlink(sleep, bin_dir / name)
        sim = os.environ[gv.SIM_VAR]
        server = (
            f'for node in "{sim}"/nvidia[0-9]*; do echo none > "{sim}/claims/$BASHPID.${{node##*/nvidia}}"; done; '
            f'echo {64 * gv.MIB} > "{sim}/claims/$BASHPID.{self.gpu}"; '
            f'for node in "{sim}"/nvidia[0-9]*; do exec {{fd}}<"$node"; done; exec 9<"{sim}/nvidiactl"; '
            f'exec -a nvidia-cuda-mps-server "{bin_dir}/nvidia-cuda-mps-server" 100000'
        )
        daemon = f'( {server} ) & exec -a nvidia-cuda-mps-control "{bin_dir}/nvidia-cuda-mps-control-daemon" 100000'
        self.procs.popen(["bash", "-c", daemon], env=self.env, stdin=subprocess.DEVNULL, stdout=self.child_log,
                         stderr=subprocess.STDOUT, start_new_session=True)

    def stop_daemon(self):
        """`echo quit | nvidia-cuda-mps-control` in the daemon's environment;
        the simulated daemon and server are ended by identity instead."""
        if self.daemon is None:
            return
        if self.sim:
            daemons, servers = mps_processes(self.pipe)
            for pid, start in [*servers.items(), *daemons.items()]:
                gv.signal_identity(pid, start, signal.SIGTERM)
        else:
            try:
                done = subprocess.run([program("nvidia-cuda-mps-control")], input="quit\n", env=self.env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
                self.r.log(f"echo quit | nvidia-cuda-mps-control: exit {done.returncode} {done.stdout.strip()}")
            except (OSError, subprocess.TimeoutExpired) as error:
                self.r.log(f"echo quit | nvidia-cuda-mps-control: {error}")
        pid, start = self.daemon
        stopped = self.wait_until(lambda: not gv.alive(pid, start), 30)
        self.check("the MPS daemon stops on quit", stopped, f"daemon {pid}")

    def client(self, index, gib):
        """A PyTorch client of the daemon, titled mps-client-N-TAG."""
        title = f"mps-client-{index}-{self.tag}"
        mark = ""
        if self.sim:  # the driver's MPS list, as the simulated driver reads it
            mark = f': > "{os.environ[gv.SIM_VAR]}/mps/$BASHPID.{self.gpu}"; '
        # CUDA_VISIBLE_DEVICES holds the one GPU: it is cuda:0 in the client.
        gpu = 0 if not self.sim else self.gpu
        script = gv.record(title) + mark + f"exec -a '{title}' python3 \"$H\" hold {gib} \"$R/ready-{index}\" --gpu {gpu}"
        self.procs.popen(["bash", "-c", script], env=self.env, stdin=subprocess.DEVNULL, stdout=self.child_log,
                         stderr=subprocess.STDOUT)
        return title

    def wait_clients(self, titles):
        ready = [self.work / f"ready-{index}" for index in (1, 2)]
        if not self.wait_until(lambda: all(path.exists() for path in ready), 120):
            log = (self.work / "children.log").read_text(errors="replace").strip().splitlines()
            raise RuntimeError(f"clients not ready in 120 s: {log[-1] if log else '?'}")
        return [(self.procs.pid(title), self.procs.start(self.procs.pid(title))) for title in titles]

    # ------------------------------------------------------------ checks

    def run(self):
        self.r.log(f"gpureap MPS validation: GPU {self.gpu}, pipe directory {self.pipe}, backend {self.backend}")
        self.nvidia_smi("before")
        busy = self.nvidia_smi("before-apps", "--query-compute-apps=pid,used_memory", "--format=csv,noheader",
                               "-i", str(self.gpu))
        if busy and busy.strip():
            raise Busy(f"GPU {self.gpu} has compute processes this run did not start:\n{busy.strip()}")
        self.start_daemon()
        self.r.log(f"daemon {self.daemon[0]}")
        titles = [self.client(index, gib) for index, gib in zip((1, 2), CLIENT_GIB)]
        (c1, c1_start), (c2, c2_start) = self.wait_clients(titles)
        if not self.wait_until(lambda: mps_processes(self.pipe)[1], 30):
            raise RuntimeError("no MPS server appeared")
        server, server_start = next(iter(mps_processes(self.pipe)[1].items()))
        self.server = server
        self.r.log(f"clients {c1}, {c2}; server {server}")
        self.nvidia_smi("with-clients")
        self.nvidia_smi("with-clients-pids", "-q", "-d", "PIDS")
        self.nvidia_smi("with-clients-apps", "--query-compute-apps=pid,process_name,used_memory", "--format=csv")

        self.check_listing(c1, c2, server)
        self.check_free_one(c1, c1_start, c2, c2_start, server, server_start)
        self.check_deliberate_plan(c2, server)

    def check_listing(self, c1, c2, server):
        _, status = self.gpureap("status", "status", "--json")
        self.gpureap("status-table", "status", "--gpu", str(self.gpu))
        self.gpureap("status-tree", "status", "--tree", "--gpu", str(self.gpu))
        holders = {holder["pid"]: holder for holder in status.get("holders", [])}
        for pid in (c1, c2):
            mps = (holders.get(pid) or {}).get("mps") or {}
            self.check(f"status lists client {pid} with its server", mps.get("role") == "client" and mps.get("server") == server,
                       json.dumps(mps))
            self.r.log(f"  client {pid}: the driver lists it as an MPS client: {mps.get('listed_by_driver')}; "
                       f"listed by the driver at all: {[gpu.get('listed_by_driver') for gpu in (holders.get(pid) or {}).get('gpus', [])]}")
        server_mps = (holders.get(server) or {}).get("mps") or {}
        self.check("status lists the server with its daemon", server_mps.get("role") == "server"
                   and server_mps.get("daemon") == self.daemon[0], json.dumps(server_mps))
        row = gv.gpu_row(status, self.gpu) or {}
        self.check("the server's memory is not held by no process", row.get("held_by_no_process") is False,
                   f"memory_unattributed {row.get('memory_unattributed')}, kind {row.get('unattributed_kind')}")
        self.r.log(f"  server memory: {[gpu.get('memory') for gpu in (holders.get(server) or {}).get('gpus', [])]}")

    def check_free_one(self, c1, c1_start, c2, c2_start, server, server_start):
        done, report = self.gpureap("free-client1", "free", "--pid", str(c1), "--yes", "--grace", "5s", "--json")
        self.check("free --pid CLIENT1 exits 0", done.returncode == 0, gv.exit_text(done.returncode))
        self.check("client 1 is gone", self.wait_until(lambda: not gv.alive(c1, c1_start), 10))
        self.check("free took client 1 alone", sorted(gv.targets(report)) == [c1], gv.targets(report))
        for name, pid, start in (("client 2", c2, c2_start), ("the server", server, server_start),
                                 ("the daemon", *self.daemon)):
            self.check(f"{name} survives", gv.alive(pid, start), pid)
        _, status = self.gpureap("status-after", "status", "--json")
        row = gv.gpu_row(status, self.gpu) or {}
        smi = self.nvidia_smi("after-free", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits",
                              "-i", str(self.gpu))
        if smi is None:
            self.r.skip("the memory figure matches nvidia-smi", "no nvidia-smi here (simulated driver)")
        else:
            smi_mib = int(smi.strip().split(",")[-1])
            ours = row.get("memory_used") or 0
            self.check("the memory figure matches nvidia-smi", abs(ours - smi_mib * gv.MIB) <= MEMORY_TOLERANCE,
                       f"gpureap {ours / gv.MIB:.0f} MiB, nvidia-smi {smi_mib} MiB")
            apps = self.nvidia_smi("after-free-apps", "--query-compute-apps=pid,used_memory",
                                   "--format=csv,noheader,nounits") or ""
            for line in apps.strip().splitlines():
                parts = [part.strip() for part in line.split(",")]
                if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                    pid, mib = int(parts[0]), int(parts[1])
                    mine = gv.holder_memory(status, pid, self.gpu)
                    self.r.log(f"  nvidia-smi: {pid} {mib} MiB; gpureap: {None if mine is None else mine // gv.MIB} MiB")
        self.r.log(f"  after: used {row.get('memory_used')}, unattributed {row.get('memory_unattributed')}")

    def check_deliberate_plan(self, c2, server):
        done = self.gpureap("stop-server-plan", "free", "--mps-server", str(server), "--dry-run")[0]
        line = next((line for line in done.stdout.splitlines() if str(c2) in line), "")
        self.check("the deliberate stop's plan names client 2", f"a client of MPS server {server}" in line, line.strip())
        _, plan = self.gpureap("stop-server-plan-json", "free", "--mps-server", str(server), "--dry-run", "--json")
        self.check("the plan takes the server and client 2", sorted(gv.targets(plan)) == sorted([server, c2]),
                   gv.targets(plan))
        refused = self.gpureap("pid-server-refused", "free", "--pid", str(server), "--yes")[0]
        self.check("free --pid SERVER is refused", refused.returncode == 2, refused.stderr.strip())

    def cleanup(self):
        """The clients first (the daemon's quit waits for them), then the
        daemon, then anything of this run still there."""
        for pid, start, title in self.procs.records():
            if title.startswith("mps-client-"):
                gv.signal_identity(pid, start)
        self.wait_until(lambda: not any(gv.alive(pid, start) for pid, start, _ in self.procs.records()), 15)
        try:
            self.stop_daemon()
        finally:
            self.procs.kill_all()
            self.child_log.close()
            for path in sorted(self.mps_log.glob("*")):
                self.r.save(f"mps-log/{path.name}", path.read_text(errors="replace"))
            shutil.rmtree(self.work, ignore_errors=True)


def main(argv):
    args = gv.parse_args(argv, "MPS on a real GPU: clients, their server, one client freed",
                         lambda parser: parser.add_argument("--sim", action="store_true",
                                                            help="run on gpureap's simulated driver (no GPU)"))
    validation = MpsValidation(args)
    try:
        validation.run()
    except Busy as error:
        validation.r.log(str(error))
        validation.r.close()
        return 2
    except Exception as error:  # noqa: BLE001 - any failure is reported, then cleaned up
        validation.check("the validation ran to its end", False, f"{type(error).__name__}: {error}")
    finally:
        validation.cleanup()
    line, failed, code = validation.r.summary()
    validation.r.log(line)
    validation.r.close()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
