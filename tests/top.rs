//! `gpureap top` in a real terminal: tmux (a server of its own per test,
//! 80x24), keys sent as a user types them, the screen read back with
//! capture-pane. Every wait is for something on the screen, never a sleep.

use std::process::Command;
use std::time::{Duration, Instant};

use gpureap::driver::sim::incident::{Holder, Incident, SimHost};

use crate::harness::*;

/// A tmux server of this test's own, ended (by its socket) when dropped.
struct Tmux {
    socket: String,
    dir: tempfile::TempDir,
}

impl Tmux {
    /// Starts `gpureap top ARGS` on `host` in an 80x24 pane.
    fn start(host: &SimHost, args: &str) -> Option<Tmux> {
        Tmux::run(&format!("--backend {} top {args}", host.backend()))
    }

    /// The screen with its colours and attributes, as escape sequences.
    fn screen_with_attributes(&self) -> String {
        let output = self
            .command()
            .args(["capture-pane", "-p", "-e", "-t", "0"])
            .output()
            .expect("capture-pane");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Runs `gpureap ARGS` in an 80x24 pane, inside a shell that records
    /// `stty -a` before and after, and the exit code; ARGS may place the
    /// binary itself with `{bin}` (after `env VAR=...`).
    fn run(args: &str) -> Option<Tmux> {
        if Command::new("tmux").arg("-V").output().is_err() {
            skip("tmux is not installed (.ci/run installs it)");
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = format!("gpureap-top-{}-{}", std::process::id(), unique());
        let bin = env!("CARGO_BIN_EXE_gpureap");
        let command = if args.contains("{bin}") {
            args.replace("{bin}", bin)
        } else {
            format!("{bin} {args}")
        };
        let script = format!(
            "stty -a > {d}/before; {command}; echo $? > {d}/rc; stty -a > {d}/after; echo TOP-ENDED; exec cat",
            d = dir.path().display(),
        );
        let tmux = Tmux { socket, dir };
        let started = tmux
            .command()
            .args(["new-session", "-d", "-x", "80", "-y", "24"])
            .args(["-e", "TERM=xterm-256color"])
            .args(["sh", "-c", &script])
            .status()
            .expect("tmux runs");
        assert!(started.success(), "tmux new-session failed");
        Some(tmux)
    }

    fn command(&self) -> Command {
        let mut command = Command::new("tmux");
        command.args(["-L", &self.socket, "-f", "/dev/null"]);
        command
    }

    fn keys(&self, keys: &[&str]) {
        let status = self
            .command()
            .args(["send-keys", "-t", "0"])
            .args(keys)
            .status()
            .expect("send-keys");
        assert!(status.success());
    }

    fn screen(&self) -> String {
        let output = self
            .command()
            .args(["capture-pane", "-p", "-t", "0"])
            .output()
            .expect("capture-pane");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Waits until the screen satisfies `ready`; panics with the screen after 20s.
    fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "waited for {what}; screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn shows(&self, text: &str) -> String {
        self.wait_for(text, |screen| screen.contains(text))
    }

    fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    /// The pid of gpureap top: the child of the pane's shell.
    fn top_pid(&self) -> u32 {
        let output = self
            .command()
            .args(["display-message", "-p", "-t", "0", "#{pane_pid}"])
            .output()
            .expect("display-message");
        let shell: u32 = String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("pane pid");
        let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))
            .expect("children");
        children
            .split_whitespace()
            .next()
            .and_then(|pid| pid.parse().ok())
            .expect("gpureap top runs under the pane's shell")
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.command().arg("kill-server").status();
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

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
    let deadline = Instant::now() + Duration::from_secs(5);
    while workers.iter().any(|&pid| ppid(pid) != Some(1)) {
        assert!(Instant::now() < deadline, "not re-parented");
        std::thread::sleep(Duration::from_millis(5));
    }
    workers
}

/// Leaves the view with `keys` and checks the terminal is as it was.
fn ends_restored(tmux: &Tmux, keys: &[&str], code: &str) {
    tmux.keys(keys);
    tmux.shows("TOP-ENDED");
    assert_eq!(tmux.file("rc").trim(), code);
    assert_eq!(
        modes(&tmux.file("before")),
        modes(&tmux.file("after")),
        "stty -a differs"
    );
    assert!(!tmux.file("before").is_empty());
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
    ends_restored(&tmux, &["q"], "0");
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
    ends_restored(&tmux, &["C-c"], "0");
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
    ends_restored(&tmux, &["q"], "0");
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
        let status = tmux
            .command()
            .args(["resize-window", "-t", "0", "-x", width, "-y", height])
            .status()
            .expect("resize-window");
        assert!(status.success());
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
    assert_eq!(tmux.file("rc").trim(), "143");
    assert_eq!(
        modes(&tmux.file("before")),
        modes(&tmux.file("after")),
        "stty -a differs"
    );
}

/// `stty -a` less the window's size, which is the pane's, not a mode top sets.
fn modes(stty: &str) -> String {
    let size = regex::Regex::new(r"rows \d+; columns \d+;").expect("regex");
    size.replace_all(stty, "").into_owned()
}

#[test]
fn top_without_a_terminal_is_bad_usage() {
    let host = host();
    let result = run(&host, &["top"]);
    assert_eq!(result.code, 2, "{}", result.stderr);
    assert!(
        result.stderr.contains("top needs a terminal"),
        "{}",
        result.stderr
    );
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
    ends_restored(&tmux, &["q"], "0");
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
    ends_restored(&tmux, &["q"], "0");
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
        ends_restored(&tmux, &["q"], "0");
    }
}
