//! One terminal driver for the tests that run gpureap in a real terminal
//! (`top`, `top -H`, `demo --top`): a tmux server of the test's own, an
//! 80x24 pane, keys sent as a user types them, the screen read back with
//! capture-pane. Every wait is for something on the screen, never a sleep.
//! The server's socket and the pane's records live in one temporary
//! directory: dropping the driver ends the server and removes both.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::SimHost;

use crate::harness::skip;

/// A tmux server of this test's own, ended (by its socket) when dropped.
pub struct Tmux {
    dir: tempfile::TempDir,
    /// How long `wait_for` waits for the screen before it fails.
    patience: Duration,
}

impl Tmux {
    /// Starts `gpureap top ARGS` on `host`.
    pub fn start(host: &SimHost, args: &str) -> Option<Tmux> {
        Tmux::run(&format!("--backend {} top {args}", host.backend()))
    }

    /// Runs `gpureap ARGS` in an 80x24 pane (TERM=xterm-256color), inside
    /// a shell that records `stty -a` before and after (`file("before")`,
    /// `file("after")`) and the exit code (`rc`), then shows `TOP-ENDED`
    /// and keeps the pane open; ARGS may place the binary itself with
    /// `{bin}` (after `env VAR=...`). `None`, the test skipped, where tmux
    /// is not installed.
    pub fn run(args: &str) -> Option<Tmux> {
        if Command::new("tmux").arg("-V").output().is_err() {
            skip("tmux is not installed (.ci/run installs it)");
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
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
        let tmux = Tmux {
            dir,
            patience: Duration::from_secs(20),
        };
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

    /// The same driver, whose waits for the screen last `patience`.
    pub fn patient(mut self, patience: Duration) -> Tmux {
        self.patience = patience;
        self
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("socket")
    }

    /// A tmux command addressed to this server, with no configuration.
    fn command(&self) -> Command {
        let mut command = Command::new("tmux");
        command
            .arg("-S")
            .arg(self.socket())
            .args(["-f", "/dev/null"]);
        command
    }

    /// `tmux ARGS` on this server; whether it succeeded.
    fn tmux(&self, args: &[&str]) -> bool {
        self.command()
            .args(args)
            .status()
            .unwrap_or_else(|error| panic!("tmux {args:?}: {error}"))
            .success()
    }

    /// What tmux prints for `tmux ARGS` on this server.
    fn output(&self, args: &[&str]) -> String {
        let output = self
            .command()
            .args(args)
            .output()
            .unwrap_or_else(|error| panic!("tmux {args:?}: {error}"));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    pub fn keys(&self, keys: &[&str]) {
        let sent = self
            .command()
            .args(["send-keys", "-t", "0"])
            .args(keys)
            .status()
            .expect("send-keys");
        assert!(sent.success(), "send-keys {keys:?}");
    }

    pub fn screen(&self) -> String {
        self.output(&["capture-pane", "-p", "-t", "0"])
    }

    /// The screen with its colours and attributes, as escape sequences.
    pub fn screen_with_attributes(&self) -> String {
        self.output(&["capture-pane", "-p", "-e", "-t", "0"])
    }

    /// Waits until the screen satisfies `ready`; panics with the screen
    /// after the driver's patience (20 s unless `patient`).
    pub fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        self.wait_for_within(what, self.patience, ready)
    }

    /// Waits until the screen satisfies `ready`; panics with the screen
    /// after `limit`.
    pub fn wait_for_within(
        &self,
        what: &str,
        limit: Duration,
        ready: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "waited {limit:?} for {what}; screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn shows(&self, text: &str) -> String {
        self.wait_for(text, |screen| screen.contains(text))
    }

    /// A record the pane's shell wrote (`before`, `after`, `rc`), empty
    /// until written.
    pub fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    /// gpureap's exit code, once it has ended.
    pub fn rc(&self) -> String {
        self.file("rc").trim().to_string()
    }

    /// Resizes the window (and its one pane) to `width` x `height`.
    pub fn resize(&self, width: &str, height: &str) {
        assert!(
            self.tmux(&["resize-window", "-t", "0", "-x", width, "-y", height]),
            "resize-window to {width}x{height}"
        );
    }

    /// Ends the server, and with it the terminal, as a killed session does.
    pub fn kill_server(&self) {
        assert!(self.tmux(&["kill-server"]), "kill-server");
    }

    /// The pid of gpureap: the child of the pane's shell.
    pub fn top_pid(&self) -> u32 {
        let shell: u32 = self
            .output(&["display-message", "-p", "-t", "0", "#{pane_pid}"])
            .trim()
            .parse()
            .expect("pane pid");
        let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))
            .expect("children");
        children
            .split_whitespace()
            .next()
            .and_then(|pid| pid.parse().ok())
            .expect("gpureap runs under the pane's shell")
    }

    /// Leaves the view with `keys`; checks that it ended with `code` and
    /// gave the terminal back the modes it found.
    pub fn ends_restored(&self, keys: &[&str], code: &str) {
        self.keys(keys);
        self.shows("TOP-ENDED");
        self.restored(code);
    }

    /// Checks that gpureap, ended, exited `code` and gave the terminal
    /// back the modes it found.
    pub fn restored(&self, code: &str) {
        assert_eq!(self.rc(), code);
        let before = self.file("before");
        assert!(!before.is_empty(), "stty -a before gpureap was recorded");
        assert_eq!(
            modes(&before),
            modes(&self.file("after")),
            "stty -a differs"
        );
    }
}

/// `stty -a` less the window's size, which is the pane's, not a mode top sets.
fn modes(stty: &str) -> String {
    let size = regex::Regex::new(r"rows \d+; columns \d+;").expect("regex");
    size.replace_all(stty, "").into_owned()
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self
            .command()
            .arg("kill-server")
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// The driver leaves nothing behind: once dropped, its tmux server has
/// ended and its socket and records are gone. Before, each test's server
/// socket stayed in /tmp/tmux-UID (tmux's default place, `-L NAME`).
#[test]
fn a_dropped_driver_leaves_no_server_and_no_file() {
    let Some(tmux) = Tmux::run("--version") else {
        return;
    };
    tmux.shows("TOP-ENDED");
    let server: u32 = tmux
        .output(&["display-message", "-p", "#{pid}"])
        .trim()
        .parse()
        .expect("the server's pid");
    let (dir, socket) = (tmux.dir.path().to_path_buf(), tmux.socket());
    assert!(socket.exists() && crate::harness::alive(server));
    drop(tmux);
    let deadline = Instant::now() + Duration::from_secs(10);
    while crate::harness::alive(server) {
        assert!(
            Instant::now() < deadline,
            "tmux server {server} outlived its driver"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!socket.exists(), "{} left behind", socket.display());
    assert!(!dir.exists(), "{} left behind", dir.display());
}
