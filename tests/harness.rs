//! A small harness: run the gpureap binary against a simulated host and read
//! its JSON, and ask /proc whether a staged process is still alive.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};
use serde_json::Value;

pub const GIB: u64 = 1 << 30;

/// The one way the tests build a simulated host (docs/simulated-driver.md):
/// `Sim::gpus(2)` is two 80 GiB "Simulated H200"s; `.memory`, `.named`,
/// `.claims_only` and `.char_devices` change what `SimHost` gets made, and
/// `.stage()` adds the `Incident` that stages processes on it.
pub struct Sim {
    count: u32,
    memory: u64,
    name: String,
    nodes: Nodes,
}

enum Nodes {
    Files,
    ClaimsOnly,
    CharDevices,
}

impl Sim {
    pub fn gpus(count: u32) -> Sim {
        Sim {
            count,
            memory: 80 * GIB,
            name: "Simulated H200".to_string(),
            nodes: Nodes::Files,
        }
    }

    /// Each GPU's memory.
    pub fn memory(mut self, bytes: u64) -> Sim {
        self.memory = bytes;
        self
    }

    /// Each GPU's name (`NVIDIA H100 80GB HBM3`).
    pub fn named(mut self, name: &str) -> Sim {
        self.name = name.to_string();
        self
    }

    /// `SimHost::claims_only`: only processes with claims are listed.
    pub fn claims_only(mut self) -> Sim {
        self.nodes = Nodes::ClaimsOnly;
        self
    }

    /// `SimHost::with_char_devices`: device nodes as slurmd wants them.
    pub fn char_devices(mut self) -> Sim {
        self.nodes = Nodes::CharDevices;
        self
    }

    pub fn build(self) -> SimHost {
        let made = match self.nodes {
            Nodes::Files => SimHost::new(self.count, self.memory, &self.name),
            Nodes::ClaimsOnly => SimHost::claims_only(self.count, self.memory, &self.name),
            Nodes::CharDevices => SimHost::with_char_devices(self.count, self.memory, &self.name),
        };
        made.expect("sim host")
    }

    /// The host and an incident on it: bind them in this order
    /// (`let (host, mut incident) = ...`), so that the processes are killed
    /// before the host's directory goes.
    pub fn stage(self) -> (SimHost, Incident) {
        let host = self.build();
        let incident = Incident::new(&host);
        (host, incident)
    }
}

/// The `rank`th SGLang worker, `sglang::scheduler_TP{rank}`, with a context
/// of `bytes` on GPU `rank`.
pub fn scheduler(rank: u32, bytes: u64) -> Holder {
    Holder::new(&format!("sglang::scheduler_TP{rank}")).on(rank, bytes)
}

/// What the tests stage on an `Incident` again and again: a holder, an
/// SGLang server's tree, its launcher killed.
pub trait Staging {
    /// Starts `holder`; its PID.
    fn hold(&mut self, holder: Holder) -> u32;
    /// `Incident::sglang`: the launcher's PID and each worker's, in order.
    fn sglang_tree<const N: usize>(&mut self, workers: [Holder; N]) -> (u32, [u32; N]);
    /// SIGKILLs the launcher and waits until `orphans` (its children) were
    /// re-parented to PID 1, as they are on a GPU box when SGLang's
    /// launcher dies.
    fn orphan(&mut self, launcher: u32, orphans: &[u32]);
    /// An SGLang server whose launcher died: its orphaned workers' PIDs.
    fn orphaned_sglang<const N: usize>(&mut self, workers: [Holder; N]) -> [u32; N];
}

impl Staging for Incident {
    fn hold(&mut self, holder: Holder) -> u32 {
        self.holder(&holder)
            .unwrap_or_else(|error| panic!("{}: {error}", holder.title))
    }

    fn sglang_tree<const N: usize>(&mut self, workers: [Holder; N]) -> (u32, [u32; N]) {
        let launcher = self.sglang(&workers).expect("sglang tree");
        let pids = workers
            .each_ref()
            .map(|worker| self.pid_of(&worker.title).expect("worker recorded"));
        (launcher, pids)
    }

    fn orphan(&mut self, launcher: u32, orphans: &[u32]) {
        self.kill(launcher).expect("kill launcher");
        let deadline = Instant::now() + Duration::from_secs(5);
        while orphans.iter().any(|&pid| ppid(pid) != Some(1)) {
            assert!(
                Instant::now() < deadline,
                "workers were not re-parented to PID 1 (a subreaper above the tests?)"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn orphaned_sglang<const N: usize>(&mut self, workers: [Holder; N]) -> [u32; N] {
        let (launcher, pids) = self.sglang_tree(workers);
        self.orphan(launcher, &pids);
        pids
    }
}

/// A reap policy that acts on the first look: `RULE --older-than 0s
/// --interval 100ms ARGS`.
pub fn at_once<'a>(rule: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    [
        &[rule, "--older-than", "0s", "--interval", "100ms"][..],
        args,
    ]
    .concat()
}

/// `reap` with the policy `at_once` makes.
pub fn reap_now<'a>(rule: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    [&["reap"][..], &at_once(rule, args)].concat()
}

/// `free SCOPE --grace GRACE --timeout TIMEOUT --yes --json`: a free that
/// asks nothing and reports in JSON.
pub fn free_json<'a>(scope: &[&'a str], grace: &'a str, timeout: &'a str) -> Vec<&'a str> {
    let tail = ["--grace", grace, "--timeout", timeout, "--yes", "--json"];
    [&["free"][..], scope, &tail].concat()
}

/// Asks `ready` every `every` until it answers, for at most `limit`; then
/// fails, saying `what_not`.
pub fn poll<T>(
    limit: Duration,
    every: Duration,
    mut ready: impl FnMut() -> Option<T>,
    what_not: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(answer) = ready() {
            return answer;
        }
        assert!(Instant::now() < deadline, "{}", what_not());
        std::thread::sleep(every);
    }
}

/// The address in a line that names an `http://ADDRESS/...` URL (what the
/// exporter and `run --metrics` say they listen on).
pub fn http_address(line: &str) -> std::net::SocketAddr {
    let (_, url) = line
        .split_once("http://")
        .unwrap_or_else(|| panic!("no address in: {line}"));
    let address = url.split('/').next().unwrap_or(url);
    address
        .parse()
        .unwrap_or_else(|error| panic!("{address:?} in {line:?}: {error}"))
}

/// The holder `pid` in a status document.
pub fn holder_of(status: &Value, pid: u32) -> &Value {
    status["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .find(|holder| holder["pid"] == pid)
        .unwrap_or_else(|| panic!("{pid} not listed: {status:#}"))
}

/// A holder's `flags` (`orphaned`, `monitor`, ...).
pub fn flags(holder: &Value) -> Vec<String> {
    holder["flags"]
        .as_array()
        .expect("flags")
        .iter()
        .map(|flag| flag.as_str().expect("flag").to_string())
        .collect()
}

/// Asserts that `text` contains `needle`, showing `text` where it does not.
#[track_caller]
pub fn assert_contains(text: &str, needle: &str) {
    assert!(text.contains(needle), "{needle:?} not in:\n{text}");
}

/// The gpureap binary, pointed at a simulated host, with no stdin.
pub fn gpureap(host: &SimHost) -> Command {
    against(Command::new(env!("CARGO_BIN_EXE_gpureap")), host)
}

/// `command`, a gpureap binary (or a command that runs one last), pointed
/// at a simulated host, with no stdin.
pub fn against(mut command: Command, host: &SimHost) -> Command {
    command
        .arg("--backend")
        .arg(host.backend())
        .env_remove("GPUREAP_BACKEND")
        .stdin(Stdio::null());
    command
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|error| {
            panic!(
                "stdout is not JSON ({error}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

impl From<Output> for Run {
    fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

pub fn run(host: &SimHost, args: &[&str]) -> Run {
    gpureap(host)
        .args(args)
        .output()
        .expect("gpureap runs")
        .into()
}

/// Alive and not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

/// The signals gpureap delivered to one PID, in order.
pub fn signals(report: &Value, pid: u32) -> Vec<String> {
    target(report, pid)
        .map(|target| {
            target["signals"]
                .as_array()
                .expect("signals array")
                .iter()
                .filter(|event| event["delivery"] == "sent")
                .map(|event| event["signal"].as_str().expect("signal name").to_string())
                .collect()
        })
        .unwrap_or_default()
}

pub fn target(report: &Value, pid: u32) -> Option<&Value> {
    report["targets"]
        .as_array()
        .expect("targets array")
        .iter()
        .find(|target| target["pid"] == pid)
}

pub fn target_pids(report: &Value) -> Vec<u32> {
    let mut pids: Vec<u32> = report["targets"]
        .as_array()
        .expect("targets array")
        .iter()
        .map(|target| target["pid"].as_u64().expect("pid") as u32)
        .collect();
    pids.sort_unstable();
    pids
}

pub fn spared(report: &Value, pid: u32) -> Option<String> {
    report["spared"]
        .as_array()
        .expect("spared array")
        .iter()
        .find(|entry| entry["pid"] == pid)
        .map(|entry| entry["reason"].as_str().expect("reason").to_string())
}

pub fn gpu(report: &Value, index: u32) -> &Value {
    report["gpus"]
        .as_array()
        .expect("gpus array")
        .iter()
        .find(|gpu| gpu["index"] == index)
        .unwrap_or_else(|| panic!("GPU {index} not in report: {report:#}"))
}

pub fn reasons(report: &Value, index: u32) -> Vec<String> {
    gpu(report, index)["reasons"]
        .as_array()
        .expect("reasons array")
        .iter()
        .map(|reason| reason["reason"].as_str().expect("reason tag").to_string())
        .collect()
}

pub fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Runs gpureap against a simulated host as user nobody, which may read
/// neither root's descriptors nor files only root may read. The host's
/// directory is made world-readable first, as a shared sim directory would be.
pub fn run_as_nobody(host: &SimHost, args: &[&str]) -> Run {
    let mut permissions = std::fs::metadata(host.path()).expect("dir").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(host.path(), permissions).expect("chmod");
    run_as_nobody_unchanged(host, args)
}

/// Copies a program that a test then runs, by cp rather than from this
/// process: a descriptor of the copy open for writing here would be
/// inherited by a child another test forks meanwhile, and running the copy
/// would fail with ETXTBSY ("Text file busy") until that child execs.
pub fn copy_to_run(from: &std::path::Path, to: &std::path::Path) {
    let copied = Command::new("cp")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp runs");
    assert!(copied.success(), "cp {} {}", from.display(), to.display());
}

/// A copy of gpureap that any uid can run: the checkout may sit in a folder
/// only root may enter (a clone under a private temporary directory), where
/// a test that runs gpureap as nobody would test only that exec fails.
/// Copied once per test binary; removed when it exits (a static is never
/// dropped: the removal is registered with atexit(3)).
pub fn reachable_gpureap() -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    static PLACE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    extern "C" fn remove_place() {
        if let Some(place) = PLACE.get() {
            let _ = std::fs::remove_dir_all(place);
        }
    }
    let place = PLACE.get_or_init(|| {
        let place = tempfile::tempdir().expect("tempdir").keep();
        // SAFETY: remove_place only reads a static that is set by then.
        unsafe { libc::atexit(remove_place) };
        std::fs::set_permissions(&place, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let binary = place.join("gpureap");
        copy_to_run(std::path::Path::new(env!("CARGO_BIN_EXE_gpureap")), &binary);
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        place
    });
    place.join("gpureap")
}

/// As `run_as_nobody`, leaving the directory's mode as it is.
pub fn run_as_nobody_unchanged(host: &SimHost, args: &[&str]) -> Run {
    let mut setpriv = Command::new("setpriv");
    setpriv
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(reachable_gpureap());
    against(setpriv, host)
        .args(args)
        .output()
        .expect("setpriv runs")
        .into()
}

/// Runs `command` to its end, or kills it after `limit` and fails: for a
/// command that must end without waiting out a long timeout of its own.
pub fn ends_within(command: &mut Command, limit: Duration, what: &str) -> Run {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpureap starts");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("output");
            panic!(
                "{what}: still running after {limit:?} (killed); it waits out its timeout\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output").into()
}

/// The kernel function the process `pid` sleeps in (`/proc/PID/wchan`):
/// `None` when it is gone, `"0"` while it runs or is runnable.
pub fn wchan(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).ok()
}

/// Where a gpureap that has read the driver once waits for the next reading
/// (`Driver::wait_for_change`): in poll(2) on its holders' pidfds, or asleep
/// where it has none to poll (no holders, kernels before 5.3).
pub const WAITING_ON_THE_DRIVER: &[&str] = &["poll", "nanosleep"];

/// Waits, for at most 30 s, until the process `pid` sleeps in a kernel
/// function whose name contains one of `places` (`"poll"`: blocked in
/// poll(2); `"wait_for_partner"`, `"fifo_open"` on older kernels: in the open
/// of a FIFO nobody has opened the other end of). `what` says what that
/// means, for the failure.
pub fn blocked_in(pid: u32, places: &[&str], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = wchan(pid);
        if now
            .as_deref()
            .is_some_and(|now| places.iter().any(|place| now.contains(place)))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: process {pid} never blocked in {places:?} within 30s (wchan {now:?})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// When the process `pid` started, in clock ticks since boot (the 22nd
/// field of `/proc/PID/stat`).
pub fn start_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    stat.rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(19))
        .and_then(|ticks| ticks.parse().ok())
        .expect("start time")
}

/// Waits until the clock has passed the tick the process `pid` started in:
/// a process started from then on is younger by its start time too, which
/// the kernel counts in ticks.
pub fn past_start_tick(pid: u32) {
    let started = start_ticks(pid);
    let per_second = rustix::param::clock_ticks_per_second();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // Seconds since boot, by the same clock, to the hundredth.
        let uptime = std::fs::read_to_string("/proc/uptime").expect("uptime");
        let centiseconds: u64 = uptime
            .split_whitespace()
            .next()
            .and_then(|seconds| seconds.replace('.', "").parse().ok())
            .expect("uptime in hundredths");
        if centiseconds * per_second / 100 > started {
            return;
        }
        assert!(Instant::now() < deadline, "the clock stands still");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Where `skip` records the tests that did not run, one `SKIPPED: test:
/// reason` line each, for the end of the suite to count (`.ci/run` prints
/// them); `$GPUREAP_TEST_SKIPPED` names another file.
pub const SKIPPED: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/skipped.txt");

/// Reports the calling test skipped, with `reason`: a `SKIPPED: test:
/// reason` line on stderr, and the same line appended to `SKIPPED`. A test
/// that cannot run here calls `return skip(reason)` instead of returning in
/// silence.
pub fn skip(reason: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("unnamed test");
    let line = format!("SKIPPED: {test}: {reason}\n");
    eprint!("{line}");
    let file = std::env::var_os("GPUREAP_TEST_SKIPPED").map_or_else(
        || std::path::PathBuf::from(SKIPPED),
        std::path::PathBuf::from,
    );
    let recorded = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
        .and_then(|mut opened| opened.write_all(line.as_bytes()));
    if let Err(error) = recorded {
        panic!(
            "{test} is skipped ({reason}) and could not record it in {}: {error}",
            file.display()
        );
    }
}

/// Why binfmt_misc cannot be mounted in a user namespace of this test's own (Linux 6.7 and
/// later, and user namespaces allowed), or `None` when it can: what a test that registers an
/// interpreter (qemu-user for another architecture's binary) needs, with nothing of the
/// host's registered or changed. Such a test runs `unshare --user --map-root-user --mount`
/// and mounts it first thing.
pub fn no_binfmt_misc_of_our_own() -> Option<String> {
    let probe = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c"])
        .arg("mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc")
        .stdin(Stdio::null())
        .output();
    match probe {
        Ok(probe) if probe.status.success() => None,
        Ok(probe) => Some(format!(
            "binfmt_misc cannot be mounted in a user namespace here (Linux 6.7 and later): {}",
            String::from_utf8_lossy(&probe.stderr).trim()
        )),
        Err(error) => Some(format!("unshare (util-linux): {error}")),
    }
}

/// `text` in single quotes, for a shell.
pub fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Bash's `$'…'` quoting of any bytes (NUL aside): how a test puts bytes a
/// shell would otherwise act on into a script.
pub fn ansi_c(bytes: &[u8]) -> String {
    let mut quoted = String::from("$'");
    for byte in bytes {
        quoted.push_str(&format!("\\x{byte:02x}"));
    }
    quoted.push('\'');
    quoted
}

/// A script for `Incident::spawn` (`$D` the simulated host): a process with
/// a 1 GiB context on GPU `gpu` whose argv[0] is `title` and whose comm is
/// `comm`, any bytes but NUL and '/' (at most 15: it is the name of the
/// link to sleep it is run through), recorded under `record`, the plain
/// text `title` starts with.
pub fn named_holder(record: &str, title: &[u8], comm: &[u8], gpu: u32) -> String {
    assert!(title.starts_with(record.as_bytes()) && !record.contains('\n'));
    assert!(comm.len() <= 15 && !comm.contains(&b'/') && !comm.contains(&0));
    format!(
        "ln -sfn \"$(command -v sleep)\" \"$D\"/{comm}; exec 3<\"$D/nvidia{gpu}\"; \
         printf '%s %s\\n' \"$BASHPID\" {record} >> \"$D/pids\"; exec -a {title} \"$D\"/{comm} 100000",
        comm = ansi_c(comm),
        record = ansi_c(record.as_bytes()),
        title = ansi_c(title),
    )
}

/// Asserts that `text`, as a person would read it, holds no control
/// character but the newline, and that no line of it begins with one of
/// `forged`: text that a process or a host made up.
pub fn assert_no_forged_lines(what: &str, text: &str, forged: &[&str]) {
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "{what} wrote a control character:\n{text:?}"
    );
    for line in text.lines() {
        for forgery in forged {
            assert!(
                !line.trim_start().starts_with(forgery),
                "{what} let a name start a line ({forgery:?}):\n{text}"
            );
        }
    }
}

/// Why a test that needs `Cgroups::v2` skips where it gets none.
pub const NO_CGROUPS: &str = "no cgroup v2 can be made here (needs root and a cgroup2 mount)";

static CGROUPS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The one cgroup fixture: a tree of this test's own under a cgroup mount
/// (the v2 one, or a v1 hierarchy's), removed on drop, deepest first, once
/// what is in it has gone (a killed process keeps its cgroup busy until it
/// is reaped: drop the `Incident` first, by declaring this before it). With
/// a home (`returning_to`; `v2` has the test's own), what is still in a
/// cgroup is moved back there first.
pub struct Cgroups {
    pub mount: std::path::PathBuf,
    /// Its path as /proc/PID/cgroup spells it (`/gpureap-scopes-...`).
    pub path: String,
    home: Option<std::path::PathBuf>,
}

impl Cgroups {
    /// Under the cgroup v2 mount, returning to this test's own v2 cgroup.
    /// None (and the caller skips) where cgroups cannot be made here.
    pub fn v2(what: &str) -> Option<Cgroups> {
        let mount = gpureap_services::supervision::cgroup2_mount()?;
        let own = own_cgroup(|line| line.strip_prefix("0::"))?;
        Some(Cgroups::under(mount, what)?.returning_to(&own))
    }

    /// The same under another cgroup mount (a v1 hierarchy's), with no home.
    pub fn under(mount: std::path::PathBuf, what: &str) -> Option<Cgroups> {
        let name = format!(
            "gpureap-{what}-{}-{}",
            std::process::id(),
            CGROUPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        std::fs::create_dir(mount.join(&name)).ok()?;
        Some(Cgroups {
            mount,
            path: format!("/{name}"),
            home: None,
        })
    }

    /// Moves what is left in a cgroup to `own` (a path on the same
    /// hierarchy, as /proc/self/cgroup spells it) before removing it.
    pub fn returning_to(mut self, own: &str) -> Cgroups {
        self.home = Some(self.mount.join(own.trim_start_matches('/')));
        self
    }

    /// Makes `relative` (and the folders above it) under the root; returns
    /// its path as /proc/PID/cgroup spells it.
    pub fn make(&self, relative: impl AsRef<std::path::Path>) -> String {
        let path = format!("{}/{}", self.path, relative.as_ref().display());
        std::fs::create_dir_all(self.dir(&path))
            .unwrap_or_else(|error| panic!("mkdir cgroup {path}: {error}"));
        path
    }

    /// A cgroup's directory under the mount.
    pub fn dir(&self, path: &str) -> std::path::PathBuf {
        self.mount.join(path.trim_start_matches('/'))
    }

    /// A bash fragment that moves the shell running it into the cgroup.
    pub fn enter(&self, path: &str) -> String {
        format!(
            "echo $$ > '{}'; ",
            self.dir(path).join("cgroup.procs").display()
        )
    }

    /// Moves `pid` into `relative` under the root, made with its parents.
    pub fn move_in(&self, relative: impl AsRef<std::path::Path>, pid: u32) {
        let path = self.dir(&self.make(relative));
        std::fs::write(path.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|error| panic!("moving {pid} into {}: {error}", path.display()));
    }

    /// Empties (to the home) and removes `path` and everything below it.
    fn remove_tree(&self, path: &std::path::Path) -> std::io::Result<()> {
        for entry in std::fs::read_dir(path)?.flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                self.remove_tree(&entry.path())?;
            }
        }
        if let Some(home) = &self.home {
            let procs = std::fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines() {
                let _ = std::fs::write(home.join("cgroup.procs"), pid);
            }
        }
        match std::fs::remove_dir(path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        let root = self.dir(&self.path);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.remove_tree(&root) {
                Ok(()) => return,
                Err(error) if Instant::now() > deadline => {
                    return eprintln!("cannot remove {}: {error}", root.display());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

/// This process's path on the hierarchy whose /proc/self/cgroup line `pick` takes.
pub fn own_cgroup(pick: impl Fn(&str) -> Option<&str>) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|line| pick(line).map(str::to_string))
}

/// One real OCI container (crun, busybox-static's shell in a rootfs of its
/// own, its own PID, mount, IPC, UTS and network namespaces) holding the
/// simulated GPU 0 through the host's node file bind-mounted at the same
/// path, killed and deleted by its id when dropped. crun runs with its
/// cgroup manager off (this host's hybrid layout needs it): the test moves
/// the container into the cgroup it wants.
pub struct Crun {
    state: tempfile::TempDir,
    _bundle: tempfile::TempDir,
    id: String,
    pub pid: u32,
}

impl Crun {
    /// Why a real container cannot be started here, if it cannot.
    pub fn unavailable() -> Option<&'static str> {
        let runs = |program: &str, args: &[&str]| {
            std::process::Command::new(program)
                .args(args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
        };
        if !runs("crun", &["--version"]) {
            return Some("crun is not installed (.ci/run installs it)");
        }
        let busybox = std::process::Command::new("readelf")
            .args(["-l", "/bin/busybox"])
            .output();
        match busybox {
            Ok(output) if output.status.success() => {
                if String::from_utf8_lossy(&output.stdout).contains("program interpreter") {
                    return Some("/bin/busybox is not static (busybox-static, .ci/run)");
                }
            }
            _ => return Some("no /bin/busybox to make a rootfs of (busybox-static, .ci/run)"),
        }
        if !rustix::process::geteuid().is_root() {
            return Some("starting a container needs root");
        }
        None
    }

    /// Starts the container; its init opens `gpus/nvidia0` and `nvidiactl`.
    pub fn start(id: &str, gpus: &std::path::Path) -> Crun {
        let bundle = tempfile::tempdir().expect("bundle");
        let bin = bundle.path().join("rootfs/bin");
        std::fs::create_dir_all(&bin).expect("rootfs");
        copy_to_run(std::path::Path::new("/bin/busybox"), &bin.join("busybox"));
        for applet in ["sh", "sleep"] {
            std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("applet");
        }
        let spec = std::process::Command::new("crun")
            .arg("spec")
            .current_dir(bundle.path())
            .status()
            .expect("crun spec");
        assert!(spec.success(), "crun spec failed");
        let config_path = bundle.path().join("config.json");
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(&config_path).expect("config"))
                .expect("config.json");
        let gpus = gpus.display().to_string();
        config["process"]["terminal"] = serde_json::json!(false);
        // Its rlimits cannot be set without CAP_SYS_RESOURCE, which this host withholds.
        config["process"]
            .as_object_mut()
            .expect("process")
            .remove("rlimits");
        config["process"]["args"] = serde_json::json!([
            "sh",
            "-c",
            format!("exec 3<{gpus}/nvidia0 4<{gpus}/nvidiactl; exec sleep 100000")
        ]);
        config["mounts"]
            .as_array_mut()
            .expect("mounts")
            .push(serde_json::json!({"destination": gpus, "type": "bind", "source": gpus, "options": ["rbind", "ro"]}));
        std::fs::write(&config_path, config.to_string()).expect("config written");
        let state = tempfile::tempdir().expect("state");
        // crun refuses a hybrid cgroup layout whose v2 side has a controller
        // (hugetlb here) and cannot load its device filter without raising
        // RLIMIT_MEMLOCK: it runs with its cgroup manager disabled, seeing
        // the v2 mount at /sys/fs/cgroup in a mount namespace of its own.
        // Its output goes to a file: the container inherits it and lives on.
        let log_path = state.path().join("crun.log");
        let log = std::fs::File::create(&log_path).expect("crun log");
        let started = std::process::Command::new("unshare")
            .args(["-m", "sh", "-c"])
            .arg(
                "mount --make-rprivate / && mount -t cgroup2 none /sys/fs/cgroup && \
                 exec crun --root \"$1\" --cgroup-manager=disabled run -d --bundle \"$2\" \"$3\"",
            )
            .arg("sh")
            .arg(state.path())
            .arg(bundle.path())
            .arg(id)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .status()
            .expect("unshare runs");
        assert!(
            started.success(),
            "crun run failed: {}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        let crun_state = std::process::Command::new("crun")
            .arg("--root")
            .arg(state.path())
            .args(["state", id])
            .output()
            .expect("crun state");
        let answer: Value = serde_json::from_slice(&crun_state.stdout).expect("crun state JSON");
        let pid = answer["pid"].as_u64().expect("pid") as u32;
        let container = Crun {
            state,
            _bundle: bundle,
            id: id.to_string(),
            pid,
        };
        // Ready once its init has the node open.
        let node = std::path::PathBuf::from(format!("{gpus}/nvidia0"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|link| link == node))
        {
            assert!(
                Instant::now() < deadline,
                "the container never opened {node:?}"
            );
            std::thread::yield_now();
        }
        container
    }

    fn crun(&self, args: &[&str]) {
        let _ = std::process::Command::new("crun")
            .arg("--root")
            .arg(self.state.path())
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

impl Drop for Crun {
    fn drop(&mut self) {
        self.crun(&["kill", &self.id, "KILL"]);
        self.crun(&["delete", "--force", &self.id]);
    }
}
