//! `gpureap top` in a real terminal (tests/tmux.rs: a tmux server of its
//! own per test, 80x24), keys sent as a user types them, the screen read
//! back with capture-pane. Every wait is for something on the screen, never a sleep.

use std::process::Command;
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};

use crate::harness::*;
use crate::says::says;
use crate::tmux::Tmux;

fn host() -> SimHost {
    SimHost::new(2, 80 * GIB, "Simulated H200").expect("sim host")
}

/// An SGLang-like server whose launcher died: two orphaned workers.
fn orphaned_sglang(incident: &mut Incident) -> [u32; 2] {
    let launcher = incident
        .sglang(&[
            Holder::new("sglang::scheduler_TP0").on(0, 30 * GIB),
            Holder::new("sglang::scheduler_TP1").on(1, 20 * GIB),
        ])
        .expect("sglang");
    let workers = [
        incident.pid_of("sglang::scheduler_TP0").expect("TP0"),
        incident.pid_of("sglang::scheduler_TP1").expect("TP1"),
    ];
    incident.kill(launcher).expect("launcher killed");
    reparented(&workers);
    workers
}

/// Waits, for at most 5 s, until PID 1 has adopted each of `pids`.
fn reparented(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|&pid| ppid(pid) != Some(1)) {
        assert!(Instant::now() < deadline, "not re-parented");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn line_with<'a>(screen: &'a str, text: &str) -> Option<&'a str> {
    screen.lines().find(|line| line.contains(text))
}

#[test]
fn top_shows_bars_holders_filter_and_tree_and_q_restores_the_terminal() {
    let host = host();
    host.leak(1, 8 * GIB).expect("leak");
    let mut incident = Incident::new(&host);
    let workers = orphaned_sglang(&mut incident);
    let Some(tmux) = Tmux::start(&host, "--readonly") else {
        return;
    };
    let screen = tmux.shows("sglang::scheduler_TP1");
    // The bars: GPU 0 used by a process, GPU 1 also held by no process (`!`, in words too).
    let gpu0 = line_with(&screen, "GPU0").expect("GPU0 bar");
    assert!(gpu0.contains('#') && !gpu0.contains('!'), "{screen}");
    let gpu1 = line_with(&screen, "GPU1").expect("GPU1 bar");
    assert!(gpu1.contains("!8.0 GiB"), "{screen}");
    // The holders, with status's flags; the selected one's reason below.
    let tp0 = line_with(&screen, "sglang::scheduler_TP0").expect("TP0 row");
    assert!(
        tp0.contains(&workers[0].to_string()) && tp0.contains("orphaned"),
        "{screen}"
    );
    tmux.wait_for("the orphan's reason", |screen| {
        screen.contains("group leader")
    });
    // Filter.
    tmux.keys(&["/", "TP1", "Enter"]);
    let screen = tmux.wait_for("the filter", |screen| {
        screen.contains("filter /TP1") && !screen.contains("scheduler_TP0")
    });
    assert!(screen.contains("sglang::scheduler_TP1"), "{screen}");
    tmux.keys(&["/", "Escape"]);
    tmux.wait_for("the filter cleared", |screen| {
        screen.contains("scheduler_TP0")
    });
    // Tree, then help, then quit.
    tmux.keys(&["t"]);
    tmux.shows("· tree");
    tmux.keys(&["?"]);
    tmux.shows("free all orphans");
    tmux.keys(&["Escape"]);
    tmux.wait_for("help closed", |screen| !screen.contains("free all orphans"));
    tmux.ends_restored(&["q"], "0");
}

#[test]
fn top_frees_an_orphaned_sglang_tree_and_shows_the_verified_result() {
    let host = host();
    let mut incident = Incident::new(&host);
    let workers = orphaned_sglang(&mut incident);
    let Some(tmux) = Tmux::start(&host, "--grace 1s --timeout 10s") else {
        return;
    };
    let before = tmux.shows("sglang::scheduler_TP1");
    tmux.keys(&["o"]);
    // The plan, free's own: who is signalled.
    let plan = tmux.shows("plan: free these?");
    for pid in workers {
        assert!(plan.contains(&pid.to_string()), "{plan}");
    }
    assert!(workers.iter().all(|&pid| alive(pid)), "nothing before y");
    tmux.keys(&["y"]);
    let screen = tmux.shows("GPU 1: freed");
    assert!(screen.contains("Freed after"), "{screen}");
    assert!(screen.contains("GPU 0: freed 30.0 GiB"), "{screen}");
    // The screens docs/top.md shows.
    for (name, text) in [("before", &before), ("plan", &plan), ("freed", &screen)] {
        let path = format!("{}/top-{name}.txt", env!("CARGO_TARGET_TMPDIR"));
        std::fs::write(path, text).expect("capture written");
    }
    assert!(workers.iter().all(|&pid| !alive(pid)));
    // The bars follow: nothing used any more.
    tmux.wait_for("the empty GPUs", |screen| {
        screen.contains("No process holds or watches these GPUs.")
    });
    tmux.ends_restored(&["C-c"], "0");
}

#[test]
fn top_readonly_refuses_to_free() {
    let host = host();
    let mut incident = Incident::new(&host);
    let workers = orphaned_sglang(&mut incident);
    let Some(tmux) = Tmux::start(&host, "--readonly") else {
        return;
    };
    tmux.shows("sglang::scheduler_TP1");
    tmux.keys(&["o"]);
    tmux.shows("Read-only (--readonly): nothing can be signalled");
    tmux.keys(&["x"]);
    assert!(!tmux.screen().contains("plan: free these?"));
    assert!(workers.iter().all(|&pid| alive(pid)));
    tmux.ends_restored(&["q"], "0");
}

#[test]
fn top_survives_a_resize_and_sigterm_restores_the_terminal() {
    let host = host();
    let mut incident = Incident::new(&host);
    orphaned_sglang(&mut incident);
    let Some(tmux) = Tmux::start(&host, "") else {
        return;
    };
    tmux.shows("sglang::scheduler_TP1");
    for (width, height) in [("50", "12"), ("120", "40"), ("80", "24")] {
        tmux.resize(width, height);
        let width: usize = width.parse().expect("width");
        // The bar grows and shrinks with the width.
        tmux.wait_for("the view redrawn at the new size", |screen| {
            screen.contains("gpureap top")
                && screen.lines().count() <= height.parse::<usize>().unwrap_or(0)
                && line_with(screen, "GPU0").is_some_and(|line| {
                    let used = line.trim_end().chars().count();
                    used <= width && used + 14 >= width
                })
        });
    }
    let pid = tmux.top_pid();
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    tmux.shows("TOP-ENDED");
    tmux.restored("143");
}

#[test]
fn top_without_a_terminal_is_bad_usage() {
    let host = host();
    let result = run(&host, &["top"]);
    assert_eq!(result.code, 2, "{}", result.stderr);
    says(&result.stderr, &["top needs a terminal"]);
    let result = run(&host, &["top", "--interval", "10ms"]);
    assert_eq!(result.code, 2, "{}", result.stderr);
}

/// Names that anyone chooses (argv[0], comm) reach the view written out: an
/// argv[0] that would move the cursor and erase lines, and a comm with a
/// newline, neither moves anything nor starts a line, in the list or in the plan.
#[test]
fn top_writes_hostile_names_out() {
    const ERASER: &str = "\x1b[1A\x1b[2K\x1b[1A\x1b[2KNothing in scope to signal.x";
    let host = host();
    let mut incident = Incident::new(&host);
    incident
        .spawn(&named_holder(ERASER, ERASER.as_bytes(), b"sleep", 0), 1)
        .expect("eraser");
    incident
        .spawn(
            &named_holder(
                "liar",
                b"liar\nFORGED-LINE\r\x1b[2K",
                b"c\r\nFORGED-COMM",
                1,
            ),
            1,
        )
        .expect("liar");
    let Some(tmux) = Tmux::start(&host, "") else {
        return;
    };
    let screen = tmux.shows("liar\\nFORGED-LINE");
    assert!(screen.contains("\\u{1b}[1A\\u{1b}[2K"), "{screen}");
    tmux.keys(&["x"]);
    let plan = tmux.shows("plan: free these?");
    tmux.keys(&["n"]);
    tmux.shows("Cancelled: nothing was signalled.");
    for text in [&screen, &plan] {
        for line in text.lines() {
            for forged in ["Nothing in scope", "FORGED-LINE", "FORGED-COMM"] {
                assert!(
                    !line
                        .trim_start()
                        .trim_start_matches('│')
                        .trim_start()
                        .starts_with(forged),
                    "a name started a line:\n{text}"
                );
            }
        }
    }
    tmux.ends_restored(&["q"], "0");
}

/// `gpureap demo --top`: the demo's crashed host in the view; everything it
/// staged is gone once the view is closed.
#[test]
fn demo_top_opens_the_view_on_the_staged_host_and_cleans_up() {
    let Some(tmux) = Tmux::run("demo --top") else {
        return;
    };
    let screen = tmux.shows("sglang::scheduler_TP");
    assert!(screen.contains("GPU7"), "{screen}");
    let pids: Vec<u32> = screen
        .lines()
        .filter(|line| line.contains("sglang::scheduler_TP"))
        .filter_map(|line| {
            line.trim_start_matches(['>', ' '])
                .split_whitespace()
                .next()
        })
        .filter_map(|pid| pid.parse().ok())
        .collect();
    assert!(!pids.is_empty(), "{screen}");
    assert!(pids.iter().all(|&pid| alive(pid)));
    tmux.ends_restored(&["q"], "0");
    assert!(
        pids.iter().all(|&pid| !alive(pid)),
        "the staged host outlived the view"
    );
}

/// Colours by default (an orphan's row, the bars); none with NO_COLOR or
/// TERM=dumb, where the marks (`#`, `!`, `>`) still carry the meaning.
#[test]
fn top_has_no_colour_with_no_color_or_a_dumb_terminal() {
    let host = host();
    host.leak(1, 8 * GIB).expect("leak");
    let mut incident = Incident::new(&host);
    orphaned_sglang(&mut incident);
    let colour =
        regex::Regex::new(r"\x1b\[[0-9;]*(3[0-7]|38;[25];[0-9;]+|9[0-7])m").expect("regex");
    for (env, coloured) in [("", true), ("NO_COLOR=1", false), ("TERM=dumb", false)] {
        let args = format!("--backend {} top --readonly", host.backend());
        let Some(tmux) = Tmux::run(&format!("env {env} {{bin}} {args}")) else {
            return;
        };
        let screen = tmux.shows("sglang::scheduler_TP1");
        assert!(screen.contains('!') && screen.contains('#') && screen.contains('>'));
        let attributes = tmux.screen_with_attributes();
        assert_eq!(
            colour.is_match(&attributes),
            coloured,
            "{env}: {attributes:?}"
        );
        tmux.ends_restored(&["q"], "0");
    }
}

/// Where each thread of `pid` sleeps, for a failure's message.
fn wchans(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .map(|task| std::fs::read_to_string(task.path().join("wchan")).unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
}

/// Start time (ticks) of `pid` while it lives, for an identity check.
fn started(pid: u32) -> Option<u64> {
    alive(pid).then(|| start_ticks(pid))
}

/// Waits up to `limit` for the process `pid` (started at `ticks`) to be
/// gone; if it is not, kills it (it is this test's) and fails with where it is.
fn gone_within(pid: u32, ticks: u64, limit: Duration, what: &str) {
    let deadline = Instant::now() + limit;
    while started(pid) == Some(ticks) {
        if Instant::now() >= deadline {
            let wchans = wchans(pid);
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if started(pid) == Some(ticks) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
            panic!(
                "{what}: top {pid} still ran after {limit:?} (killed); threads in {wchans:?}; stat {stat}"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Killing the terminal (the tmux server, as `tmux kill-server` or a killed
/// session does) ends top: it neither spins on the dead terminal nor waits
/// for a signal that may never come.
#[test]
fn top_ends_when_its_terminal_is_killed() {
    let host = host();
    let mut incident = Incident::new(&host);
    orphaned_sglang(&mut incident);
    let Some(tmux) = Tmux::start(&host, "--readonly") else {
        return;
    };
    tmux.shows("sglang::scheduler_TP1");
    let pid = tmux.top_pid();
    let ticks = start_ticks(pid);
    tmux.kill_server();
    gone_within(pid, ticks, Duration::from_secs(10), "after kill-server");
}

/// A pseudo-terminal of the test's own: the master, and the slave's path.
struct Pty {
    master: std::fs::File,
    slave: std::path::PathBuf,
}

impl Pty {
    fn open() -> Pty {
        use std::os::fd::FromRawFd;
        // Safety: posix_openpt returns a new descriptor, owned by the File;
        // grantpt, unlockpt and ptsname_r act on it and a buffer of ours.
        unsafe {
            let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
            assert!(fd >= 0, "posix_openpt");
            let master = std::fs::File::from_raw_fd(fd);
            assert_eq!(libc::grantpt(fd), 0);
            assert_eq!(libc::unlockpt(fd), 0);
            let mut name = [0 as libc::c_char; 128];
            assert_eq!(libc::ptsname_r(fd, name.as_mut_ptr(), name.len()), 0);
            let slave = std::ffi::CStr::from_ptr(name.as_ptr())
                .to_string_lossy()
                .into_owned();
            Pty {
                master,
                slave: slave.into(),
            }
        }
    }

    fn resize(&self, columns: u16, rows: u16) {
        use std::os::fd::AsRawFd;
        let size = libc::winsize {
            ws_row: rows,
            ws_col: columns,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // Safety: TIOCSWINSZ reads a winsize of ours.
        let done = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        assert_eq!(done, 0, "TIOCSWINSZ");
    }

    /// `gpureap top` on the slave, in a session of its own; `controlling`:
    /// the slave is its controlling terminal (SIGHUP and SIGWINCH reach it).
    fn top(
        &self,
        host: &SimHost,
        stderr: &std::path::Path,
        controlling: bool,
    ) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&self.slave)
                .expect("the slave")
        };
        let mut command = gpureap(host);
        command
            .args(["top", "--readonly"])
            .env("TERM", "xterm-256color")
            .stdin(open())
            .stdout(open())
            .stderr(std::fs::File::create(stderr).expect("stderr file"));
        // Safety: setsid and ioctl are async-signal-safe, as pre_exec needs.
        unsafe {
            command.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if controlling && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        command.spawn().expect("gpureap top starts")
    }
}

/// Waits for `child` to end within `limit`, else kills it and fails.
fn ends(
    child: &mut std::process::Child,
    limit: Duration,
    what: &str,
    stderr: &std::path::Path,
) -> i32 {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            use std::os::unix::process::ExitStatusExt;
            return status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        }
        if Instant::now() >= deadline {
            let pid = child.id();
            let wchans = wchans(pid);
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what}: top still ran after {limit:?} (killed); threads in {wchans:?}; stderr: {}",
                std::fs::read_to_string(stderr).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a thread of `pid` sleeps in a write to a terminal nobody reads.
fn blocked_writing(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks.flatten().any(|task| {
                let wchan = std::fs::read_to_string(task.path().join("wchan")).unwrap_or_default();
                let syscall =
                    std::fs::read_to_string(task.path().join("syscall")).unwrap_or_default();
                // write(2): 1 on x86-64, 64 on arm64.
                let writing = syscall.starts_with("1 ") || syscall.starts_with("64 ");
                writing && wchan != "0"
            })
        })
        .unwrap_or(false)
}

/// Its terminal's master closed (the emulator gone) without a signal to
/// top (the pty is not its controlling terminal): it reads the end of the
/// terminal and ends, with the modes it found given back where possible.
#[test]
fn top_ends_when_its_terminal_closes_without_a_signal() {
    let host = host();
    let dir = tempfile::tempdir().expect("temp dir");
    let stderr = dir.path().join("stderr");
    let pty = Pty::open();
    pty.resize(80, 24);
    let mut top = pty.top(&host, &stderr, false);
    // Its first frame, read from the master.
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(20);
    while !String::from_utf8_lossy(&seen).contains("holders") {
        assert!(
            Instant::now() < deadline,
            "no frame: {}",
            String::from_utf8_lossy(&seen)
        );
        let count = std::io::Read::read(&mut &pty.master, &mut buffer).expect("read the master");
        seen.extend_from_slice(&buffer[..count]);
    }
    drop(pty);
    let code = ends(
        &mut top,
        Duration::from_secs(10),
        "after the master closed",
        &stderr,
    );
    assert_eq!(code, 129, "ends as a hangup would end it");
}

/// A pane nobody reads (the master never read, so top's writes block): a
/// SIGTERM still ends it, and its terminal gets its modes back.
#[test]
fn top_ends_on_sigterm_while_nobody_reads_its_terminal() {
    let host = host();
    let mut incident = Incident::new(&host);
    orphaned_sglang(&mut incident);
    let dir = tempfile::tempdir().expect("temp dir");
    let stderr = dir.path().join("stderr");
    let pty = Pty::open();
    pty.resize(250, 80);
    let slave = std::fs::File::open(&pty.slave).expect("the slave");
    let before = termios(&slave);
    let mut top = pty.top(&host, &stderr, true);
    let pid = top.id();
    // Each resize redraws the whole screen; nothing reads it, so the
    // terminal's buffer fills until a write blocks.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut wide = true;
    while !blocked_writing(pid) {
        assert!(
            Instant::now() < deadline,
            "top never blocked writing: {}",
            std::fs::read_to_string(&stderr).unwrap_or_default()
        );
        assert!(
            top.try_wait().expect("try_wait").is_none(),
            "top ended early"
        );
        pty.resize(if wide { 251 } else { 250 }, 80);
        wide = !wide;
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let code = ends(&mut top, Duration::from_secs(10), "after SIGTERM", &stderr);
    assert_eq!(code, 143);
    let after = termios(&slave);
    assert_eq!(
        before, after,
        "the terminal's modes (lflag, iflag, oflag) given back"
    );
    drop(pty);
}

/// The modes top changes in raw mode.
fn termios(file: &std::fs::File) -> (u32, u32, u32) {
    use std::os::fd::AsRawFd;
    // Safety: tcgetattr fills a zeroed termios of ours.
    unsafe {
        let mut modes: libc::termios = std::mem::zeroed();
        assert_eq!(libc::tcgetattr(file.as_raw_fd(), &mut modes), 0);
        (modes.c_lflag, modes.c_iflag, modes.c_oflag)
    }
}

/// Seen from a PID namespace of its own, on a driver that omits other
/// namespaces' processes (`DIR/omit-other-namespaces`, as NVML 580 does),
/// memory no listed process explains is unseen, as `status` says: its own
/// mark (`?`, not `!`), the word, the reason with the remedy, and a plan
/// for that GPU that says no free from here can give it back.
#[test]
fn top_shows_memory_unseen_from_its_pid_namespace_as_unseen_not_held_by_no_process() {
    if !crate::containers::unshare_works() {
        return skip("unshare cannot make PID and mount namespaces here (needs CAP_SYS_ADMIN)");
    }
    let host = host();
    std::fs::create_dir(host.path().join("host-proc")).expect("the mount point");
    std::fs::write(host.path().join("omit-other-namespaces"), "").expect("the marker");
    let mut incident = Incident::new(&host);
    incident
        .holder(&Holder::new("vllm-worker").on(1, 12 * GIB))
        .expect("holder");
    let dir = host.path().display();
    let Some(tmux) = Tmux::run(&format!(
        "unshare --mount --propagation private -- sh -c 'mount --bind /proc {dir}/host-proc && exec unshare --pid --fork --mount-proc {{bin}} --backend sim:{dir} top --readonly'"
    )) else {
        return;
    };
    let screen = tmux.shows("unseen");
    let gpu1 = line_with(&screen, "GPU1").expect("GPU1 bar");
    assert!(
        gpu1.contains("?12.0 GiB unseen") && gpu1.contains('?') && !gpu1.contains('!'),
        "{screen}"
    );
    let flat = screen.split_whitespace().collect::<Vec<_>>().join(" ");
    for said in [
        "?: GPU 1: 12.0 GiB unseen",
        "not driver-held: do not reset",
        "No process seen from this PID namespace",
    ] {
        assert!(flat.contains(said), "{said:?} in\n{screen}");
    }
    assert!(!flat.contains("held by no process"), "{screen}");
    tmux.ends_restored(&["q"], "0");
}

/// Between full looks the view watches the driver's figures and the
/// holders (`pace::Pace`): a holder that appears or dies shows at once, not
/// at the next interval (120 s here, so that only the watch can explain it;
/// the bound is generous for a loaded machine, whose scans take seconds).
#[test]
fn top_shows_a_holder_appear_and_die_before_its_interval() {
    let host = host();
    let mut incident = Incident::new(&host);
    let Some(tmux) = Tmux::start(&host, "--readonly --interval 120s") else {
        return;
    };
    tmux.shows("GPU0");
    let holder = incident
        .holder(&Holder::new("late-worker").on(0, 5 * GIB))
        .expect("holder");
    let within = Duration::from_secs(45);
    tmux.wait_for_within("the new holder", within, |screen| {
        screen.contains("late-worker") && screen.contains("5.0 GiB")
    });
    incident.kill(holder).expect("holder killed");
    tmux.wait_for_within("the holder gone", within, |screen| {
        screen.contains("0 holders") && !screen.contains("late-worker")
    });
    tmux.ends_restored(&["q"], "0");
}

/// What nvitop and nvtop users look at first: each GPU's utilization,
/// temperature and power of its limit on its bar's line, and an SM% column
/// where the driver gives each process's (a listed process it leaves out
/// used none: 0%); a new reading shows between full looks.
#[test]
fn top_shows_each_gpus_activity_and_each_processes_sm_utilization() {
    let host = host();
    let mut incident = Incident::new(&host);
    let busy = incident
        .holder(&Holder::new("sglang::scheduler_TP0").on(0, 30 * GIB))
        .expect("busy worker");
    let idle = incident
        .holder(&Holder::new("sglang::scheduler_TP1").on(1, 20 * GIB))
        .expect("idle worker");
    host.activity(
        0,
        &format!(
            "utilization 87\ntemperature 64\npower 312\npower_limit 700\nprocess_sm {busy} 41\n"
        ),
    )
    .expect("activity");
    host.activity(1, "temperature 33\nprocess_sm none\n")
        .expect("activity");
    let Some(tmux) = Tmux::start(&host, "--readonly --interval 200ms") else {
        return;
    };
    let screen = tmux.wait_for("GPU 0's activity", |screen| {
        line_with(screen, "GPU0").is_some_and(|line| line.contains("87%"))
    });
    let gpu0 = line_with(&screen, "GPU0").expect("GPU0 bar");
    assert!(
        gpu0.contains("64°C") && gpu0.contains("312/700W"),
        "{screen}"
    );
    let gpu1 = line_with(&screen, "GPU1").expect("GPU1 bar");
    assert!(
        gpu1.contains("33°C") && gpu1.contains("?/?W") && gpu1.contains("   ?"),
        "{screen}"
    );
    assert!(line_with(&screen, "SM%").is_some(), "{screen}");
    let row = |pid: u32| {
        let pid = pid.to_string();
        screen
            .lines()
            .find(|line| {
                line.trim_start_matches(['>', '*'])
                    .split_whitespace()
                    .next()
                    == Some(pid.as_str())
            })
            .unwrap_or_else(|| panic!("no row for {pid}:\n{screen}"))
            .to_string()
    };
    assert!(row(busy).contains(" 41% "), "{screen}");
    assert!(row(idle).contains(" 0% "), "{screen}");
    host.activity(
        0,
        "utilization 12\ntemperature 64\npower 312\npower_limit 700\n",
    )
    .expect("activity");
    tmux.wait_for("GPU 0's new reading", |screen| {
        line_with(screen, "GPU0").is_some_and(|line| line.contains("12%"))
    });
    tmux.ends_restored(&["q"], "0");
}

/// A server whose launcher died left an orphaned worker on GPU 0 and an
/// orphaned sidecar that watches every GPU (a monitor). `o` plans to free
/// the worker and leave the monitor alone; the worker is killed before the
/// `y` (a zombie where PID 1 does not reap, else gone, its PID free for
/// another): nothing is signalled, and the footer says so rather than
/// "1 process(es) signalled", and calls the monitor a monitor, as the plan
/// did, not "protected".
#[test]
fn top_says_a_target_that_exited_before_the_confirmation_was_not_signalled() {
    let host = host();
    let mut incident = Incident::new(&host);
    let launcher = incident
        .sglang(&[
            Holder::new("sglang::scheduler_TP0").on(0, 10 * GIB),
            Holder::new("nvidia_gpu_exporter"),
        ])
        .expect("sglang");
    let worker = incident.pid_of("sglang::scheduler_TP0").expect("TP0");
    let monitor = incident.pid_of("nvidia_gpu_exporter").expect("monitor");
    incident.kill(launcher).expect("launcher killed");
    reparented(&[worker, monitor]);
    let Some(tmux) = Tmux::start(&host, "--grace 1s --timeout 5s") else {
        return;
    };
    tmux.wait_for("both rows", |screen| {
        screen.contains("sglang::scheduler_TP0") && screen.contains("nvidia_gpu_exporter")
    });
    tmux.keys(&["o"]);
    let plan = tmux.shows("plan: free these?");
    let flat = |screen: &str| screen.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat(&plan).contains(&format!("{worker} GPU 0 sglang::scheduler_TP0")),
        "{plan}"
    );
    assert!(
        flat(&plan).contains(&format!("Left alone: {monitor}"))
            && flat(&plan).contains("a monitor"),
        "{plan}"
    );
    incident.kill(worker).expect("worker killed");
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(worker) {
        assert!(Instant::now() < deadline, "the worker survived SIGKILL");
        std::thread::sleep(Duration::from_millis(5));
    }
    tmux.keys(&["y"]);
    let screen = tmux.wait_for("the result", |screen| {
        flat(screen).contains("Freed after") || flat(screen).contains("Not all freed")
    });
    assert!(
        flat(&screen).contains(": 0 signalled, 1 had already exited, 1 left alone (monitor)"),
        "{screen}"
    );
    assert!(alive(monitor), "the monitor was signalled");
    tmux.ends_restored(&["q"], "0");
}

/// A holder on GPU 0 and a metrics exporter watching every GPU (a monitor:
/// its nodes open, in no driver list).
fn holder_and_monitor(incident: &mut Incident) -> (u32, u32) {
    let holder = incident
        .holder(&Holder::new("python3 bench.py").on(0, 10 * GIB))
        .expect("holder");
    let monitor = incident
        .holder(&Holder::new("nvidia_gpu_exporter"))
        .expect("monitor");
    (holder, monitor)
}

/// A monitor's row reads as `status` shows it: in no GPU (`-`) with 0 B,
/// not its open nodes cut to `(0),(` with its memory `unknown`.
#[test]
fn top_shows_a_monitor_as_status_does() {
    let host = host();
    let mut incident = Incident::new(&host);
    let (_, monitor) = holder_and_monitor(&mut incident);
    let columns = |line: &str| -> Vec<String> {
        line.trim_start_matches(['>', ' ', '*'])
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let status = run(&host, &["status", "--monitors"]).stdout;
    let listed = columns(
        status
            .lines()
            .find(|line| line.contains("nvidia_gpu_exporter"))
            .expect("the monitor in status"),
    );
    // status: GPU PID PPID PGID SID USER S AGE GPU-MEM(2 words) FLAGS ...
    assert_eq!(
        (listed[0].as_str(), listed[1].as_str(), &listed[8..10]),
        (
            "-",
            monitor.to_string().as_str(),
            &["0".to_string(), "B".to_string()][..]
        ),
        "{status}"
    );
    let Some(tmux) = Tmux::start(&host, "--readonly") else {
        return;
    };
    let screen = tmux.shows("nvidia_gpu_exporter");
    let row = columns(line_with(&screen, "nvidia_gpu_exporter").expect("the monitor's row"));
    // top: PID USER S GPU GPU-MEM(2 words) FLAGS COMMAND
    assert_eq!(row[0], monitor.to_string(), "{screen}");
    assert_eq!(
        (
            row[3].as_str(),
            row[4].as_str(),
            row[5].as_str(),
            row[6].as_str()
        ),
        ("-", "0", "B", "monitor"),
        "{screen}"
    );
    tmux.ends_restored(&["q"], "0");
}
