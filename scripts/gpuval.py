"""What scripts/gpu_validate.py and scripts/gpu_run_validate.py share.

PASS/FAIL/SKIP lines and the summary, the --out directory, NVML read per GPU,
the processes a script started (known by PID and start time, so a recycled PID
is never signalled) and how they are ended, and pure helpers over gpureap's
JSON. Importing this module needs neither PyTorch nor pynvml, so the helpers
are tested without a GPU: `python3 -m unittest discover -s scripts`.

With GPUREAP_VALIDATE_SIM=DIR set (tests/gpu_sim/simulate.py sets it), the
scripts run against gpureap's simulated driver in DIR, with stand-ins for
pynvml and PyTorch (tests/gpu_sim): a dry run of their logic on a machine
without a GPU. Their results there say nothing about the real driver.
"""

import argparse
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20
# What gpureap's verification allows the driver's own bookkeeping
# (verify::BOOKKEEPING_SLACK): NVML's "used" exceeds the sum of its
# per-process figures by a few MiB.
SLACK = 256 * MIB
TAG_VAR = "GPUREAP_VALIDATE_TAG"
SIM_VAR = "GPUREAP_VALIDATE_SIM"
ROOT = Path(__file__).resolve().parent.parent
# gpureap's exit codes.
EXIT_MEANING = {0: "done", 1: "still held", 2: "usage", 3: "could not complete"}


# ---------------------------------------------------------------- arguments


def parse_gpu_list(text):
    """`0,1`, `0-3`, `all` (None: every GPU) -> sorted list of indices."""
    if text is None or text.strip() == "all":
        return None
    indices = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, high = (int(x) for x in part.split("-", 1))
            if high < low:
                raise ValueError(f"bad GPU range {part!r}")
            indices.update(range(low, high + 1))
        else:
            indices.add(int(part))
    if not indices:
        raise ValueError(f"no GPU in {text!r}")
    return sorted(indices)


def parse_args(argv, description, extra=None):
    """The scripts' arguments; `extra(parser)` adds a script's own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("binary", nargs="?", default=str(ROOT / "target/release/gpureap"), help="the gpureap binary")
    parser.add_argument("--gpu", default=None, help="GPUs to use: 0,1 or 0-3 or all (default: every GPU no other process uses)")
    parser.add_argument("--out", default=None, help="write the log, every gpureap command and its output here")
    if extra:
        extra(parser)
    args = parser.parse_args(argv)
    args.binary = str(Path(args.binary).resolve())
    args.gpu = parse_gpu_list(args.gpu)
    args.out = Path(args.out) if args.out else None
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    return args


# ---------------------------------------------------------------- checks


class Report:
    """PASS/FAIL/SKIP lines, on stdout and in OUT/LOG_NAME."""

    def __init__(self, out=None, log_name="validate.log"):
        self.out = out
        self.results = []  # (status, name, detail)
        self.log_file = open(out / log_name, "a", buffering=1) if out else None

    def log(self, text=""):
        print(text, flush=True)
        if self.log_file:
            self.log_file.write(text + "\n")

    def check(self, name, passed, detail=""):
        status = "PASS" if passed else "FAIL"
        self.results.append((status, name, detail))
        self.log(f"{status} {name}{': ' + str(detail) if detail != '' else ''}")
        return bool(passed)

    def skip(self, name, why):
        self.results.append(("SKIP", name, why))
        self.log(f"SKIP {name}: {why}")

    def counts(self):
        return {status: sum(1 for s, _, _ in self.results if s == status) for status in ("PASS", "FAIL", "SKIP")}

    def summary(self):
        """The closing line and the exit code: 1 if any check failed, or none ran."""
        counts = self.counts()
        failed = [name for status, name, _ in self.results if status == "FAIL"]
        line = f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped"
        code = 1 if failed or counts["PASS"] == 0 else 0
        return line, failed, code

    def save(self, name, text):
        """Writes OUT/NAME (nothing without --out); returns the path."""
        if not self.out:
            return None
        path = self.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def close(self):
        if self.log_file:
            self.log_file.close()
            self.log_file = None


def exit_text(code):
    return f"exit {code} ({EXIT_MEANING.get(code, 'unexpected')})"


# ---------------------------------------------------------------- /proc


def parse_stat(text):
    """/proc/PID/stat -> state, ppid, pgid, sid and start time (ticks since boot)."""
    fields = text.rsplit(")", 1)[1].split()
    return {
        "state": fields[0],
        "ppid": int(fields[1]),
        "pgid": int(fields[2]),
        "sid": int(fields[3]),
        "start": int(fields[19]),
    }


def stat(pid):
    """parse_stat of a process, or None when it is gone."""
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def alive(pid, start=None):
    """Running (not a zombie), and the same process when `start` is given."""
    now = stat(pid)
    return now is not None and now["state"] not in ("Z", "X") and (start is None or now["start"] == start)


def cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def signal_identity(pid, start, sig=signal.SIGKILL):
    """Sends `sig` to PID only while it is still the process that started at
    `start`: through a pidfd opened before the check, so the PID cannot be
    recycled in between. Returns whether the signal was sent (never to a
    zombie: it is dead already)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):
        fd = None  # no pidfd (Python < 3.9 or Linux < 5.3): check, then kill
    try:
        now = stat(pid)
        if now is None or now["start"] != start or now["state"] in ("Z", "X"):
            return False  # gone, another process, or dead already (a zombie)
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def parse_records(text):
    """Lines `PID START TITLE` (written by RECORD) -> [(pid, start, title)]."""
    records = []
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
            records.append((int(parts[0]), int(parts[1]), parts[2]))
    return records


# A bash fragment that appends "PID START TITLE" for the current (sub)shell to
# "$P": its PID survives the `exec -a` that follows, and so does its start time.
RECORD = 'p=$BASHPID; read -r s < /proc/$p/stat; s=${s##*) }; set -- $s; echo "$p ${20} %s" >> "$P"; '
SAFE_TITLE = re.compile(r"^[A-Za-z0-9_.:+=/ ()-]+$")


def record(title):
    if not SAFE_TITLE.match(title) or "'" in title:
        raise ValueError(f"unsafe title {title!r}")
    return RECORD % title


def tagged(tag):
    """(pid, start) of every process whose environment carries TAG_VAR=tag:
    only this run's descendants, whatever they became."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            now = stat(int(entry))
            if now is not None:
                found.append((int(entry), now["start"]))
    return found


class Processes:
    """Everything a script starts: its direct children (Popen) and what they
    record in the pids file, each by PID and start time; all of it carries
    TAG_VAR=tag in its environment. `kill_all` ends exactly these."""

    def __init__(self, pids_file, tag):
        self.pids_file = Path(pids_file)
        self.tag = tag
        self.children = []

    def popen(self, args, **kwargs):
        child = subprocess.Popen(args, **kwargs)
        self.children.append(child)
        return child

    def records(self):
        try:
            return parse_records(self.pids_file.read_text())
        except FileNotFoundError:
            return []

    def pid(self, title):
        """The PID last recorded under `title`."""
        matches = [pid for pid, _, recorded in self.records() if recorded == title]
        if not matches:
            raise KeyError(title)
        return matches[-1]

    def start(self, pid):
        for recorded, start, _ in self.records():
            if recorded == pid:
                return start
        return None

    def kill(self, pid):
        """SIGKILL a recorded process, if it is still that process."""
        start = self.start(pid)
        return start is not None and signal_identity(pid, start)

    def kill_all(self, sweep=True):
        """SIGKILL every child, then every recorded process, then (with
        `sweep`) anything else carrying this run's tag; reaps the children.
        Returns the PIDs signalled."""
        signalled = []
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)  # not reaped yet: cannot be recycled
                signalled.append(child.pid)
        for _ in range(2):  # twice: a parent killed mid-fork leaves a child that records itself late
            time.sleep(0.2)
            for pid, start, _ in self.records():
                if signal_identity(pid, start):
                    signalled.append(pid)
        if sweep:
            for pid, start in tagged(self.tag):
                if signal_identity(pid, start):
                    signalled.append(pid)
        for child in self.children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.children = [child for child in self.children if child.returncode is None]
        return sorted(set(signalled))


def new_tag():
    return "gv" + secrets.token_hex(5)


def child_env(tag, **extra):
    """The environment of everything a script starts: this interpreter's
    sys.path as PYTHONPATH (`exec -a TITLE python3` hides where python3 lives,
    so the child would not find PyTorch's site-packages), CUDA devices
    numbered as NVML numbers them (PCI bus order, every GPU visible), and the
    run's tag."""
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    paths = [path for path in sys.path if path]
    if sim_dir():
        paths.insert(0, SIM_MODULES)  # the stand-ins for PyTorch and pynvml
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env[TAG_VAR] = tag
    env.update({key: str(value) for key, value in extra.items()})
    return env


# ---------------------------------------------------------------- the driver


def sim_dir():
    return os.environ.get(SIM_VAR) or None


def backend():
    """gpureap's --backend: the real NVML, or the simulated driver in a dry run."""
    return f"sim:{sim_dir()}" if sim_dir() else "nvml"


SIM_MODULES = str(ROOT / "tests" / "gpu_sim")


def load_pynvml():
    if sim_dir():
        sys.path.insert(0, SIM_MODULES)
    import pynvml

    return pynvml


def as_text(value):
    return value.decode() if isinstance(value, bytes) else value


class Nvml:
    """NVML, read per GPU: memory used (the v2 query, as gpureap reports it,
    where pynvml has it) and the processes listed with their memory."""

    def __init__(self, pynvml):
        self.nv = pynvml
        pynvml.nvmlInit()
        self.count = pynvml.nvmlDeviceGetCount()
        self.handles = {index: pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(self.count)}
        self.v2 = True
        try:
            pynvml.nvmlDeviceGetMemoryInfo(self.handles[0], version=pynvml.nvmlMemory_v2) if self.count else None
        except Exception:
            self.v2 = False

    def driver(self):
        return as_text(self.nv.nvmlSystemGetDriverVersion())

    def name(self, index):
        return as_text(self.nv.nvmlDeviceGetName(self.handles[index]))

    def memory(self, index):
        handle = self.handles[index]
        if self.v2:
            return self.nv.nvmlDeviceGetMemoryInfo(handle, version=self.nv.nvmlMemory_v2)
        return self.nv.nvmlDeviceGetMemoryInfo(handle)

    def processes(self, index, graphics=False):
        handle = self.handles[index]
        listed = {p.pid: p.usedGpuMemory for p in self.nv.nvmlDeviceGetComputeRunningProcesses(handle)}
        if graphics:
            try:
                listed.update({p.pid: p.usedGpuMemory for p in self.nv.nvmlDeviceGetGraphicsRunningProcesses(handle)})
            except Exception:
                pass
        return listed

    def snapshot(self, indices):
        """{index: (used, {pid: memory})}."""
        return {index: (self.memory(index).used, self.processes(index)) for index in indices}


# ---------------------------------------------------------------- pure helpers


def spread(gpus, i):
    """The GPU of rank i when ranks are spread over `gpus` in turn."""
    return gpus[i % len(gpus)]


def pick_gpus(count, requested, busy):
    """Which GPUs to use: `requested` (None: all `count`), less those with
    processes this script did not start (`busy`: {index: [pid]}). Returns
    (use, notes, errors)."""
    wanted = list(range(count)) if requested is None else requested
    errors = [f"GPU {index} does not exist (NVML reports {count})" for index in wanted if index >= count]
    use, notes = [], []
    for index in wanted:
        if index >= count:
            continue
        if busy.get(index):
            notes.append(f"GPU {index} not used: NVML lists processes this script did not start: {sorted(busy[index])}")
        else:
            use.append(index)
    return use, notes, errors


def usable_gpus(log, count, requested, busy):
    """`pick_gpus` with its notes and any refusal written by `log`: the GPUs to use, or [] when
    the run must not go on (a requested GPU that does not exist, or none left to use)."""
    use, notes, errors = pick_gpus(count, requested, busy)
    for note in notes:
        log(note)
    if errors or not use:
        log("refusing to run: " + ("; ".join(errors) if errors else "no GPU to use"))
        return []
    return use


def nvml_gpus_of(snapshot, pid):
    """The GPUs whose NVML list has PID."""
    return sorted(index for index, (_, listed) in snapshot.items() if pid in listed)


def nvml_share(snapshot, index, pids):
    """What PIDS hold on GPU index, by NVML."""
    listed = snapshot[index][1]
    return sum(listed.get(pid) or 0 for pid in pids)


def placement_problems(snapshot, expected):
    """expected {pid: gpu}: PIDs NVML does not list on exactly their GPU."""
    return {pid: nvml_gpus_of(snapshot, pid) for pid, gpu in expected.items() if nvml_gpus_of(snapshot, pid) != [gpu]}


def gpu_row(status, index):
    return next((gpu for gpu in status.get("gpus", []) if gpu.get("index") == index), None)


def listed_by_driver_on(status, pid):
    """The GPUs on which gpureap's status says the driver lists PID."""
    return sorted(
        gpu["index"]
        for gpu in status.get("gpus", [])
        if any(p.get("pid") == pid and p.get("listed_by_driver") for p in gpu.get("processes", []))
    )


def holder(status, pid):
    return next((h for h in status.get("holders", []) if h.get("pid") == pid), {})


def holder_memory(status, pid, index):
    """A holder's memory on GPU index, as gpureap reports it."""
    for gpu in holder(status, pid).get("gpus", []):
        if gpu.get("index") == index:
            return gpu.get("memory")
    return None


def status_placement_problems(status, snapshot, expected):
    """expected {pid: gpu}. For each PID, what is wrong in `status`: listed by
    the driver on another GPU than its own, or its memory there off NVML's
    figure by more than SLACK. Returns {pid: text}."""
    problems = {}
    for pid, gpu in expected.items():
        listed = listed_by_driver_on(status, pid)
        reported = holder_memory(status, pid, gpu)
        nvml = snapshot.get(gpu, (0, {}))[1].get(pid)
        if listed != [gpu]:
            problems[pid] = f"listed on GPUs {listed}, expected [{gpu}]"
        elif reported is None or nvml is None or abs(reported - nvml) > SLACK:
            problems[pid] = f"memory {reported} vs NVML {nvml}"
    return problems


def describe_placement(status, expected):
    return ", ".join(
        f"{pid} on GPU {gpu}: {(holder_memory(status, pid, gpu) or 0) / GIB:.2f} GiB" for pid, gpu in expected.items()
    )


def targets(report):
    return sorted(t["pid"] for t in report.get("targets", []))


def target(report, pid):
    return next((t for t in report.get("targets", []) if t.get("pid") == pid), {})


def signals(report, pid):
    """Signals sent to PID (delivered), or None if it was no target."""
    found = target(report, pid)
    if not found:
        return None
    return [e["signal"] for e in found.get("signals", []) if e.get("delivery") == "sent"]


def outcome(report, index):
    return next((gpu for gpu in report.get("gpus", []) if gpu.get("index") == index), {})


def outcome_indices(report):
    return sorted(gpu["index"] for gpu in report.get("gpus", []))


def freed_problems(report, indices):
    """Whether `report` has one outcome per GPU in `indices`, no other, each
    verified freed. Returns a list of problems (empty: all good)."""
    problems = []
    if outcome_indices(report) != sorted(set(indices)):
        problems.append(f"outcomes for GPUs {outcome_indices(report)}, expected {sorted(set(indices))}")
    for index in sorted(set(indices)):
        found = outcome(report, index)
        if found.get("freed") is not True:
            reasons = [r.get("reason") for r in found.get("reasons", [])]
            problems.append(f"GPU {index} not freed (checked {found.get('checked')}, reasons {reasons})")
    return problems


def describe_outcomes(report):
    return "; ".join(
        f"GPU {gpu['index']}: {'freed' if gpu.get('freed') else 'not freed'}"
        f" {((gpu.get('freed_bytes') or 0) / GIB):.2f} GiB after {gpu.get('freed_after_ms')} ms"
        for gpu in report.get("gpus", [])
    )


def orphan_text(leader, parent):
    """gpureap's `orphan` text for a process whose group leader is gone."""
    return f"group leader {leader} is gone; re-parented to " + ("PID 1" if parent == 1 else f"subreaper {parent}")


def freed_lines(lines, index):
    """gpureap run's 'GPU N: freed ...' lines for GPU index."""
    return [line for line in lines if re.search(rf"\bGPU {index}: freed\b", line)]


def rank_in(cmdline):
    """A fake SGLang worker's rank, from its title `sglang::scheduler_TP{r}`; None for anything else."""
    found = re.match(r"sglang::scheduler_TP(\d+)\b", cmdline or "")
    return int(found.group(1)) if found else None


# ---------------------------------------------------------------- ssh, metrics, fleet

# ssh's options that take a value (ssh(1)); every other option is a flag.
SSH_VALUE_OPTIONS = set("BbcDEeFIiJLlmOopQRSWw")


def ssh_remote_command(argv):
    """ssh's arguments -> (host, the remote command): options (`-o X`,
    `-oX`, `-T`, `-F FILE`...) dropped, the first other word the host, the
    rest joined by spaces, as ssh joins them for the remote shell. Raises
    ValueError on a missing host or a missing option value."""
    at = 0
    while at < len(argv):
        word = argv[at]
        if word == "--":
            at += 1
            break
        if not word.startswith("-") or word == "-":
            break
        flags = word[1:]
        for position, letter in enumerate(flags):
            if letter in SSH_VALUE_OPTIONS:
                if position == len(flags) - 1:  # `-o X`: the value is the next word
                    at += 1
                    if at >= len(argv):
                        raise ValueError(f"ssh option -{letter} needs a value")
                break  # `-oX`: the rest of the word is the value
        at += 1
    if at >= len(argv):
        raise ValueError("no host given")
    return argv[at], " ".join(argv[at + 1:])


def remote_env(environ):
    """The environment a command gets on a host over ssh, here: this one,
    less gpureap's own settings (GPUREAP_BACKEND, GPUREAP_SSH...: ssh does not
    carry them, docs/fleet.md), keeping the run's tag so that whatever is
    started is still found and cleaned up."""
    return {key: value for key, value in environ.items() if not key.startswith("GPUREAP_") or key == TAG_VAR}


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_metrics(text):
    """Prometheus' text format (or OpenMetrics) -> [(name, {label: value}, float)].
    Comments, blank lines and `# EOF` are skipped; a line that is not a
    sample raises ValueError."""
    samples = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        found = _SAMPLE.match(line.strip())
        if not found:
            raise ValueError(f"not a sample: {line!r}")
        name, body, value = found.groups()
        labels, at = {}, 0
        body = body or ""
        while at < len(body):
            label = _LABEL.match(body, at)
            if not label or label.end() == at:
                raise ValueError(f"bad labels in {line!r}")
            labels[label.group(1)] = re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], label.group(2))
            at = label.end()
        samples.append((name, labels, float(value)))
    return samples


def metric_values(samples, name, **labels):
    """The values of `name`'s samples whose labels include `labels`."""
    return [value for sample, have, value in samples if sample == name and all(have.get(k) == str(v) for k, v in labels.items())]


def metric(samples, name, **labels):
    """The one value of `name` with `labels`; None when there is none or more than one."""
    values = metric_values(samples, name, **labels)
    return values[0] if len(values) == 1 else None


def fleet_hosts(document):
    """A fleet document -> {host: (exit_code, report or None, error or None)}."""
    return {h.get("host"): (h.get("exit_code"), h.get("report"), h.get("error")) for h in document.get("hosts", [])}


def status_differences(mine, theirs, pids):
    """What differs between two `status --json` documents taken of the same
    host moments apart: GPUs (index, name, total, used within SLACK), and for
    each PID the GPUs the driver lists it on and its memory there (within
    SLACK). Returns a list of problems (empty: they agree)."""
    problems = []

    def gpus(status):
        return {gpu.get("index"): gpu for gpu in status.get("gpus", [])}

    a, b = gpus(mine), gpus(theirs)
    if sorted(a) != sorted(b):
        problems.append(f"GPUs {sorted(a)} vs {sorted(b)}")
    for index in sorted(set(a) & set(b)):
        for key in ("name", "memory_total", "error"):
            if a[index].get(key) != b[index].get(key):
                problems.append(f"GPU {index} {key}: {a[index].get(key)!r} vs {b[index].get(key)!r}")
        used = (a[index].get("memory_used"), b[index].get("memory_used"))
        if None in used and used[0] != used[1] or None not in used and abs(used[0] - used[1]) > SLACK:
            problems.append(f"GPU {index} memory_used: {used[0]} vs {used[1]}")
    for pid in pids:
        listed = (listed_by_driver_on(mine, pid), listed_by_driver_on(theirs, pid))
        if listed[0] != listed[1]:
            problems.append(f"PID {pid} listed on GPUs {listed[0]} vs {listed[1]}")
            continue
        for index in listed[0]:
            memory = (holder_memory(mine, pid, index), holder_memory(theirs, pid, index))
            if None in memory or abs(memory[0] - memory[1]) > SLACK:
                problems.append(f"PID {pid} on GPU {index}: {memory[0]} vs {memory[1]} bytes")
    return problems
