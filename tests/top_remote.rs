//! `gpureap top -H HOST` against a real sshd host (tests/sshd_lab.rs), in a
//! real terminal (tests/tmux.rs: tmux, 80x24); the stream the host writes
//! for it, `top --json`, is tests/top_stream.rs's. Every wait is for
//! something on the screen or in a process list, never a sleep.

use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::{Holder, LAUNCHER};

use crate::harness::GIB;
use crate::sshd_lab::{Kind, Lab, records};
use crate::tmux::Tmux;

/// The children of `parent` (of any of its threads), with their comm.
fn children(parent: u32) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|field| field.parse::<u32>().ok());
        if ppid == Some(parent) {
            found.push((pid, stat[open + 1..close].to_string()));
        }
    }
    found.sort();
    found
}

/// The ssh processes `top` runs.
fn ssh_children(top: u32) -> Vec<u32> {
    children(top)
        .into_iter()
        .filter(|(_, comm)| comm == "ssh")
        .map(|(pid, _)| pid)
        .collect()
}

/// The PIDs on `host` of the gpureap serving the stream (`top … --json`).
fn remote_streams(lab: &Lab, host: &str) -> Vec<u32> {
    let ps = lab.on(host, "ps -eo pid=,args=");
    assert_eq!(ps.code, 0, "ps on {host}: {}", ps.stderr);
    ps.stdout
        .lines()
        .filter(|line| line.contains("gpureap") && line.contains(" top --interval"))
        .filter(|line| !line.contains("gpureap-watch"))
        .filter_map(|line| line.split_whitespace().next()?.parse().ok())
        .collect()
}

/// utime + stime of a process, in clock ticks (100 a second).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    [11, 12]
        .iter()
        .filter_map(|&at| fields.get(at)?.parse::<u64>().ok())
        .sum()
}

/// How many connections the host's sshd has accepted so far.
fn accepted(lab: &Lab, host: &str) -> usize {
    std::fs::read_to_string(lab.path().join(host).join("sshd.log"))
        .unwrap_or_default()
        .matches("Accepted publickey")
        .count()
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "waited for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The PID `title` is recorded under on a lab host.
fn recorded(lab: &Lab, host: &str, title: &str) -> Option<u32> {
    records(lab.host(host).sim.path())
        .into_iter()
        .filter(|(_, recorded)| recorded == title)
        .map(|(pid, _)| pid)
        .next_back()
}

/// An SGLang-like server on `host` whose launcher died: its two workers,
/// orphaned, re-parented to the host's PID 1.
fn orphaned_sglang(lab: &Lab, host: &str) -> [u32; 2] {
    let workers = [
        Holder::new("sglang::scheduler_TP0").on(0, 30 * GIB),
        Holder::new("sglang::scheduler_TP1").on(1, 20 * GIB),
    ];
    let mut script = format!("echo \"$$ {LAUNCHER}\" >> \"$D/pids\"; ");
    for worker in &workers {
        script.push_str(&format!("( {} ) & ", worker.script()));
    }
    script.push_str(&format!(
        "exec -a '{LAUNCHER} --model-path m --tp 2' sleep 100000"
    ));
    let launcher = lab.hold_script(host, LAUNCHER, &script);
    let mut pids = [0; 2];
    eventually("the workers to start", || {
        for (pid, worker) in pids.iter_mut().zip(&workers) {
            *pid = recorded(lab, host, &worker.title).unwrap_or(0);
        }
        pids.iter().all(|&pid| {
            pid != 0
                && lab
                    .on(host, &format!("tr '\\0' ' ' </proc/{pid}/cmdline"))
                    .stdout
                    .starts_with("sglang::")
        })
    });
    let killed = lab.on(host, &format!("kill -9 {launcher}"));
    assert_eq!(killed.code, 0, "{}", killed.stderr);
    eventually("the workers to be re-parented", || {
        pids.iter().all(|pid| {
            lab.on(host, &format!("cut -d' ' -f4 /proc/{pid}/stat"))
                .stdout
                .trim()
                == "1"
        })
    });
    pids
}

/// `gpureap top -H HOST` in a terminal, through the lab's ssh, running
/// `remote_bin` there; its screen waited for 30 s (each refresh is an ssh
/// round trip on a loaded machine).
fn top_on(lab: &Lab, host: &str, remote_bin: &str, flags: &str) -> Option<Tmux> {
    Tmux::run(&format!(
        "top -H {host} --ssh '{}' --remote-bin {remote_bin} {flags}",
        lab.ssh()
    ))
    .map(|tmux| tmux.patient(Duration::from_secs(30)))
}

#[test]
fn top_h_shows_one_host_over_one_ssh_frees_there_survives_a_lost_stream_and_leaves_nothing() {
    let lab = Lab::new(&[Kind::Up]);
    let workers = orphaned_sglang(&lab, "h1");
    let Some(tmux) = top_on(
        &lab,
        "h1",
        env!("CARGO_BIN_EXE_gpureap"),
        "--interval 300ms --grace 200ms",
    ) else {
        return;
    };
    // The host's GPUs and holders, its name in the header.
    let screen = tmux.shows("sglang::scheduler_TP1");
    assert!(
        screen
            .lines()
            .next()
            .unwrap_or("")
            .starts_with("gpureap top h1 · "),
        "{screen}"
    );
    assert!(screen.contains("GPU0"), "{screen}");
    assert!(screen.contains("orphaned"), "{screen}");
    let top = tmux.top_pid();
    let (cpu_before, started) = (cpu_ticks(top), Instant::now());
    let ssh = ssh_children(top);
    assert_eq!(ssh.len(), 1, "one ssh serves the view: {ssh:?}");

    // Refreshes come through that one ssh: a holder started there appears.
    let notebook = lab.hold("h1", &Holder::new("python3 notebook.py").on(0, 6 * GIB));
    tmux.shows("notebook.py");
    assert_eq!(ssh_children(top), ssh, "a refresh started another ssh");

    // Free all orphans: the plan is the host's dry run; the notebook is not in it.
    let connections = accepted(&lab, "h1");
    assert!(connections >= 1, "sshd logs the connections it accepts");
    tmux.keys(&["o"]);
    let screen = tmux.shows("plan: free these?");
    let plan: String = screen
        .lines()
        .filter(|line| line.contains('│'))
        .collect::<Vec<_>>()
        .join("\n");
    for pid in workers {
        assert!(
            plan.contains(&format!(" {pid} ")),
            "{pid} not in the plan:\n{plan}"
        );
    }
    assert!(!plan.contains(&format!(" {notebook} ")), "{plan}");
    tmux.keys(&["y"]);
    let result = tmux.shows("Freed on h1");
    tmux.shows("h1: GPU 1: freed 20.0 GiB");
    let result = tmux.wait_for("GPU 0's verified figure", |screen| {
        screen.contains("h1: GPU 0: freed 30.0 GiB")
    }) + &result;
    // The plan and the free rode the stream's connection (its ControlMaster).
    assert_eq!(accepted(&lab, "h1"), connections, "a new ssh connection");
    for pid in workers {
        let gone = lab.on("h1", &format!("test -e /proc/{pid}"));
        assert_ne!(gone.code, 0, "worker {pid} still runs on h1:\n{result}");
    }
    tmux.wait_for("the workers gone from the list", |screen| {
        screen
            .lines()
            .next()
            .unwrap_or("")
            .contains(" · 1 holders · ")
            && screen.contains("notebook.py")
    });
    assert_eq!(ssh_children(top).len(), 1, "{:?}", ssh_children(top));
    assert!(
        ssh_children(top).contains(&ssh[0]),
        "the stream's ssh changed"
    );

    // The stream ends there: the view says so, then reconnects by itself.
    let streams = remote_streams(&lab, "h1");
    assert_eq!(streams.len(), 1, "{streams:?}");
    let killed = lab.on("h1", &format!("kill -9 {}", streams[0]));
    assert_eq!(killed.code, 0, "{}", killed.stderr);
    let lost = tmux.shows("Connection to h1 lost");
    assert!(
        lost.lines()
            .next()
            .unwrap_or("")
            .contains("CONNECTION LOST"),
        "{lost}"
    );
    let back = tmux.wait_for("the view back", |screen| {
        !screen.contains("CONNECTION LOST")
            && !screen.contains("onnecting")
            && screen.contains("notebook.py")
    });
    let again = ssh_children(top);
    assert_eq!(again.len(), 1, "{again:?}\n{back}");
    assert_ne!(again, ssh, "a new connection after the loss");

    // What the view cost here, for the report (not a bound: the machine is shared).
    eprintln!(
        "top -H: {} ms of CPU in {:.1} s (a 300 ms refresh, a free, a reconnection)",
        (cpu_ticks(top) - cpu_before) * 1000 / 100,
        started.elapsed().as_secs_f64()
    );
    // Quitting ends the ssh, and with it everything of ours on the host.
    tmux.ends_restored(&["q"], "0");
    eventually("no gpureap of the view left on h1", || {
        remote_streams(&lab, "h1").is_empty()
    });
    let left = lab.on("h1", "ps -eo args=");
    assert!(
        !left.stdout.contains("gpureap-watch"),
        "the watch is left on h1:\n{}",
        left.stdout
    );
}

#[test]
fn top_h_readonly_refuses_and_writes_the_hosts_hostile_names_out() {
    let lab = Lab::new(&[Kind::Up]);
    let title = "liar\r\x1b[2KFORGED-LINE";
    lab.hold("h1", &Holder::new(title).on(1, 2 * GIB));
    let Some(tmux) = top_on(&lab, "h1", env!("CARGO_BIN_EXE_gpureap"), "--readonly") else {
        return;
    };
    let screen = tmux.shows("liar\\r\\u{1b}[2KFORGED");
    assert!(screen.contains("read-only"), "{screen}");
    tmux.keys(&["o"]);
    let refused = tmux.shows("Read-only (--readonly): nothing can be signalled");
    for line in refused.lines() {
        assert!(
            !line.trim_start().starts_with("FORGED-LINE"),
            "a name started a line:\n{refused}"
        );
    }
    tmux.ends_restored(&["q"], "0");
}

#[test]
fn top_h_without_gpureap_on_the_host_says_so_and_gives_up_at_once() {
    let lab = Lab::new(&[Kind::Up]);
    let Some(tmux) = top_on(&lab, "h1", "/nonexistent/gpureap", "") else {
        return;
    };
    let screen = tmux.shows("gave up");
    assert!(
        screen.contains("/nonexistent/gpureap not found on the host"),
        "{screen}"
    );
    assert!(
        screen
            .lines()
            .next()
            .unwrap_or("")
            .contains("CONNECTION LOST"),
        "{screen}"
    );
    // Nothing runs while it waits for r: no ssh left.
    assert!(ssh_children(tmux.top_pid()).is_empty());
    tmux.ends_restored(&["q"], "0");
}
