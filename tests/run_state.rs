//! `gpureap run`'s state directory under attack: run as root with `HOME` or
//! `--state-dir` in a directory another user owns and has seeded with
//! symbolic links, it must refuse before starting anything and touch nothing
//! the links point at; what it creates itself is private to its owner.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, lchown, symlink};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::SimHost;

use crate::harness::*;
use crate::run::{Supervisor, read};

/// The uid and gid of `nobody`, the other user of these tests.
const NOBODY: u32 = 65534;

/// A directory owned by `nobody`, as another user's home would be.
fn foreign_dir(path: &Path) {
    fs::create_dir_all(path).expect("mkdir");
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).expect("chmod");
    std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).expect("chown to nobody");
}

/// A symbolic link planted by `nobody`.
fn foreign_link(target: &Path, link: &Path) {
    symlink(target, link).expect("symlink");
    lchown(link, Some(NOBODY), Some(NOBODY)).expect("lchown to nobody");
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// A FIFO at `path`, as someone could plant where a log goes.
fn make_fifo(path: &Path, mode: u32) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(mode),
        0,
    )
    .expect("mkfifo");
}

/// Where a process waits in the kernel for a FIFO's other end to be opened.
const FIFO_OPEN: &[&str] = &["wait_for_partner", "fifo_open"];

/// Waits for `child` to end, at most 30 s.
/// `gpureap run --restart never` with the state directory `state`, then `args`.
fn run_once(host: &SimHost, state: &str, args: &[&str]) -> Run {
    let once = ["run", "--restart", "never", "--state-dir", state];
    run(host, &[&once[..], args].concat())
}

/// `gpureap run` with the state directory `state`, over a server that says
/// it is serving at once and then sleeps.
fn serving(host: &SimHost, state: &Path) -> Supervisor {
    let mut command = gpureap(host);
    command
        .args(["run", "--ready-log", "serving", "--grace", "300ms"])
        .arg("--state-dir")
        .arg(state)
        .args(["--", "bash", "-c", "echo serving; exec sleep 100000"]);
    Supervisor::start(command)
}

fn wait(mut child: std::process::Child) -> Run {
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("gpureap run did not end within 30s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output").into()
}

#[test]
fn run_refuses_a_state_dir_another_user_seeded_with_symlinks_and_touches_nothing() {
    let host = Sim::gpus(1).build();
    let victim = host.path().join("victim.conf");
    fs::write(&victim, "precious\n").expect("victim file");
    let victim_dir = host.path().join("victim-dir");
    fs::create_dir(&victim_dir).expect("victim dir");
    let started = host.path().join("server-started");
    // Ready after a moment, then a crash: a good start to record and a bundle to write.
    let server = format!(
        "touch {}; sleep 0.5; echo serving; sleep 0.2; exit 3",
        started.display()
    );

    // --state-dir: nobody's directory, links to root's file and directory.
    let attacker = host.path().join("attacker");
    foreign_dir(&attacker);
    foreign_link(&victim, &attacker.join("starts.json"));
    foreign_link(&victim_dir, &attacker.join("bundles"));
    let mut command = gpureap(&host);
    command
        .args(["run", "--ready-log", "serving", "--restart", "never"])
        .arg("--state-dir")
        .arg(&attacker)
        .args(["--", "bash", "-c", &server])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = command.spawn().expect("gpureap run starts");
    // The temporary file next to starts.json, named after gpureap's PID.
    foreign_link(
        &victim,
        &attacker.join(format!("starts.json.{}.tmp", child.id())),
    );
    let result = wait(child);
    assert_eq!(result.code, 2, "refused as bad input: {}", result.stderr);
    assert!(
        result.stderr.contains(&attacker.display().to_string())
            && result.stderr.contains("uid 65534"),
        "the message names the directory and what is wrong: {}",
        result.stderr
    );

    // HOME: nobody's home, with ~/.local a link to root's directory, or plain.
    let home_linked = host.path().join("home-linked");
    foreign_dir(&home_linked);
    foreign_link(&victim_dir, &home_linked.join(".local"));
    let home_plain = host.path().join("home-plain");
    foreign_dir(&home_plain);
    for home in [&home_linked, &home_plain] {
        let mut command = gpureap(&host);
        command
            .args(["run", "--ready-log", "serving", "--restart", "never"])
            .args(["--", "bash", "-c", &server])
            .env("HOME", home)
            .env_remove("XDG_STATE_HOME")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let result = wait(command.spawn().expect("gpureap run starts"));
        assert_eq!(result.code, 2, "HOME={}: {}", home.display(), result.stderr);
        assert_contains(&result.stderr, &home.display().to_string());
        assert_eq!(
            entries(home),
            if home == &home_linked {
                vec![".local".to_string()]
            } else {
                vec![]
            },
            "nothing created in another user's home"
        );
    }

    assert_eq!(read(&victim), "precious\n", "the victim file is untouched");
    assert!(
        entries(&victim_dir).is_empty(),
        "nothing written into the victim directory: {:?}",
        entries(&victim_dir)
    );
    assert!(!started.exists(), "the server was never started");
}

/// A state directory of root's own, below a directory anyone may write to
/// without the sticky bit or below another user's: either could rename it
/// away and put another in its place, one with links of their choosing.
/// Refused with exit 2, the server never started, nothing written; below a
/// sticky directory it is fine.
#[test]
fn a_state_dir_below_a_directory_others_may_write_is_refused() {
    let host = Sim::gpus(1).build();
    let started = host.path().join("server-started");
    let touch = ["--", "touch", started.to_str().expect("path")];
    let state_run = |state: &Path| run_once(&host, state.to_str().expect("path"), &touch);
    let shared = host.path().join("shared");
    fs::create_dir(&shared).expect("mkdir");
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).expect("chmod");
    let theirs = host.path().join("theirs");
    foreign_dir(&theirs);
    let sticky = host.path().join("sticky");
    fs::create_dir(&sticky).expect("mkdir");
    fs::set_permissions(&sticky, fs::Permissions::from_mode(0o1777)).expect("chmod");
    for dir in [&shared, &theirs, &sticky] {
        fs::create_dir(dir.join("state")).expect("mkdir");
        fs::set_permissions(dir.join("state"), fs::Permissions::from_mode(0o700)).expect("chmod");
    }
    for (state, why) in [
        (
            shared.join("state"),
            format!(
                "others than its owner may write to {} (mode 0777, without the sticky bit)",
                shared.display()
            ),
        ),
        (
            theirs.join("state"),
            format!("{} belongs to uid 65534 (nobody)", theirs.display()),
        ),
        // `..` does not step around the directory it passes through.
        (
            shared.join("..").join("sticky").join("state"),
            "(mode 0777, without the sticky bit)".to_string(),
        ),
    ] {
        let result = state_run(&state);
        assert_eq!(result.code, 2, "{}: {}", state.display(), result.stderr);
        assert!(
            result.stderr.contains(&format!(
                "refusing the state directory {}: ",
                state.display()
            )) && result.stderr.contains(&why),
            "{}: {}",
            state.display(),
            result.stderr
        );
        assert!(!started.exists(), "the server was started");
        assert!(entries(&state).is_empty(), "written: {:?}", entries(&state));
    }
    let result = state_run(&sticky.join("state"));
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert!(started.exists());
}

#[test]
fn a_symlink_inside_a_trusted_state_dir_is_neither_read_nor_written_through() {
    let host = Sim::gpus(1).build();
    let state = host.path().join("state");
    fs::create_dir(&state).expect("state dir");
    fs::set_permissions(&state, fs::Permissions::from_mode(0o700)).expect("chmod");
    let victim = host.path().join("victim.json");
    let planted = r#"{"good_starts":[{"lines":999,"seconds":1.0,"at_unix":0}]}"#;
    fs::write(&victim, planted).expect("victim");
    symlink(&victim, state.join("starts.json")).expect("symlink");

    let supervisor = serving(&host, &state);
    let ready = supervisor.wait_for("ready after", 1);
    assert!(
        ready.contains("no good start recorded yet"),
        "starts.json was read through its link: {ready}"
    );
    let (code, events, _) = supervisor.stop();
    assert_eq!(code, 0, "{}", events.join("\n"));
    assert_eq!(read(&victim), planted, "the link's target is untouched");
    let recorded = fs::symlink_metadata(state.join("starts.json")).expect("starts.json");
    assert!(recorded.is_file(), "the link was replaced by a file");
    assert!(read(&state.join("starts.json")).contains("good_starts"));
}

#[test]
fn what_run_creates_in_its_state_dir_is_private_whatever_the_umask() {
    let host = Sim::gpus(1).build();
    // Two levels that do not exist yet: both are created.
    let state = host.path().join("new").join("state");
    let log = host.path().join("server.log");
    let mut command = gpureap(&host);
    command
        .args(["run", "--ready-log", "serving", "--restart", "never"])
        .arg("--state-dir")
        .arg(&state)
        .arg("--log")
        .arg(&log)
        .args([
            "--",
            "bash",
            "-c",
            // It crashes once gpureap has recorded the good start and logged the secret.
            "echo serving; echo 'api_key=sk-secret'; \
             until [ -e \"$STATE/starts.json\" ] && grep -q sk-secret \"$LOG\"; do sleep 0.01; done; \
             exit 3",
        ])
        .env("STATE", &state)
        .env("LOG", &log)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Safety: umask is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
    let result = wait(command.spawn().expect("gpureap run starts"));
    assert_eq!(result.code, 1, "a crash: {}", result.stderr);

    assert_eq!(mode(&host.path().join("new")), 0o700);
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("starts.json")), 0o600);
    assert_eq!(mode(&state.join("bundles")), 0o700);
    let bundles: Vec<_> = fs::read_dir(state.join("bundles"))
        .expect("bundles")
        .flatten()
        .map(|entry| entry.path())
        .collect();
    assert_eq!(bundles.len(), 1, "{}", result.stderr);
    assert_eq!(mode(&bundles[0]), 0o700);
    for file in fs::read_dir(&bundles[0]).expect("bundle").flatten() {
        assert_eq!(mode(&file.path()), 0o600, "{}", file.path().display());
    }
    assert!(read(&bundles[0].join("log-tail.txt")).contains("sk-secret"));
    assert_eq!(mode(&log), 0o600, "the log holds the same secrets");
    assert_eq!(
        fs::metadata(&state).expect("state").uid(),
        rustix::process::geteuid().as_raw()
    );
}

/// gpureap's peak resident memory, in bytes.
pub(crate) fn peak_memory(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .expect("VmHWM")
        * 1024
}

#[test]
fn a_huge_starts_json_is_not_read_whole() {
    let host = Sim::gpus(1).build();
    let state = host.path().join("state");
    fs::create_dir(&state).expect("state dir");
    fs::set_permissions(&state, fs::Permissions::from_mode(0o700)).expect("chmod");
    // Sparse: 512 MiB that take no disk.
    fs::File::create(state.join("starts.json"))
        .and_then(|file| file.set_len(512 << 20))
        .expect("huge starts.json");

    let supervisor = serving(&host, &state);
    let ready = supervisor.wait_for("ready after", 1);
    assert!(ready.contains("no good start recorded yet"), "{ready}");
    let peak = peak_memory(supervisor.child.id());
    let (code, events, _) = supervisor.stop();
    assert!(peak < 64 << 20, "gpureap run peaked at {} MiB", peak >> 20);
    assert_eq!(code, 0, "{}", events.join("\n"));
    assert!(
        events
            .iter()
            .any(|event| event.contains("starts.json") && event.contains("ignored")),
        "the oversized file is reported: {}",
        events.join("\n")
    );
    let history: serde_json::Value =
        serde_json::from_str(&read(&state.join("starts.json"))).expect("json");
    assert_eq!(history["good_starts"].as_array().expect("starts").len(), 1);
}

/// `--log` where someone else could have prepared the path: a link to a
/// file of root's, a hard link, another user's file, a FIFO, a link on the
/// way that another user planted, a directory, a directory anyone may write
/// to without the sticky bit or another user's directory (where the log
/// could be renamed away and another put in its place). Each is refused
/// with exit 2 before the server starts, and the file it would have
/// reached is untouched. A new file in a sticky directory, and one's own
/// file, are fine.
#[test]
fn run_refuses_a_log_others_could_redirect_and_touches_nothing() {
    let host = Sim::gpus(1).build();
    let base = host.path().join("logs");
    fs::create_dir(&base).expect("mkdir");
    let state = host.path().join("state");
    let state = state.to_str().expect("path");
    let victim = host.path().join("victim");
    fs::write(&victim, "precious\n").expect("victim");
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o644)).expect("chmod");
    let log_run = |log: &Path| {
        let log = log.to_str().expect("path");
        run_once(
            &host,
            state,
            &["--log", log, "--", "echo", "api_key=sk-secret"],
        )
    };

    symlink(&victim, base.join("link.log")).expect("symlink");
    fs::hard_link(&victim, base.join("hard.log")).expect("hard link");
    let theirs = base.join("theirs.log");
    fs::write(&theirs, "").expect("theirs");
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).expect("chown");
    let fifo = base.join("fifo.log");
    make_fifo(&fifo, 0o666);
    let home = base.join("home");
    foreign_dir(&home);
    foreign_link(host.path(), &base.join("planted"));
    let open = base.join("open");
    fs::create_dir(&open).expect("mkdir");
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).expect("chmod");

    for (log, why) in [
        (base.join("link.log"), "is a symbolic link"),
        (base.join("hard.log"), "hard link"),
        (theirs.clone(), "belongs to uid 65534"),
        (fifo.clone(), "not a regular file"),
        (
            base.join("planted").join("victim"),
            "symbolic link others could have made",
        ),
        (base.clone(), "it names a directory"),
        (
            open.join("server.log"),
            "(mode 0777, without the sticky bit); give --log a file in directories only you or root can write",
        ),
        (home.join("server.log"), "belongs to uid 65534 (nobody)"),
        (open.join("..").join("own.log"), "mode 0777"),
    ] {
        let started = Instant::now();
        let result = log_run(&log);
        assert_eq!(result.code, 2, "{}: {}", log.display(), result.stderr);
        assert!(
            result.stderr.contains("refusing --log") && result.stderr.contains(why),
            "{}: {}",
            log.display(),
            result.stderr
        );
        assert!(!result.stderr.contains("start 1"), "{}", result.stderr);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a FIFO blocked"
        );
        assert!(
            !result.stderr.contains("server's output"),
            "{}",
            result.stderr
        );
    }
    assert_eq!(read(&victim), "precious\n");
    assert_eq!(mode(&victim), 0o644);
    assert_eq!(read(&theirs), "");
    assert!(entries(&open).is_empty() && entries(&home).is_empty());

    // Where it is fine: a new file, created private, in a sticky directory;
    // and one's own file, appended to with its mode kept.
    let sticky = base.join("tmp");
    fs::create_dir(&sticky).expect("mkdir");
    fs::set_permissions(&sticky, fs::Permissions::from_mode(0o1777)).expect("chmod");
    let fresh = sticky.join("server.log");
    let result = log_run(&fresh);
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert_eq!(read(&fresh), "api_key=sk-secret\n");
    assert_eq!(mode(&fresh), 0o600);
    assert_eq!(
        fs::metadata(&fresh).expect("log").uid(),
        rustix::process::geteuid().as_raw()
    );
    // A link on the way that only root could have made is followed.
    symlink(&sticky, base.join("linked")).expect("symlink");
    let result = log_run(&base.join("linked").join("second.log"));
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert_eq!(read(&sticky.join("second.log")), "api_key=sk-secret\n");
    let own = base.join("own.log");
    fs::write(&own, "earlier\n").expect("own");
    fs::set_permissions(&own, fs::Permissions::from_mode(0o640)).expect("chmod");
    let result = log_run(&own);
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert_eq!(read(&own), "earlier\napi_key=sk-secret\n");
    assert_eq!(mode(&own), 0o640);
}

/// A refused `--log` is refused before anything is opened or made: a FIFO's
/// waiting reader is not released by a writer coming and going, no state
/// directory is created, a name ending in `/` or `/.` (a directory) makes no
/// file, and a path with control characters cannot forge an event line.
#[test]
fn a_refused_log_opens_nothing_and_leaves_nothing() {
    let host = Sim::gpus(1).build();
    let state = host.path().join("state-never-made");
    let log_run = |log: &std::ffi::OsStr| {
        let mut command = gpureap(&host);
        command
            .args(["run", "--state-dir"])
            .arg(&state)
            .arg("--log")
            .arg(log)
            .args(["--", "true"]);
        let output = command.output().expect("gpureap runs");
        Run::from(output)
    };

    let fifo = host.path().join("fifo.log");
    make_fifo(&fifo, 0o600);
    // `cat` blocks in open until a writer comes; once one has come and gone it reads EOF and exits.
    let mut reader = std::process::Command::new("cat")
        .arg(&fifo)
        .stdout(Stdio::null())
        .spawn()
        .expect("cat");
    blocked_in(reader.id(), FIFO_OPEN, "cat never opened the FIFO");
    let result = log_run(fifo.as_os_str());
    assert_eq!(result.code, 2, "{}", result.stderr);
    assert_contains(&result.stderr, "not a regular file");
    // A writer's open would have woken `cat` before gpureap ended: it would
    // no longer wait in its open, whether it had read EOF yet or not.
    let now = wchan(reader.id()).unwrap_or_default();
    assert!(
        FIFO_OPEN.iter().any(|place| now.contains(place)),
        "the FIFO was opened for writing: its reader was woken (wchan {now:?})"
    );
    let _ = reader.kill();
    let _ = reader.wait();
    assert!(!state.exists(), "a refused log left a state directory");

    // And a refused state directory leaves no empty log.
    let log = host.path().join("never-made.log");
    let result: Run = gpureap(&host)
        .args(["run", "--state-dir", "/tmp", "--log"])
        .arg(&log)
        .args(["--", "true"])
        .output()
        .expect("gpureap runs")
        .into();
    assert_eq!(result.code, 2, "{}", result.stderr);
    assert_contains(&result.stderr, "refusing the state directory");
    assert!(!log.exists(), "a refused state directory left an empty log");

    for name in ["newdir/", "x.log/.", "x.log/.."] {
        let log = format!("{}/{name}", host.path().display());
        let result = log_run(std::ffi::OsStr::new(&log));
        assert_eq!(result.code, 2, "{log}: {}", result.stderr);
        assert!(
            result.stderr.contains("directory"),
            "{log}: {}",
            result.stderr
        );
    }
    assert!(!host.path().join("newdir").exists());
    assert!(!host.path().join("x.log").exists());

    let forged = format!(
        "{}/missing\u{1b}[31m/x.log\ngpureap run: server exited with code 0",
        host.path().display()
    );
    let result = log_run(std::ffi::OsStr::new(&forged));
    assert_eq!(result.code, 3, "{}", result.stderr);
    assert!(!result.stderr.contains('\u{1b}'), "{:?}", result.stderr);
    assert!(
        !result
            .stderr
            .lines()
            .any(|line| line.starts_with("gpureap run: server exited")),
        "{:?}",
        result.stderr
    );
}
