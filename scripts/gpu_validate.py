#!/usr/bin/env python3
"""Check gpureap's real NVML path against real CUDA processes, on every GPU.

    python3 scripts/gpu_validate.py [PATH_TO_GPUREAP] [--gpu LIST] [--out DIR]

Needs NVIDIA GPUs, python3 with PyTorch, and pynvml (nvidia-ml-py). Builds the
incidents of the test suite out of real CUDA processes, each holding a few GiB
on a GPU it chose with torch.cuda.set_device before any other CUDA call, and
spreads them over the GPUs it uses (every GPU no other process uses, or
--gpu LIST). It runs gpureap against them, scoped to its own processes only
(a --match on this run's unique tag, or --pid of its own), and checks every
outcome independently through NVML, GPU by GPU. Checks that need two GPUs say
SKIP on one.

It never signals anything it did not start: its processes are known by PID
and start time, and all of them are killed before it exits, on failure too.
Prints one PASS/FAIL/SKIP line per check and `N passed, M failed, K skipped`;
exits 1 if any check failed, 2 if it could not start. With --out DIR it also
writes its log (validate.log), every gpureap command with its full output
(gpureap-outputs.txt, and one file per command under gpureap/), and the
timings. Results are recorded in docs/gpu-validation.md.
"""

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import gpuval as gv

HERE = Path(__file__).resolve().parent
HOLDER = HERE / "cuda_holder.py"
GIB = gv.GIB
# Cases not started this long after the start are reported as not run: the
# whole check stays within a few minutes even when holders are slow to start.
BUDGET_S = 240


class Validation:
    def __init__(self, args, log_name="validate.log"):
        self.bin = args.binary
        self.requested = args.gpu
        self.r = gv.Report(args.out, log_name)
        self.tag = gv.new_tag()
        # The tag is in every path this run uses, so in every command line it
        # starts: --match on it reaches this run's processes and nothing else.
        self.work = Path(tempfile.mkdtemp(prefix=f"gpureap-{self.tag}-"))
        self.procs = gv.Processes(self.work / "pids", self.tag)
        self.env = gv.child_env(self.tag, H=HOLDER, R=self.work, P=self.work / "pids")
        self.backend = gv.backend()
        self.commands = 0
        # What the started processes print (a holder's traceback, bash's job notices).
        self.child_log = open(self.work / "children.log", "ab")
        self.log_mark = 0  # where the current case's part of children.log starts
        self.started = time.monotonic()
        self.timings = []
        self.gpus = []
        self.nvml = None

    # ------------------------------------------------------------ plumbing

    def log(self, text=""):
        self.r.log(text)

    def check(self, name, passed, detail=""):
        return self.r.check(name, passed, detail)

    def scope(self, titles):
        """A --match regex for processes of this run titled one of `titles`."""
        return "^(" + "|".join(t.replace(".", r"\.") for t in titles) + f") .*{self.tag}"

    def bash(self, script, own_session=False, **extra):
        """Runs a bash script with $H (holder), $R (ready dir), $P (pids file)."""
        env = dict(self.env, **{key: str(value) for key, value in extra.items()})
        return self.procs.popen(["bash", "-c", script], env=env, stdin=subprocess.DEVNULL, stdout=self.child_log,
                                stderr=subprocess.STDOUT, start_new_session=own_session)

    def holder(self, title, gib, ready, gpu, extra=""):
        """A bash fragment: record this shell under `title`, then become a CUDA holder of GPU `gpu` titled `title`."""
        return gv.record(title) + f"exec -a '{title}' python3 \"$H\" hold {gib} \"$R/{ready}\" --gpu {gpu} {extra}"

    def launch_job(self, script):
        """Runs `script` as a job of a job-control shell that leads a session of
        its own (a terminal's shell): the job leads its own process group and
        what it starts stays in that group. When the job dies, its children
        are re-parented to PID 1 (or a subreaper), outside that session."""
        return self.bash('set -m; bash -c "$JOB" & wait', own_session=True, JOB=script)

    def wait_ready(self, *names, timeout=60):
        """Waits for the holders' ready files; gives up at once when a started
        process printed a traceback (holders print nothing when all is well)."""
        deadline = time.time() + timeout
        while not all((self.work / name).exists() for name in names):
            missing = [name for name in names if not (self.work / name).exists()]
            log = (self.work / "children.log").read_bytes()[self.log_mark:]
            if b"Traceback" in log:
                time.sleep(0.5)  # let it finish printing
                lines = (self.work / "children.log").read_bytes()[self.log_mark:].decode(errors="replace").strip().splitlines()
                raise RuntimeError(f"a holder failed ({missing} not ready): {lines[-1] if lines else '?'} (children.log has the rest)")
            if time.time() > deadline:
                raise RuntimeError(f"holders not ready after {timeout}s: {missing}")
            time.sleep(0.05)

    def wait_until(self, condition, timeout=5.0):
        deadline = time.time() + timeout
        while not condition() and time.time() < deadline:
            time.sleep(0.01)
        return condition()

    def gpureap(self, label, *arguments, backend=True):
        """Runs gpureap, records the command and its output; returns (done, wall_ms, json or {})."""
        command = [self.bin, *(["--backend", self.backend] if backend else []), *arguments]
        started = time.monotonic()
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, timeout=120)
        wall_ms = (time.monotonic() - started) * 1000
        self.commands += 1
        text = f"$ gpureap {' '.join(shlex.quote(a) for a in command[1:])}  # {gv.exit_text(done.returncode)}, {wall_ms:.0f} ms\n{done.stdout}"
        if done.stderr:
            text += f"[stderr]\n{done.stderr}"
        if self.r.out:
            with open(self.r.out / "gpureap-outputs.txt", "a") as out:
                out.write(text + "\n")
            self.r.save(f"gpureap/{self.commands:02d}-{label}.txt", text)
        parsed = {}
        if "--json" in arguments:
            try:
                parsed = json.loads(done.stdout)
            except json.JSONDecodeError:
                self.log(f"not JSON ({gv.exit_text(done.returncode)}):\n{done.stdout}\n{done.stderr}")
        return done, wall_ms, parsed

    def snap(self):
        return self.nvml.snapshot(self.gpus)

    def ours_listed(self):
        """Processes of this run NVML still lists: {gpu: [pid]}."""
        mine = {pid for pid, _, _ in self.procs.records()} | {child.pid for child in self.procs.children}
        return {index: sorted(set(listed) & mine) for index, (_, listed) in self.snap().items() if set(listed) & mine}

    def cleanup(self):
        """Kills everything this run started, and waits until NVML lists none of it."""
        killed = self.procs.kill_all()
        if killed:
            self.log(f"  (cleanup: SIGKILLed {len(killed)} process(es) of this run still running: {killed})")
        if not self.wait_until(lambda: not self.ours_listed(), timeout=15):
            self.log(f"  (cleanup: NVML still lists processes of this run: {self.ours_listed()})")

    def case(self, title, function):
        self.log(f"\n== {title} ==")
        if time.monotonic() - self.started > BUDGET_S:
            self.check(f"{title}: run", False, f"not run: over the {BUDGET_S} s budget")
            return
        self.log_mark = (self.work / "children.log").stat().st_size
        started = time.monotonic()
        try:
            function()
        except Exception as error:  # a case that breaks is a failure, and the next cases still run
            self.log(traceback.format_exc())
            self.check(f"{title}: ran to the end", False, f"{type(error).__name__}: {error}")
        finally:
            self.cleanup()
        self.log(f"  ({time.monotonic() - started:.1f} s)")

    def check_placement(self, what, expected, snapshot):
        """Each PID in `expected` ({pid: gpu}) is listed by NVML on its GPU and on no other."""
        wrong = gv.placement_problems(snapshot, expected)
        self.check(
            f"{what}: NVML lists each on its own GPU only (no stray context on another GPU)",
            not wrong,
            ", ".join(f"{pid} on GPU {gpu}" for pid, gpu in expected.items()) if not wrong
            else ", ".join(f"{pid}: NVML lists it on {gpus}, expected [{expected[pid]}]" for pid, gpus in wrong.items()),
        )

    def check_status_placement(self, what, status, expected, snapshot):
        problems = gv.status_placement_problems(status, snapshot, expected)
        self.check(
            f"{what}: status lists each under its own GPU only, with NVML's memory (within 256 MiB)",
            not problems,
            gv.describe_placement(status, expected) if not problems else str(problems),
        )

    def check_freed(self, what, report, indices):
        problems = gv.freed_problems(report, indices)
        self.check(f"{what}: one outcome per GPU used ({sorted(set(indices))}), each verified freed",
                   not problems, gv.describe_outcomes(report) if not problems else "; ".join(problems))

    def check_memory_back(self, what, before, after, pids):
        """NVML's used memory fell, on each GPU, by at least 95% of what PIDS held there."""
        lines, ok = [], True
        for index in sorted(before):
            share = gv.nvml_share(before, index, pids)
            if not share:
                continue
            back = before[index][0] - after[index][0]
            ok = ok and back >= share * 0.95
            lines.append(f"GPU {index}: {back / GIB:.2f} GiB back of {share / GIB:.2f} GiB held")
        self.check(f"{what}: NVML memory fell by their share on each GPU", ok and lines, "; ".join(lines) or "nothing held")

    # ------------------------------------------------------------ cases

    def case_sglang_orphans(self):
        g = self.gpus
        place = {rank: gv.spread(g, rank) for rank in range(3)}
        notebook_gpu, monitor_gpu = g[-1], g[0]
        launcher_title = "python3 -m sglang.launch_server"
        workers = "".join(
            "( " + self.holder(f"sglang::scheduler_TP{rank}", 4, f"tp{rank}", place[rank], "--ignore-term" if rank == 1 else "") + " ) & "
            for rank in range(3)
        )
        self.launch_job(
            gv.record(launcher_title) + workers
            + "( " + gv.record("sglang::detokenizer") + "exec -a sglang::detokenizer sleep 100000 ) & "
            + f"exec -a '{launcher_title} --model-path meta-llama/Llama-3.1-8B --tp 3' sleep 100000"
        )
        self.bash(self.holder("jupyter-kernel colleague.ipynb", 2, "notebook", notebook_gpu))
        self.bash(gv.record("gpu_exporter") + f'exec -a gpu_exporter python3 "$H" monitor "$R/monitor" --gpu {monitor_gpu}')
        self.wait_ready("tp0", "tp1", "tp2", "notebook", "monitor")
        tp = [self.procs.pid(f"sglang::scheduler_TP{rank}") for rank in range(3)]
        launcher = self.procs.pid(launcher_title)
        notebook = self.procs.pid("jupyter-kernel colleague.ipynb")
        monitor = self.procs.pid("gpu_exporter")
        detokenizer = self.procs.pid("sglang::detokenizer")
        expected = {tp[rank]: place[rank] for rank in range(3)}
        expected_all = {**expected, notebook: notebook_gpu}
        launcher_stat = gv.stat(launcher)
        self.check("the launcher leads its process group (a shell's job), not a session; the workers are in its group",
                   launcher_stat["pgid"] == launcher and launcher_stat["sid"] != launcher and all(gv.stat(pid)["pgid"] == launcher for pid in tp),
                   f"launcher {launcher}: pgid {launcher_stat['pgid']}, sid {launcher_stat['sid']}; workers' pgid {[gv.stat(pid)['pgid'] for pid in tp]}")
        before = self.snap()
        self.check_placement("three workers and a notebook", expected_all, before)

        gv.signal_identity(launcher, self.procs.start(launcher))
        reparented = self.wait_until(lambda: all(gv.stat(pid)["ppid"] != launcher for pid in tp))
        parents = {pid: gv.stat(pid)["ppid"] for pid in tp}
        self.check("launcher SIGKILLed; the workers are re-parented", reparented, f"parents now {parents}")

        _, _, status = self.gpureap("status", "status", "--json")
        self.check_status_placement("workers and notebook", status, expected_all, self.snap())
        wrong = {pid: (gv.holder(status, pid).get("flags"), gv.holder(status, pid).get("orphan")) for pid in tp
                 if "orphaned" not in gv.holder(status, pid).get("flags", [])
                 or gv.holder(status, pid).get("orphan") != gv.orphan_text(launcher, parents[pid])}
        self.check("status flags each worker orphaned, with why", not wrong,
                   gv.holder(status, tp[0]).get("orphan") if not wrong else f"{wrong}; expected {gv.orphan_text(launcher, parents[tp[0]])!r}")
        notebook_row = gv.holder(status, notebook)
        self.check("status does not flag the notebook orphaned (its parent is alive)",
                   "orphaned" not in notebook_row.get("flags", []) and notebook_row.get("orphan") is None,
                   f"flags {notebook_row.get('flags')}, orphan {notebook_row.get('orphan')}")
        self.check("status flags the exporter as a monitor", "monitor" in gv.holder(status, monitor).get("flags", []),
                   str(gv.holder(status, monitor).get("flags")))

        done, wall_ms, report = self.gpureap("free-orphans", "free", "--orphans", "--match", self.tag, "--grace", "2s", "--yes", "--json")
        after = self.snap()
        self.check("free --orphans --match TAG exits 0", done.returncode == 0, f"{gv.exit_text(done.returncode)}; {done.stderr.strip()}")
        self.check("exactly the three workers are targets (not the notebook, exporter or detokenizer)",
                   gv.targets(report) == sorted(tp), str(gv.targets(report)))
        self.check("each target says why it is an orphan",
                   all(gv.target(report, pid).get("orphan") == gv.orphan_text(launcher, parents[pid]) for pid in tp),
                   str([gv.target(report, pid).get("orphan") for pid in tp]))
        self.check("TP0 and TP2 exit on SIGTERM", gv.signals(report, tp[0]) == ["SIGTERM"] and gv.signals(report, tp[2]) == ["SIGTERM"],
                   f"{gv.signals(report, tp[0])} {gv.signals(report, tp[2])}")
        self.check("TP1 ignores SIGTERM and gets SIGSTOP then SIGKILL", gv.signals(report, tp[1]) == ["SIGTERM", "SIGSTOP", "SIGKILL"],
                   str(gv.signals(report, tp[1])))
        self.check_freed("orphans", report, place.values())
        self.check("NVML no longer lists any worker, on any GPU", not any(gv.nvml_gpus_of(after, pid) for pid in tp),
                   {index: sorted(listed) for index, (_, listed) in after.items()})
        self.check_memory_back("workers", before, after, tp)
        self.check("notebook (still on its GPU with its memory), exporter and detokenizer untouched",
                   gv.alive(notebook) and gv.alive(monitor) and gv.alive(detokenizer)
                   and gv.nvml_gpus_of(after, notebook) == [notebook_gpu]
                   and after[notebook_gpu][1].get(notebook) == before[notebook_gpu][1].get(notebook))
        self.timings.append(("orphans over GPUs " + ",".join(map(str, sorted(set(place.values())))) + ", grace 2s, TP1 ignores SIGTERM",
                             f"{gv.describe_outcomes(report)}; command wall {wall_ms:.0f} ms"))

    def case_grace_zero(self):
        place = {rank: gv.spread(self.gpus, rank) for rank in range(3)}
        self.bash("".join("( " + self.holder(f"sglang::fast_TP{rank}", 4, f"fast{rank}", place[rank]) + " ) & " for rank in range(3)) + "wait")
        self.wait_ready("fast0", "fast1", "fast2")
        pids = [self.procs.pid(f"sglang::fast_TP{rank}") for rank in range(3)]
        before = self.snap()
        self.check_placement("grace 0", {pids[rank]: place[rank] for rank in range(3)}, before)
        done, wall_ms, report = self.gpureap("free-grace0", "free", "--match", self.scope(["sglang::fast_TP0", "sglang::fast_TP1", "sglang::fast_TP2"]),
                                             "--grace", "0", "--yes", "--json")
        after = self.snap()
        self.check("grace 0: exit 0, exactly the three targets, SIGSTOP+SIGKILL only (no SIGTERM)",
                   done.returncode == 0 and gv.targets(report) == sorted(pids) and all(gv.signals(report, pid) == ["SIGSTOP", "SIGKILL"] for pid in pids),
                   f"{gv.exit_text(done.returncode)}, {[gv.signals(report, pid) for pid in pids]}")
        self.check_freed("grace 0", report, place.values())
        self.check("grace 0: NVML lists none of them", not any(gv.nvml_gpus_of(after, pid) for pid in pids))
        self.timings.append(("3 workers x 4 GiB over GPUs " + ",".join(map(str, sorted(set(place.values())))) + ", grace 0",
                             f"{gv.describe_outcomes(report)}; command wall {wall_ms:.0f} ms"))

    def case_setsid(self):
        worker_gpu, escapee_gpu = self.gpus[0], self.gpus[-1]
        escapee = self.holder("sglang::escapee", 3, "escapee", escapee_gpu)
        self.bash(f"( ( exec setsid bash -c {shlex.quote(escapee)} ) & ); " + self.holder("sglang::worker", 3, "worker", worker_gpu))
        self.wait_ready("escapee", "worker")
        escapee_pid, worker_pid = self.procs.pid("sglang::escapee"), self.procs.pid("sglang::worker")
        e, w = gv.stat(escapee_pid), gv.stat(worker_pid)
        self.check("the grandchild has its own session and was re-parented (to PID 1 or a subreaper)",
                   e["sid"] == escapee_pid and e["sid"] != w["sid"] and e["ppid"] != worker_pid, f"sid {e['sid']} vs {w['sid']}, ppid {e['ppid']}")
        self.check_placement("worker and escapee", {worker_pid: worker_gpu, escapee_pid: escapee_gpu}, self.snap())
        done, _, report = self.gpureap("free-setsid", "free", "--match", self.scope(["sglang::worker", "sglang::escapee"]), "--grace", "1s", "--yes", "--json")
        after = self.snap()
        self.check("setsid grandchild found and killed with the worker", done.returncode == 0 and not gv.alive(escapee_pid) and not gv.alive(worker_pid),
                   f"{gv.exit_text(done.returncode)}, targets {gv.targets(report)}")
        self.check_freed("setsid", report, [worker_gpu, escapee_gpu])
        self.check("NVML lists neither", not gv.nvml_gpus_of(after, escapee_pid) and not gv.nvml_gpus_of(after, worker_pid))

    def case_zombie(self):
        gpu = self.gpus[-1]
        self.bash("( " + gv.record("zombie") + "sleep 0.5; exit 0 ) & " + self.holder("sglang::hung_parent", 3, "hung", gpu))
        self.wait_ready("hung")
        zombie = self.procs.pid("zombie")
        parent = self.procs.pid("sglang::hung_parent")
        self.wait_until(lambda: (gv.stat(zombie) or {}).get("state") == "Z", timeout=5)
        tree, _, _ = self.gpureap("status-tree", "status", "--tree", "--gpu", str(gpu))
        self.check("status --tree shows the zombie under its parent", f"{zombie} [Z]" in tree.stdout and "zombie" in tree.stdout,
                   next((line.strip() for line in tree.stdout.splitlines() if f"{zombie} [" in line), "not shown"))
        done, _, report = self.gpureap("free-zombie", "free", "--match", self.scope(["sglang::hung_parent"]), "--grace", "1s", "--yes", "--json")
        fates = {t["pid"]: t["fate"] for t in report.get("targets", [])}
        self.check("parent killed, zombie not signalled", done.returncode == 0 and fates.get(zombie) == "zombie"
                   and gv.signals(report, zombie) == [] and not gv.alive(parent), f"{gv.exit_text(done.returncode)}, fates {fates}")
        self.check_freed("zombie", report, [gpu])

    def case_respawn(self):
        gpu = self.gpus[-1]
        parent = self.bash("trap '' TERM; n=0; while :; do n=$((n+1)); ( " + self.holder("sglang::respawned", 3, "respawn-$n", gpu) + " ) & wait; done")
        self.wait_ready("respawn-1")
        worker = self.procs.pid("sglang::respawned")
        done, _, report = self.gpureap("free-respawn", "free", "--pid", str(parent.pid), "--grace", "1s", "--yes", "--json")
        parent.wait(timeout=10)
        self.check("respawning parent: SIGTERM ignored, then SIGSTOP before SIGKILL", gv.signals(report, parent.pid) == ["SIGTERM", "SIGSTOP", "SIGKILL"],
                   str(gv.signals(report, parent.pid)))
        self.check("respawning parent: worker killed, nothing respawned", done.returncode == 0 and not gv.alive(worker)
                   and not (self.work / "respawn-2").exists(), gv.exit_text(done.returncode))
        self.check_freed("respawn", report, [gpu])

    def case_ancestor(self):
        gpu = self.gpus[0]
        command = (f"{shlex.quote(self.bin)} --backend {shlex.quote(self.backend)} free --match {shlex.quote(self.scope(['sglang::ancestor']))} "
                   "--grace 0 --timeout 2s --yes --json")
        self.bash(self.holder("sglang::ancestor", 3, "ancestor", gpu, "-- " + command))
        self.wait_ready("ancestor")
        ancestor = self.procs.pid("sglang::ancestor")
        exit_code, _, output = (self.work / "ancestor.out").read_text().partition("\n")
        self.r.save("gpureap/ancestor-free.txt", f"$ {command}  # {gv.exit_text(int(exit_code))}\n{output}")
        try:
            report = json.loads(output)
        except json.JSONDecodeError:
            report = {}
        spared = {s["pid"]: s["reason"] for s in report.get("spared", [])}
        reasons = [r["reason"] for r in gv.outcome(report, gpu).get("reasons", [])]
        self.check("the calling process is spared as an ancestor, exit 1 with the reason on its GPU",
                   int(exit_code) == 1 and spared.get(ancestor) == "ancestor" and "protected" in reasons and gv.alive(ancestor)
                   and gv.outcome_indices(report) == [gpu],
                   f"{gv.exit_text(int(exit_code))}, spared {spared}, GPU {gpu} reasons {reasons}, outcomes for {gv.outcome_indices(report)}")

    def case_cross_gpu(self):
        if len(self.gpus) < 2:
            self.r.skip("cross-GPU: free --gpu frees only that GPU's holder", f"needs 2 GPUs, using {self.gpus}")
            return
        g0, g1 = self.gpus[0], self.gpus[1]
        titles = ["sglang::xgpu_TP0", "sglang::xgpu_TP1"]
        self.bash(self.holder(titles[0], 4, "xgpu0", g0))
        self.bash(self.holder(titles[1], 4, "xgpu1", g1))
        self.wait_ready("xgpu0", "xgpu1")
        a, b = self.procs.pid(titles[0]), self.procs.pid(titles[1])
        before = self.snap()
        self.check_placement("cross-GPU", {a: g0, b: g1}, before)
        _, _, status = self.gpureap("status-gpu", "status", "--gpu", str(g1), "--json")
        rows = [gpu["index"] for gpu in status.get("gpus", [])]
        self.check(f"status --gpu {g1} shows GPU {g1} only, the GPU-{g1} holder listed there and the GPU-{g0} one not",
                   rows == [g1] and gv.listed_by_driver_on(status, b) == [g1] and gv.listed_by_driver_on(status, a) == [],
                   f"GPUs {rows}; GPU-{g1} holder listed on {gv.listed_by_driver_on(status, b)}, GPU-{g0} holder on {gv.listed_by_driver_on(status, a)}"
                   f" (device node open on GPU {g1}: {any(p.get('pid') == a for p in (gv.gpu_row(status, g1) or {}).get('processes', []))})")
        _, _, plan = self.gpureap("free-gpu-dry", "free", "--gpu", str(g0), "--match", self.scope(titles), "--dry-run", "--json")
        self.check(f"free --gpu {g0} --dry-run plans the GPU-{g0} holder only", gv.targets(plan) == [a], str(gv.targets(plan)))
        done, _, report = self.gpureap("free-gpu", "free", "--gpu", str(g1), "--match", self.scope(titles), "--grace", "1s", "--yes", "--json")
        after = self.snap()
        self.check(f"free --gpu {g1}: exit 0, the GPU-{g1} holder is the only target", done.returncode == 0 and gv.targets(report) == [b],
                   f"{gv.exit_text(done.returncode)}, targets {gv.targets(report)} (GPU {g1}: {b}, GPU {g0}: {a})")
        self.check_freed(f"free --gpu {g1}", report, [g1])
        self.check(f"free --gpu {g1} spares the GPU-{g0} holder: alive, NVML still lists it on GPU {g0} with its memory, GPU {g0} memory unchanged",
                   gv.alive(a) and not gv.alive(b) and gv.nvml_gpus_of(after, a) == [g0] and after[g0][1].get(a) == before[g0][1].get(a)
                   and abs(after[g0][0] - before[g0][0]) <= gv.SLACK,
                   f"GPU {g0}: {before[g0][0] / GIB:.2f} -> {after[g0][0] / GIB:.2f} GiB used; GPU {g1}: {before[g1][0] / GIB:.2f} -> {after[g1][0] / GIB:.2f} GiB")
        done, _, report = self.gpureap("free-gpu0", "free", "--gpu", str(g0), "--match", self.scope(titles), "--grace", "1s", "--yes", "--json")
        self.check(f"free --gpu {g0} then takes the GPU-{g0} holder", done.returncode == 0 and gv.targets(report) == [a] and not gv.alive(a),
                   f"{gv.exit_text(done.returncode)}, targets {gv.targets(report)}")
        self.check_freed(f"free --gpu {g0}", report, [g0])

    def case_nohup_vs_orphan(self):
        gpu = self.gpus[-1]
        job_title, worker_title, launcher_title = "python3 train.py", "sglang::orphan_TP0", "python3 serve.py"
        # A healthy training job, `nohup python train.py &` from a shell with
        # job control that then exits: the job leads its own group.
        shell = self.bash('set -m; nohup bash -c "$JOB" >/dev/null 2>&1 & exit 0', JOB=self.holder(job_title, 3, "train", gpu))
        # A crashed server: its launcher leads its group, as a shell's job does;
        # the worker stays in that group.
        self.launch_job(gv.record(launcher_title) + "( " + self.holder(worker_title, 3, "orphan", gpu) + " ) & "
                        + f"exec -a '{launcher_title} --tp 1' sleep 100000")
        self.wait_ready("train", "orphan")
        shell.wait(timeout=10)
        job, worker, launcher = self.procs.pid(job_title), self.procs.pid(worker_title), self.procs.pid(launcher_title)
        j = gv.stat(job)
        self.check("the nohup job leads its own group and was re-parented when its shell exited",
                   j["pgid"] == job and j["ppid"] != shell.pid, f"pid {job}, pgid {j['pgid']}, ppid {j['ppid']} (shell was {shell.pid})")
        gv.signal_identity(launcher, self.procs.start(launcher))
        self.wait_until(lambda: gv.stat(worker)["ppid"] != launcher)
        w = gv.stat(worker)
        self.check("the crashed launcher's worker is in the dead launcher's group and re-parented",
                   w["pgid"] == launcher and w["ppid"] != launcher and not gv.alive(launcher), f"pid {worker}, pgid {w['pgid']}, ppid {w['ppid']}")
        before = self.snap()
        self.check_placement("nohup job and orphaned worker", {job: gpu, worker: gpu}, before)
        _, _, status = self.gpureap("status-nohup", "status", "--json")
        expected_text = gv.orphan_text(launcher, w["ppid"])
        worker_row, job_row = gv.holder(status, worker), gv.holder(status, job)
        self.check("status: the worker is flagged orphaned, with why",
                   "orphaned" in worker_row.get("flags", []) and worker_row.get("orphan") == expected_text,
                   f"flags {worker_row.get('flags')}, orphan {worker_row.get('orphan')!r} (expected {expected_text!r})")
        self.check("status: the nohup job is neither flagged orphaned nor given an orphan reason",
                   "orphaned" not in job_row.get("flags", []) and job_row.get("orphan") is None and bool(job_row),
                   f"flags {job_row.get('flags')}, orphan {job_row.get('orphan')!r}")
        scope = self.scope([job_title, worker_title])
        _, _, plan = self.gpureap("free-orphans-dry", "free", "--orphans", "--match", scope, "--dry-run", "--json")
        self.check("free --orphans --dry-run plans the worker only", gv.targets(plan) == [worker], str(gv.targets(plan)))
        done, _, report = self.gpureap("free-orphans-nohup", "free", "--orphans", "--match", scope, "--grace", "1s", "--yes", "--json")
        after = self.snap()
        self.check("free --orphans: exit 0, takes the worker (SIGTERM was enough) and says why",
                   done.returncode == 0 and gv.targets(report) == [worker] and gv.signals(report, worker) == ["SIGTERM"]
                   and gv.target(report, worker).get("orphan") == expected_text,
                   f"{gv.exit_text(done.returncode)}, targets {gv.targets(report)}, signals {gv.signals(report, worker)}, "
                   f"orphan {gv.target(report, worker).get('orphan')!r}")
        self.check_freed("free --orphans next to the nohup job", report, [gpu])
        self.check("the nohup job is spared: alive, still on its GPU with its memory",
                   gv.alive(job) and gv.nvml_gpus_of(after, job) == [gpu] and after[gpu][1].get(job) == before[gpu][1].get(job)
                   and not gv.nvml_gpus_of(after, worker), f"NVML on GPU {gpu}: {sorted(after[gpu][1])}")
        self.check_memory_back("orphaned worker", before, after, [worker])

    def case_wait(self):
        gpu = self.gpus[-1]
        self.bash(self.holder("sglang::waited_on", 2, "waited", gpu))
        self.wait_ready("waited")
        holder = self.procs.pid("sglang::waited_on")
        snapshot = self.snap()
        if len(self.gpus) >= 2:
            other = self.gpus[0]
            done, _, result = self.gpureap("wait-other-gpu", "wait", "--gpu", str(other), "--below", str(snapshot[other][0] + GIB), "--timeout", "5s", "--json")
            self.check(f"wait --gpu {other} returns at once while GPU {gpu} is held", done.returncode == 0 and result.get("ready")
                       and [x["index"] for x in result.get("gpus", [])] == [other], f"{gv.exit_text(done.returncode)}, waited {result.get('waited_ms')} ms")
        else:
            self.r.skip("wait on one GPU is not held up by another GPU's holder", f"needs 2 GPUs, using {self.gpus}")
        below = snapshot[gpu][0] - snapshot[gpu][1].get(holder, 0) + GIB // 2
        command = [self.bin, "--backend", self.backend, "wait", "--gpu", str(gpu), "--below", str(below), "--timeout", "60s", "--json"]
        waiter = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(1.0)
            self.check(f"wait --gpu {gpu} is still waiting while the holder holds memory", waiter.poll() is None)
            self.procs.kill(holder)
            out, err = waiter.communicate(timeout=60)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
        self.r.save("gpureap/wait.txt", f"$ gpureap {' '.join(command[1:])}  # {gv.exit_text(waiter.returncode)}\n{out}{err}")
        result = json.loads(out)
        self.check("wait exits 0 once the memory is back", waiter.returncode == 0 and result["ready"]
                   and [x["index"] for x in result.get("gpus", [])] == [gpu], f"waited {result['waited_ms']} ms")

    # ------------------------------------------------------------ main

    def pick_gpus(self):
        """Host facts, and which GPUs to use: False (logged) when there is none to use."""
        self.log(f"date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {self.version()}; kernel {os.uname().release}; "
                 f"{os.cpu_count()} CPUs; uid {os.geteuid()}; backend {self.backend}; run tag {self.tag}; work dir {self.work}")
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            self.log(f"note: CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']} is not passed on: holders number GPUs as NVML does")
        self.log(f"driver {self.nvml.driver()}; NVML reports {self.nvml.count} GPU(s); memory query {'v2' if self.nvml.v2 else 'v1'}")
        busy = {}
        for index in range(self.nvml.count):
            info = self.nvml.memory(index)
            listed = self.nvml.processes(index, graphics=True)
            busy[index] = sorted(listed)
            self.log(f"  GPU {index}: {self.nvml.name(index)}, {info.total / GIB:.1f} GiB, {info.used / GIB:.2f} GiB used"
                     f"{f', {info.reserved / GIB:.2f} GiB reserved' if hasattr(info, 'reserved') else ''}, {len(listed)} process(es)")
        self.gpus = gv.usable_gpus(self.log, self.nvml.count, self.requested, busy)
        if not self.gpus:
            return False
        self.log(f"using GPU(s) {self.gpus}")
        return True

    def preflight(self):
        """Host facts, which GPUs to use, and the checks that need no process."""
        if not self.pick_gpus():
            return False
        if self.backend == "nvml":
            _, _, auto = self.gpureap("status-auto", "status", "--json", backend=False)
            self.check("--backend auto picks NVML", str(auto.get("backend", "")).startswith("nvml"), auto.get("backend"))
        else:
            self.r.skip("--backend auto picks NVML", f"dry run on {self.backend}")
        _, _, status = self.gpureap("status-idle", "status", "--json")
        rows = sorted(gpu["index"] for gpu in status.get("gpus", []))
        problems = []
        for index in range(self.nvml.count):
            row = gv.gpu_row(status, index) or {}
            info = self.nvml.memory(index)
            if row.get("name") != self.nvml.name(index) or row.get("memory_total") != info.total or row.get("error"):
                problems.append(f"GPU {index}: {row.get('name')}, total {row.get('memory_total')}, error {row.get('error')}")
        self.check("status reports every GPU NVML reports, by index, with NVML's name and total memory",
                   rows == list(range(self.nvml.count)) and not problems,
                   f"GPUs {rows}: " + ", ".join(f"{gpu.get('name')} {gpu.get('memory_total')}" for gpu in status.get("gpus", [])) if not problems else problems)
        return True

    def version(self):
        return subprocess.run([self.bin, "--version"], stdout=subprocess.PIPE, text=True).stdout.strip()

    def run(self):
        self.started = started = time.monotonic()
        try:
            self.nvml = gv.Nvml(gv.load_pynvml())
            if not self.preflight():
                return 2
            self.case("SGLang-like server over the GPUs, launcher SIGKILLed, workers orphaned, TP1 ignores SIGTERM", self.case_sglang_orphans)
            self.case("Three workers over the GPUs, --grace 0: SIGSTOP+SIGKILL at once", self.case_grace_zero)
            self.case("A worker's grandchild double-forks, calls setsid, and holds another GPU", self.case_setsid)
            self.case("A hung CUDA parent with a zombie child it never reaps", self.case_zombie)
            self.case("A parent that ignores SIGTERM and respawns its CUDA worker, freed with --pid", self.case_respawn)
            self.case("gpureap run by a CUDA process that matches its own scope", self.case_ancestor)
            self.case("One holder per GPU: free --gpu takes only that GPU's holder", self.case_cross_gpu)
            self.case("A nohup job next to a crashed launcher's worker: --orphans takes the worker only", self.case_nohup_vs_orphan)
            self.case("gpureap wait: returns once the holder's memory is back", self.case_wait)
        except Exception as error:
            self.log(traceback.format_exc())
            self.check("the validation ran to the end", False, f"{type(error).__name__}: {error}")
        finally:
            self.cleanup()
        return self.finish(started, "Timings (gpureap's verified-free time per GPU, and the command's wall time):")

    def finish(self, started, timings_title, logs=()):
        """The timings, the children's log and `logs` (names in the work dir) saved, and the summary: the exit code."""
        if self.timings:
            self.log("\n" + timings_title)
            for case, figure in self.timings:
                self.log(f"  {case}: {figure}")
        self.child_log.close()
        for name in ("children.log", *logs):
            if (self.work / name).exists():
                self.r.save(name, (self.work / name).read_text(errors="replace"))
        line, failed, code = self.r.summary()
        self.log(f"\ntotal {time.monotonic() - started:.0f} s")
        if failed:
            self.log("failed: " + "; ".join(failed))
        self.log(line)
        self.r.close()
        return code


if __name__ == "__main__":
    sys.exit(Validation(gv.parse_args(sys.argv[1:], __doc__.splitlines()[0])).run())
