//! Where a hung process waits: `gpureap dump` on real processes blocked in a
//! known function (with py-spy, and without it), py-spy hanging or printing
//! garbage, the selection's bad input, and `gpureap run` writing stacks into
//! its bundle before it signals a stalled server, and on SIGUSR1.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::{Holder, SimHost};
use serde_json::Value;

use crate::harness::*;
use crate::run::{read, setup};
use crate::schema::{conforms, schema};

/// A Python process blocked reading its stdin (a pipe the test holds) in
/// `wait_in_barrier`, the way a rank waits for a peer that never comes.
struct Blocked {
    child: Child,
    /// The Python process itself (`python3` may be a launcher's shim above it).
    pid: u32,
}

const BLOCKED: &str = "import os
def wait_in_barrier():
    return os.read(0, 1)
print(os.getpid(), flush=True)
wait_in_barrier()
";

impl Blocked {
    fn start() -> Blocked {
        let mut child = Command::new("python3")
            .args(["-c", BLOCKED])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("its PID");
        let pid = line.trim().parse().expect("a PID");
        blocked_in(pid, &["pipe_read"], "the Python process reading its stdin");
        Blocked { child, pid }
    }
}

impl Drop for Blocked {
    /// Its stdin closed, it reads its end and exits: nothing is signalled.
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// `gpureap dump` with `args` on `host`, PATH set to `path`; the run and
/// the bundle's folder (from its first line).
fn dump(host: &SimHost, path: Option<&str>, args: &[&str]) -> (Run, Option<PathBuf>) {
    let out = host.path().join("dumps");
    let mut command = gpureap(host);
    command
        .arg("dump")
        .args(args)
        .args(["--out", out.to_str().expect("utf-8")]);
    if let Some(path) = path {
        command.env("PATH", path);
    }
    let run: Run = command.output().expect("gpureap runs").into();
    let folder = run
        .stdout
        .lines()
        .next()
        .and_then(|line| line.rsplit(": ").next())
        .map(PathBuf::from)
        .filter(|folder| folder.is_dir());
    (run, folder)
}

/// A bundle's `bundle.json`, checked against docs/json.schema.json.
fn bundle_json(folder: &Path) -> Value {
    let bundle =
        serde_json::from_str(&read(&folder.join("bundle.json"))).expect("bundle.json is JSON");
    conforms(&schema(), "bundle.json", &bundle);
    bundle
}

fn process(bundle: &Value, pid: u32) -> &Value {
    bundle["stacks"]["processes"]
        .as_array()
        .expect("stacks.processes")
        .iter()
        .find(|process| process["pid"] == pid)
        .unwrap_or_else(|| panic!("no stacks of {pid}: {bundle:#}"))
}

fn py_spy_installed() -> bool {
    gpureap_core::stacks::find_py_spy().is_some()
}

#[test]
fn py_spy_names_the_function_a_python_process_is_blocked_in() {
    if !py_spy_installed() {
        return skip("py-spy is not on PATH (.ci/run installs it: pip install py-spy)");
    }
    let host = Sim::gpus(2).build();
    let blocked = Blocked::start();
    let (run, folder) = dump(&host, None, &["--pid", &blocked.pid.to_string()]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let folder = folder.expect("the bundle's folder");
    assert!(run.stdout.contains("in wait_in_barrier"), "{}", run.stdout);
    let bundle = bundle_json(&folder);
    let stacks = process(&bundle, blocked.pid);
    assert_eq!(stacks["source"], "py-spy", "{stacks:#}");
    assert_eq!(stacks["waits_in"], "wait_in_barrier", "{stacks:#}");
    let main = &stacks["threads"][0];
    assert!(
        main["frames"]
            .as_array()
            .expect("frames")
            .iter()
            .any(|frame| frame
                .as_str()
                .is_some_and(|f| f.starts_with("wait_in_barrier ("))),
        "{main:#}"
    );
    let summary = read(&folder.join("summary.txt"));
    assert!(summary.contains("in wait_in_barrier"), "{summary}");
    assert!(read(&folder.join("stacks.txt")).contains("wait_in_barrier ("));
    assert_eq!(bundle["kind"], "bundle");
    // Read, not disturbed: still blocked where it was.
    blocked_in(
        blocked.pid,
        &["pipe_read"],
        "the dumped process, after the dump",
    );
    let mode = std::fs::metadata(&folder).expect("folder").permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o700
    );
}

#[test]
fn without_py_spy_the_note_says_how_to_install_it_and_kernel_stacks_remain() {
    let host = Sim::gpus(2).build();
    let blocked = Blocked::start();
    let empty = host.path().join("no-py-spy");
    std::fs::create_dir(&empty).expect("dir");
    let (run, folder) = dump(
        &host,
        Some(empty.to_str().expect("utf-8")),
        &["--pid", &blocked.pid.to_string()],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let note: Vec<&str> = run
        .stdout
        .lines()
        .filter(|line| line.contains("py-spy"))
        .collect();
    assert_eq!(note.len(), 1, "{}", run.stdout);
    assert!(note[0].contains("pip install py-spy"), "{}", note[0]);
    let bundle = bundle_json(&folder.expect("the bundle's folder"));
    assert_eq!(bundle["stacks"]["py_spy"], Value::Null);
    let stacks = process(&bundle, blocked.pid);
    assert_eq!(stacks["source"], "kernel");
    let main = &stacks["threads"][0];
    let kernel = main["kernel"].as_array().expect("kernel");
    // Root reads the kernel's stack; anyone else gets the wait channel.
    let innermost = kernel
        .first()
        .or(main.get("wchan"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert!(innermost.contains("pipe_read"), "{main:#}");
    assert_eq!(stacks["waits_in"], innermost);
}

/// A directory holding a fake `py-spy` with this shell script as its body.
fn fake_py_spy(host: &SimHost, body: &str) -> String {
    let dir = host.path().join("fake-py-spy");
    std::fs::create_dir_all(&dir).expect("dir");
    let script = dir.join("py-spy");
    std::fs::write(&script, format!("#!/bin/sh\n{body}")).expect("script");
    let mut permissions = std::fs::metadata(&script).expect("script").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&script, permissions).expect("chmod");
    format!("{}:/usr/bin:/bin", dir.display())
}

#[test]
fn a_py_spy_that_hangs_is_stopped_with_what_it_started_and_noted() {
    let host = Sim::gpus(2).build();
    let blocked = Blocked::start();
    let marker = host.path().join("hung.pid");
    let path = fake_py_spy(
        &host,
        &format!("sleep 1000 &\necho $! > {}\nwait\n", marker.display()),
    );
    let started = Instant::now();
    let (run, folder) = dump(&host, Some(&path), &["--pid", &blocked.pid.to_string()]);
    let took = started.elapsed();
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        took < gpureap_core::stacks::PER_PROCESS + Duration::from_secs(8),
        "took {took:?}"
    );
    let bundle = bundle_json(&folder.expect("the bundle's folder"));
    let stacks = process(&bundle, blocked.pid);
    assert!(
        stacks["note"]
            .as_str()
            .is_some_and(|note| note.contains(&format!(
                "did not answer within {:.1}s",
                gpureap_core::stacks::PER_PROCESS.as_secs_f64()
            ))),
        "{stacks:#}"
    );
    // The kernel's view is still there.
    assert_eq!(stacks["source"], "kernel");
    assert!(stacks["waits_in"].as_str().is_some(), "{stacks:#}");
    let hung: u32 = std::fs::read_to_string(&marker)
        .expect("the fake py-spy ran")
        .trim()
        .parse()
        .expect("pid");
    assert!(!alive(hung), "what the hung py-spy started is still alive");
}

#[test]
fn py_spy_garbage_is_bounded_and_escaped() {
    let host = Sim::gpus(2).build();
    let blocked = Blocked::start();
    let path = fake_py_spy(
        &host,
        "printf 'Thread %s (idle): \"\\033]0;pwned\\007\"\\n    evil\\033[2J\\r (x.py:1)\\n' \"$4\"\n\
         head -c 3000000 /dev/urandom\n",
    );
    let (run, folder) = dump(&host, Some(&path), &["--pid", &blocked.pid.to_string()]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(!run.stdout.contains('\u{1b}'), "{}", run.stdout);
    let folder = folder.expect("the bundle's folder");
    for file in ["stacks.txt", "summary.txt"] {
        let text = std::fs::read(folder.join(file)).expect("file");
        assert!(!text.contains(&0x1b), "{file} carries a raw escape");
        assert!(!text.contains(&b'\r'), "{file} carries a raw CR");
    }
    let bundle = bundle_json(&folder);
    let stacks = process(&bundle, blocked.pid);
    assert_eq!(stacks["source"], "py-spy");
    let waits_in = stacks["waits_in"].as_str().expect("waits_in");
    assert!(waits_in.starts_with("evil\\u{1b}[2J"), "{waits_in}");
    let size = std::fs::metadata(folder.join("stacks.txt"))
        .expect("stacks.txt")
        .len();
    assert!(size < 4 << 20, "stacks.txt is {size} bytes");
}

#[test]
fn dump_selects_as_free_does_and_refuses_what_it_cannot_take() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let holder = incident.hold(Holder::new("sglang::scheduler_TP0").on(1, 10 * GIB));
    let (by_match, folder) = dump(&host, None, &["--match", "scheduler_TP"]);
    assert_eq!(by_match.code, 0, "{}{}", by_match.stdout, by_match.stderr);
    let bundle = bundle_json(&folder.expect("folder"));
    let members: Vec<u64> = bundle["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|member| member["pid"].as_u64())
        .collect();
    assert_eq!(members, [u64::from(holder)], "{bundle:#}");
    assert_eq!(bundle["gpu"]["gpus"][1]["memory_used"], 10 * GIB);
    let (by_gpu, _) = dump(&host, None, &["--gpu", "1"]);
    assert_eq!(by_gpu.code, 0, "{}", by_gpu.stderr);
    assert!(
        by_gpu.stdout.starts_with("gpureap dump: 1 process(es)"),
        "{}",
        by_gpu.stdout
    );
    assert!(alive(holder), "a dump signals nothing");

    for (args, says) in [
        (vec!["--gpu", "0"], "nothing to dump"),
        (vec!["--match", "no-such-server"], "nothing to dump"),
        (vec!["--gpu", "7"], "GPU"),
        (vec!["--pid", "1"], "refusing --pid 1"),
        (vec!["--pid", "4194304"], "no process with PID"),
        (vec![], "required"),
    ] {
        let (run, folder) = dump(&host, None, &args);
        assert_eq!(run.code, 2, "{args:?}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains(says), "{args:?}: {}", run.stderr);
        assert!(folder.is_none());
    }
    let open = host.path().join("open");
    std::fs::create_dir(&open).expect("dir");
    let mut permissions = std::fs::metadata(&open).expect("dir").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o777);
    std::fs::set_permissions(&open, permissions).expect("chmod");
    let refused: Run = gpureap(&host)
        .args(["dump", "--gpu", "1", "--out", open.to_str().expect("utf-8")])
        .output()
        .expect("runs")
        .into();
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert_contains(&refused.stderr, "refusing --out");
    assert_eq!(std::fs::read_dir(&open).expect("dir").count(), 0);
}

/// `--out` is a folder of root's own below a directory anyone may write to
/// without the sticky bit, or below another user's, or a link to one of
/// root's: the folder could be swapped for another before the bundle (with
/// its command lines, and their tokens) lands in it. Refused with exit 2,
/// naming the directory and why; nothing written.
#[test]
fn dump_refuses_an_out_below_a_directory_others_may_write() {
    use std::os::unix::fs::PermissionsExt as _;
    let (host, mut incident) = Sim::gpus(2).stage();
    let holder = incident.hold(Holder::new("sglang::scheduler_TP0").on(1, 10 * GIB));
    let chmod = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod")
    };
    let open = host.path().join("open");
    let theirs = host.path().join("theirs");
    for dir in [&open, &theirs] {
        std::fs::create_dir_all(dir.join("out")).expect("dir");
        chmod(&dir.join("out"), 0o700);
    }
    chmod(&open, 0o777);
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown to nobody");
    let linked = host.path().join("linked");
    std::os::unix::fs::symlink(open.join("out"), &linked).expect("symlink");
    for (out, why) in [
        (
            open.join("out"),
            format!(
                "others than its owner may write to {} (mode 0777, without the sticky bit)",
                open.display()
            ),
        ),
        (
            theirs.join("out"),
            format!("{} belongs to uid 65534 (nobody)", theirs.display()),
        ),
        (
            linked.clone(),
            format!("{} is a symbolic link", linked.display()),
        ),
    ] {
        let refused: Run = gpureap(&host)
            .args(["dump", "--gpu", "1", "--out", out.to_str().expect("utf-8")])
            .output()
            .expect("runs")
            .into();
        assert_eq!(refused.code, 2, "{}: {}", out.display(), refused.stderr);
        assert!(
            refused
                .stderr
                .contains(&format!("refusing --out {}: ", out.display()))
                && refused.stderr.contains(&why),
            "{}: {}",
            out.display(),
            refused.stderr
        );
        assert_eq!(std::fs::read_dir(&out).expect("dir").count(), 0);
    }
    assert!(alive(holder));
}

#[test]
fn a_stalled_start_gets_its_stacks_in_the_bundle_before_it_is_signalled() {
    let setup = setup(2);
    let supervisor = setup.run_faulty_once(&["--restart", "never"], "stall");
    let bundle_event = supervisor.wait_for("diagnostic bundle:", 1);
    let (code, events) = supervisor.wait_exit();
    assert_eq!(code, 1, "{}", events.join("\n"));
    let position = |text: &str| {
        events
            .iter()
            .position(|event| event.contains(text))
            .unwrap_or_else(|| panic!("no event {text:?}:\n{}", events.join("\n")))
    };
    assert!(position("gpureap run: stacks:") < position("stopping"));
    let folder = PathBuf::from(bundle_event.rsplit(": ").next().expect("path"));
    let bundle = bundle_json(&folder);
    let processes = bundle["stacks"]["processes"].as_array().expect("processes");
    let workers: Vec<&Value> = processes
        .iter()
        .filter(|process| {
            process["label"]
                .as_str()
                .is_some_and(|label| label.starts_with("sglang::scheduler_TP"))
        })
        .collect();
    assert_eq!(workers.len(), 2, "{bundle:#}");
    let summary = read(&folder.join("summary.txt"));
    if py_spy_installed() {
        for worker in &workers {
            assert_eq!(worker["waits_in"], "block_forever", "{worker:#}");
        }
        assert!(
            summary.contains("sglang::scheduler_TP[0-1] in block_forever"),
            "{summary}"
        );
    } else {
        assert!(summary.contains("pip install py-spy"), "{summary}");
        for worker in &workers {
            assert_eq!(worker["source"], "kernel", "{worker:#}");
        }
    }
    // Captured alive: every thread read, none of them exiting.
    for worker in &workers {
        assert!(!worker["threads"].as_array().expect("threads").is_empty());
    }
}

#[test]
fn sigusr1_writes_a_bundle_and_leaves_the_server_running() {
    let setup = setup(2);
    let supervisor = setup.run(&[], &[]);
    supervisor.wait_for("ready after", 1);
    let pid = rustix::process::Pid::from_raw(supervisor.child.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::USR1).expect("SIGUSR1");
    let bundle_event = supervisor.wait_for("diagnostic bundle:", 1);
    let folder = PathBuf::from(bundle_event.rsplit(": ").next().expect("path"));
    assert!(
        folder
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.ends_with("-start1-dump")),
        "{}",
        folder.display()
    );
    let summary = read(&folder.join("summary.txt"));
    assert!(summary.starts_with("dump: on demand (SIGUSR1"), "{summary}");
    assert!(summary.contains("stacks: "), "{summary}");
    // Still serving, never stopped: the workers hold their GPUs.
    let status = run(&setup.host, &["status", "--json"]).json();
    assert_eq!(status["holders"].as_array().expect("holders").len(), 2);
    assert!(
        !supervisor
            .events()
            .iter()
            .any(|event| event.contains("stopping")),
        "{}",
        supervisor.events().join("\n")
    );
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
}

#[test]
fn run_dump_asks_the_supervisor_for_a_bundle_and_prints_it() {
    let setup = setup(2);
    let state = setup.state.to_str().expect("utf-8").to_string();
    let dump = |args: &[&str]| -> Run {
        gpureap(&setup.host)
            .args(["run", "--dump"])
            .args(args)
            .output()
            .expect("gpureap runs")
            .into()
    };
    let supervisor = setup.run(&[], &[]);
    supervisor.wait_for("ready after", 1);
    let asked = dump(&["--state-dir", &state]);
    assert_eq!(asked.code, 0, "{}{}", asked.stdout, asked.stderr);
    let folder = PathBuf::from(
        asked
            .stdout
            .trim()
            .strip_prefix("gpureap run: diagnostic bundle: ")
            .unwrap_or_else(|| panic!("{}", asked.stdout)),
    );
    assert!(
        folder.starts_with(setup.state.join("bundles")),
        "{}",
        folder.display()
    );
    let bundle = bundle_json(&folder);
    assert!(
        bundle["reason"]
            .as_str()
            .is_some_and(|reason| reason.starts_with("dump: on demand")),
        "{bundle:#}"
    );
    supervisor.wait_for("SIGUSR1 (gpureap run --dump)", 1);
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));

    // Gone: nothing to ask, and its registration went with it.
    let after = dump(&["--state-dir", &state]);
    assert_eq!(after.code, 2, "{}", after.stderr);
    assert_contains(&after.stderr, "no gpureap run is supervising");
    let registrations = setup.state.join("supervisors");
    assert_eq!(std::fs::read_dir(&registrations).expect("dir").count(), 0);
    // A SIGKILLed supervisor's registration names a process that is gone: removed, not signalled.
    std::fs::write(
        registrations.join("4194304.json"),
        r#"{"pid":4194304,"start_time":1}"#,
    )
    .expect("write");
    assert_eq!(dump(&["--state-dir", &state]).code, 2);
    assert_eq!(std::fs::read_dir(&registrations).expect("dir").count(), 0);

    let missing = dump(&["--state-dir", "/nonexistent/gpureap-state"]);
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    let nothing = dump(&[]);
    assert_eq!(nothing.code, 2, "{}", nothing.stderr);
    assert!(nothing.stderr.contains("--state-dir"), "{}", nothing.stderr);
}

/// A parent that never waits for its child that exited: the child is a
/// zombie until the parent reads a byte from its stdin (then reaps it).
const ZOMBIE_PARENT: &str = "import os, sys
child = os.fork()
if child == 0:
    os._exit(0)
print(os.getpid(), child, flush=True)
os.read(0, 1)
os.waitpid(child, 0)
";

/// `dump --pid` of a zombie says what it is, once, with the parent that has
/// not reaped it: no "no stack read", no "waits in ?", no py-spy run on it.
#[test]
fn a_zombie_is_dumped_as_a_zombie_with_the_parent_that_has_not_reaped_it() {
    let host = Sim::gpus(2).build();
    let mut parent = Command::new("python3")
        .args(["-c", ZOMBIE_PARENT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 starts");
    let mut line = String::new();
    BufReader::new(parent.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the PIDs");
    let pids: Vec<u32> = line
        .split_whitespace()
        .map(|pid| pid.parse().expect("a PID"))
        .collect();
    let [parent_pid, zombie] = pids[..] else {
        panic!("two PIDs: {line:?}");
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(format!("/proc/{zombie}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z'))
    }) {
        assert!(Instant::now() < deadline, "{zombie} never became a zombie");
        std::thread::sleep(Duration::from_millis(10));
    }

    let (run, folder) = dump(&host, None, &["--pid", &zombie.to_string()]);
    let said = format!(
        "a zombie (state Z): it has exited, and its parent {parent_pid} (python3) has not reaped it"
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains(&said), "{}", run.stdout);
    let folder = folder.expect("the bundle's folder");
    let summary = read(&folder.join("summary.txt"));
    let stacks = read(&folder.join("stacks.txt"));
    for (name, text) in [
        ("stdout", &run.stdout),
        ("summary.txt", &summary),
        ("stacks.txt", &stacks),
    ] {
        assert!(
            !text.contains("no stack read") && !text.contains("waits in ?"),
            "{name}: {text}"
        );
    }
    assert_eq!(summary.matches("zombie").count(), 1, "{summary}");
    assert!(
        stacks.contains(&format!("PID {zombie} python3: {said}")),
        "{stacks}"
    );
    assert!(!stacks.contains("py-spy gave no stacks"), "{stacks}");
    let bundle = bundle_json(&folder);
    let entry = process(&bundle, zombie);
    assert_eq!(entry["note"], said.as_str(), "{entry:#}");
    assert_eq!(entry["waits_in"], Value::Null, "{entry:#}");

    drop(parent.stdin.take());
    let _ = parent.wait();
}
