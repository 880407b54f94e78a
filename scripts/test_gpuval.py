"""Tests of the GPU validation scripts' helpers; no GPU, PyTorch or pynvml needed.

    python3 -m unittest discover -s scripts
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

import gpuval as gv

GIB = gv.GIB


def status_doc():
    """A status document: worker 10 on GPU 0 (node open on GPU 1 too, as
    CUDA opens every device node), worker 11 on GPU 1, monitor 12."""
    return {
        "gpus": [
            {"index": 0, "name": "H200", "memory_total": 140 * GIB, "processes": [
                {"pid": 10, "memory": 4 * GIB, "listed_by_driver": True, "node_open": True},
                {"pid": 11, "memory": None, "listed_by_driver": False, "node_open": True},
                {"pid": 12, "memory": None, "listed_by_driver": False, "node_open": True},
            ]},
            {"index": 1, "name": "H200", "memory_total": 140 * GIB, "processes": [
                {"pid": 10, "memory": None, "listed_by_driver": False, "node_open": True},
                {"pid": 11, "memory": 4 * GIB, "listed_by_driver": True, "node_open": True},
            ]},
        ],
        "holders": [
            {"pid": 10, "gpus": [{"index": 0, "memory": 4 * GIB}, {"index": 1, "memory": None}], "flags": ["orphaned"]},
            {"pid": 11, "gpus": [{"index": 0, "memory": None}, {"index": 1, "memory": 4 * GIB}], "flags": []},
            {"pid": 12, "gpus": [{"index": 0, "memory": None}], "flags": ["monitor"]},
        ],
    }


class Parsing(unittest.TestCase):
    def test_gpu_lists(self):
        self.assertIsNone(gv.parse_gpu_list(None))
        self.assertIsNone(gv.parse_gpu_list("all"))
        self.assertEqual(gv.parse_gpu_list("1"), [1])
        self.assertEqual(gv.parse_gpu_list("3,0-1"), [0, 1, 3])
        with self.assertRaises(ValueError):
            gv.parse_gpu_list("3-1")
        with self.assertRaises(ValueError):
            gv.parse_gpu_list(",")

    def test_stat_with_a_title_full_of_parentheses(self):
        text = "4242 (sglang::x) (TP0) S 1 4000 3999 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 5 0 987654 0 0\n"
        self.assertEqual(gv.parse_stat(text), {"state": "S", "ppid": 1, "pgid": 4000, "sid": 3999, "start": 987654})

    def test_records(self):
        text = "12 345 sglang::scheduler_TP0\n13 346 python3 train.py\ngarbage\n"
        self.assertEqual(gv.parse_records(text), [(12, 345, "sglang::scheduler_TP0"), (13, 346, "python3 train.py")])

    def test_unsafe_titles_are_refused(self):
        for title in ("a'b", "a$(rm)", 'a"b', "a;b"):
            with self.assertRaises(ValueError):
                gv.record(title)
        gv.record("python3 -m sglang.launch_server")

    def test_rank_from_a_worker_title(self):
        self.assertEqual(gv.rank_in("sglang::scheduler_TP12 /x/fake_sglang.py worker"), 12)
        self.assertIsNone(gv.rank_in("sglang::detokenizer 100000"))
        self.assertIsNone(gv.rank_in(None))


class Helpers(unittest.TestCase):
    def test_spread_and_pick(self):
        self.assertEqual([gv.spread([0, 1], rank) for rank in range(3)], [0, 1, 0])
        self.assertEqual([gv.spread([5], rank) for rank in range(3)], [5, 5, 5])
        use, notes, errors = gv.pick_gpus(2, None, {0: [], 1: [999]})
        self.assertEqual((use, errors), ([0], []))
        self.assertIn("999", notes[0])
        use, notes, errors = gv.pick_gpus(2, [1, 4], {})
        self.assertEqual(use, [1])
        self.assertIn("GPU 4 does not exist", errors[0])

    def test_usable_gpus_logs_its_notes_and_refuses_a_missing_gpu(self):
        said = []
        self.assertEqual(gv.usable_gpus(said.append, 2, None, {1: [999]}), [0])
        self.assertEqual(len(said), 1)
        self.assertIn("999", said[0])
        said.clear()
        self.assertEqual(gv.usable_gpus(said.append, 2, [1, 4], {}), [])
        self.assertEqual(said, ["refusing to run: GPU 4 does not exist (NVML reports 2)"])
        said.clear()
        self.assertEqual(gv.usable_gpus(said.append, 1, None, {0: [7]}), [])
        self.assertEqual(said[-1], "refusing to run: no GPU to use")

    def test_nvml_placement(self):
        snapshot = {0: (9 * GIB, {10: 4 * GIB, 11: 300 << 20}), 1: (4 * GIB, {11: 4 * GIB})}
        self.assertEqual(gv.nvml_gpus_of(snapshot, 11), [0, 1])
        self.assertEqual(gv.placement_problems(snapshot, {10: 0, 11: 1}), {11: [0, 1]})
        self.assertEqual(gv.placement_problems(snapshot, {10: 0}), {})
        self.assertEqual(gv.nvml_share(snapshot, 0, [10, 11, 99]), 4 * GIB + (300 << 20))

    def test_status_placement_reads_listed_by_driver_not_open_nodes(self):
        status = status_doc()
        self.assertEqual(gv.listed_by_driver_on(status, 10), [0])
        self.assertEqual(gv.listed_by_driver_on(status, 12), [])
        snapshot = {0: (0, {10: 4 * GIB}), 1: (0, {11: 4 * GIB + 100 * gv.MIB})}
        self.assertEqual(gv.status_placement_problems(status, snapshot, {10: 0, 11: 1}), {})
        self.assertIn("listed on GPUs [0]", gv.status_placement_problems(status, snapshot, {10: 1})[10])
        off = {0: (0, {10: 5 * GIB}), 1: (0, {})}
        self.assertIn("memory", gv.status_placement_problems(status, off, {10: 0})[10])

    def test_free_reports(self):
        report = {
            "targets": [{"pid": 7, "signals": [{"signal": "SIGTERM", "delivery": "sent"}, {"signal": "SIGKILL", "delivery": "gone"}]},
                        {"pid": 5, "signals": []}],
            "gpus": [{"index": 1, "freed": True, "checked": True, "reasons": []},
                     {"index": 0, "freed": False, "checked": False, "reasons": [{"reason": "driver_error"}]}],
        }
        self.assertEqual(gv.targets(report), [5, 7])
        self.assertEqual(gv.signals(report, 7), ["SIGTERM"])
        self.assertEqual(gv.signals(report, 5), [])
        self.assertIsNone(gv.signals(report, 6))
        self.assertEqual(gv.freed_problems(report, [1]), ["outcomes for GPUs [0, 1], expected [1]"])
        self.assertEqual(gv.freed_problems(report, [0, 1, 1]), ["GPU 0 not freed (checked False, reasons ['driver_error'])"])
        report["gpus"] = report["gpus"][:1]
        self.assertEqual(gv.freed_problems(report, [1]), [])

    def test_orphan_text_and_freed_lines(self):
        self.assertEqual(gv.orphan_text(400, 1), "group leader 400 is gone; re-parented to PID 1")
        self.assertEqual(gv.orphan_text(400, 77), "group leader 400 is gone; re-parented to subreaper 77")
        lines = ["gpureap run: GPU 1: freed 4.5 GiB in 15ms", "gpureap run: GPU 10: freed 1 GiB", "gpureap run: GPU 1: still held"]
        self.assertEqual(gv.freed_lines(lines, 1), lines[:1])

    def test_summary(self):
        report = gv.Report()
        report.skip("two GPUs", "one GPU")
        self.assertEqual(report.summary()[2], 1)  # nothing passed: not a success
        report.check("a", True)
        self.assertEqual(report.summary(), ("1 passed, 0 failed, 1 skipped", [], 0))
        report.check("b", False, "why")
        self.assertEqual(report.summary(), ("1 passed, 1 failed, 1 skipped", ["b"], 1))


class Processes(unittest.TestCase):
    """Real processes (sleep), no GPU."""

    def test_record_fragment_writes_pid_and_start_time(self):
        with tempfile.TemporaryDirectory() as work:
            pids = Path(work) / "pids"
            child = subprocess.Popen(["bash", "-c", gv.record("sglang::x (TP0)") + "exec -a 'sglang::x (TP0)' sleep 30"],
                                     env=dict(os.environ, P=str(pids)))
            try:
                deadline = time.time() + 5
                while not pids.exists() and time.time() < deadline:
                    time.sleep(0.01)
                [(pid, start, title)] = gv.parse_records(pids.read_text())
                self.assertEqual((pid, title), (child.pid, "sglang::x (TP0)"))
                self.assertEqual(start, gv.stat(child.pid)["start"])
            finally:
                child.kill()
                child.wait()

    def test_signal_identity_checks_the_start_time(self):
        child = subprocess.Popen(["sleep", "30"])
        try:
            start = gv.stat(child.pid)["start"]
            self.assertFalse(gv.signal_identity(child.pid, start + 1))
            self.assertTrue(gv.alive(child.pid, start))
            self.assertTrue(gv.signal_identity(child.pid, start, signal.SIGTERM))
            deadline = time.time() + 5
            while gv.stat(child.pid)["state"] != "Z" and time.time() < deadline:
                time.sleep(0.01)
            self.assertFalse(gv.signal_identity(child.pid, start))  # a zombie: dead already
            self.assertFalse(gv.alive(child.pid))
        finally:
            child.kill()
            child.wait()

    def test_kill_all_ends_tagged_processes_and_nothing_else(self):
        tag = gv.new_tag()
        with tempfile.TemporaryDirectory() as work:
            procs = gv.Processes(Path(work) / "pids", tag)
            bystander = subprocess.Popen(["sleep", "30"])
            try:
                env = dict(os.environ, P=str(Path(work) / "pids"), **{gv.TAG_VAR: tag})
                # A recorded grandchild, and one that escaped (setsid, not recorded).
                procs.popen(["bash", "-c", "( " + gv.record("kept") + "exec sleep 30 ) & ( exec setsid sleep 31 ) & wait"], env=env)
                deadline = time.time() + 5
                while len(gv.tagged(tag)) < 3 and time.time() < deadline:
                    time.sleep(0.01)
                found = [pid for pid, _ in gv.tagged(tag)]
                self.assertEqual(len(found), 3)
                killed = procs.kill_all()
                self.assertEqual(sorted(killed), sorted(found))
                self.assertTrue(gv.alive(bystander.pid))
                time.sleep(0.1)
                self.assertFalse(any(gv.alive(pid) for pid in found))
            finally:
                bystander.kill()
                bystander.wait()


class Watch(unittest.TestCase):
    """The helpers of scripts/gpu_watch_validate.py and scripts/fake_ssh.py."""

    def test_ssh_arguments_as_gpureap_passes_them(self):
        argv = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-T", "gpu01", "gpureap status --json"]
        self.assertEqual(gv.ssh_remote_command(argv), ("gpu01", "gpureap status --json"))
        # Options glued to their value, flags grouped, a config file, words joined as ssh joins them.
        argv = ["-oBatchMode=yes", "-F", "/x/ssh config", "-qT", "-p22", "root@h", "echo", "a b"]
        self.assertEqual(gv.ssh_remote_command(argv), ("root@h", "echo a b"))
        self.assertEqual(gv.ssh_remote_command(["--", "h", "-o"]), ("h", "-o"))
        self.assertEqual(gv.ssh_remote_command(["h"]), ("h", ""))
        for bad in ([], ["-T"], ["-o"], ["-o", "X"]):
            with self.assertRaises(ValueError):
                gv.ssh_remote_command(bad)

    def test_remote_env_drops_gpureaps_settings_but_keeps_the_tag(self):
        env = {"PATH": "/bin", "GPUREAP_BACKEND": "sim:/x", "GPUREAP_SSH": "ssh", gv.TAG_VAR: "gv1", "GPUREAPX": "y"}
        self.assertEqual(gv.remote_env(env), {"PATH": "/bin", gv.TAG_VAR: "gv1", "GPUREAPX": "y"})

    def test_fake_ssh_runs_the_remote_command_here(self):
        """A real run of scripts/fake_ssh.py: options dropped, stdin and the exit code passed through, the call logged."""
        with tempfile.TemporaryDirectory() as work:
            log = Path(work) / "ssh.log"
            done = subprocess.run(
                [sys.executable, str(Path(gv.__file__).parent / "fake_ssh.py"), "--log", str(log), "-o", "BatchMode=yes",
                 "-o", "ConnectTimeout=3", "-T", "gpuhost", "read -r line; echo \"got $line ${GPUREAP_BACKEND:-unset}\"; exit 7"],
                input="hello\n", stdout=subprocess.PIPE, text=True, env=dict(os.environ, GPUREAP_BACKEND="sim:/nowhere"))
            self.assertEqual((done.returncode, done.stdout), (7, "got hello unset\n"))
            self.assertTrue(log.read_text().startswith("gpuhost\tread -r line"))
            done = subprocess.run([sys.executable, str(Path(gv.__file__).parent / "fake_ssh.py"), "-T"], stderr=subprocess.PIPE, text=True)
            self.assertEqual(done.returncode, 255)  # its own failure, as ssh's
            self.assertIn("no host", done.stderr)

    def test_metrics(self):
        text = (
            "# HELP gpureap_gpu_memory_used_bytes Memory in use.\n"
            "# TYPE gpureap_gpu_memory_used_bytes gauge\n"
            'gpureap_gpu_memory_used_bytes{gpu="0",uuid="GPU-a"} 4.5e9\n'
            'gpureap_gpu_memory_used_bytes{gpu="1",uuid="GPU-b"} 0\n'
            'gpureap_driver_up{backend="nvml"} 1\n'
            'gpureap_process_gpu_memory_bytes{pid="7",comm="a \\"b\\" {c}, d\\\\",gpu="1"} 12 1700000000000\n'
            "gpureap_scans_total 3\n"
            "# EOF\n"
        )
        samples = gv.parse_metrics(text)
        self.assertEqual(len(samples), 5)
        self.assertEqual(gv.metric(samples, "gpureap_gpu_memory_used_bytes", gpu=0), 4.5e9)
        self.assertEqual(gv.metric(samples, "gpureap_gpu_memory_used_bytes", gpu="1"), 0)
        self.assertIsNone(gv.metric(samples, "gpureap_gpu_memory_used_bytes"))  # two samples: not one value
        self.assertEqual(sorted(gv.metric_values(samples, "gpureap_gpu_memory_used_bytes")), [0, 4.5e9])
        self.assertIsNone(gv.metric(samples, "gpureap_gpu_memory_used_bytes", gpu=2))
        self.assertEqual(gv.metric(samples, "gpureap_driver_up", backend="nvml"), 1)
        self.assertEqual(gv.metric(samples, "gpureap_scans_total"), 3)
        [(_, labels, value)] = [sample for sample in samples if sample[0] == "gpureap_process_gpu_memory_bytes"]
        self.assertEqual((labels["comm"], labels["gpu"], value), ('a "b" {c}, d\\', "1", 12))
        for bad in ("gpureap_x{gpu=0} 1\n", "gpureap_x{gpu=\"0\"}\n", "{} 1\n"):
            with self.assertRaises(ValueError):
                gv.parse_metrics(bad)

    def test_fleet_hosts(self):
        document = {"kind": "fleet", "hosts": [
            {"host": "a", "exit_code": 0, "error": None, "report": {"kind": "status"}},
            {"host": "b", "exit_code": 3, "error": "ssh: connect to host b port 22: Connection refused", "report": None}]}
        self.assertEqual(gv.fleet_hosts(document), {"a": (0, {"kind": "status"}, None),
                                                   "b": (3, None, "ssh: connect to host b port 22: Connection refused")})
        self.assertEqual(gv.fleet_hosts({}), {})

    def test_status_differences(self):
        mine = status_doc()
        for gpu, used in zip(mine["gpus"], (8 * GIB, 4 * GIB)):
            gpu["memory_used"] = used
        self.assertEqual(gv.status_differences(mine, mine, [10, 11, 12]), [])
        theirs = json.loads(json.dumps(mine))
        theirs["gpus"][1]["memory_used"] += 100 * gv.MIB  # within the slack
        self.assertEqual(gv.status_differences(mine, theirs, [10, 11]), [])
        theirs["gpus"][0]["name"] = "H100"
        theirs["gpus"][1]["memory_used"] = None
        theirs["gpus"][0]["processes"][0]["listed_by_driver"] = False  # 10 listed nowhere
        theirs["holders"][1]["gpus"][1]["memory"] = 5 * GIB
        self.assertEqual(gv.status_differences(mine, theirs, [10, 11]), [
            "GPU 0 name: 'H200' vs 'H100'", f"GPU 1 memory_used: {4 * GIB} vs None",
            "PID 10 listed on GPUs [0] vs []", f"PID 11 on GPU 1: {4 * GIB} vs {5 * GIB} bytes"])
        self.assertEqual(gv.status_differences(mine, {"gpus": []}, [])[0], "GPUs [0, 1] vs []")


if __name__ == "__main__":
    unittest.main()
