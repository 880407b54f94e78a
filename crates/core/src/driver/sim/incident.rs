//! Incident builders for the simulated driver: a simulated GPU host and real
//! process trees that hold it the way crashed inference servers hold real
//! GPUs. Part of the simulator, not of the product: only the demo and the
//! tests use it.
//!
//! The demo and the test suite both stage their incidents here, so what the
//! demo shows is what the tests check. Every process is real and holds
//! descriptors on the simulated device nodes. `Incident::new` stages bash
//! and sleep processes, titled with `exec -a` (argv[0] only: their command
//! lines end in sleep's duration); `Incident::with_stand_ins` stages the
//! gpureap binary as stand-ins (`stand_in`) under real command lines, with
//! their own sessions where asked and driver-held memory left behind, as the
//! demo does. Everything an `Incident` started is killed when it is dropped,
//! and nothing else; stand-ins also end by themselves when their stager does.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::stand_in::{OnTerm, Spec};
use crate::proc::{self, ProcessId};
use crate::signal::{Sig, send};

/// What NVML reserves on an H100 80GB (its v2 memory query's `reserved`,
/// counted as used by the v1 query).
pub const H100_RESERVED: u64 = 480 << 20;
/// The same on an H200 (measured with driver 580, docs/gpu-validation.md).
pub const H200_RESERVED: u64 = 616 << 20;

/// A simulated GPU host in a temporary directory, laid out as the simulated
/// driver expects (docs/simulated-driver.md).
pub struct SimHost {
    dir: tempfile::TempDir,
}

impl SimHost {
    /// `count` GPUs of `total` bytes each, named like real ones, with
    /// `DIR/unclaimed-holders`: a process that opens a node with no claim
    /// file at all (`exec 3<"$D/nvidia0"`, as many tests stage one) is
    /// listed, with a 1 GiB context (`claims_only` makes a host without).
    pub fn new(count: u32, total: u64, name: &str) -> io::Result<SimHost> {
        let dir = tempfile::Builder::new().prefix("gpureap-sim-").tempdir()?;
        let mut gpus = String::new();
        for index in 0..count {
            fs::write(dir.path().join(format!("nvidia{index}")), "")?;
            let _ = writeln!(gpus, "{total} {name}");
        }
        fs::write(dir.path().join("nvidiactl"), "")?;
        fs::write(dir.path().join("gpus"), gpus)?;
        fs::create_dir(dir.path().join("claims"))?;
        fs::write(dir.path().join("unclaimed-holders"), "")?;
        Ok(SimHost { dir })
    }

    /// As `new`, without `DIR/unclaimed-holders`: the driver lists only
    /// processes with a claim file, found through `DIR/claims` as NVML
    /// finds its contexts, at a cost that does not grow with the host's
    /// processes. Every holder `Holder` stages has its claims.
    pub fn claims_only(count: u32, total: u64, name: &str) -> io::Result<SimHost> {
        let host = SimHost::new(count, total, name)?;
        fs::remove_file(host.path().join("unclaimed-holders"))?;
        Ok(host)
    }

    /// As `new`, with character devices for nodes (`mknod c 1 3`, the
    /// numbers of /dev/null, mode 0666) as a real host has: what slurmd
    /// requires of a GPU's gres `File=`. Root only; the directory is made
    /// readable by all and `claims` writable by all (sticky), so that jobs
    /// of other users can stage holders.
    pub fn with_char_devices(count: u32, total: u64, name: &str) -> io::Result<SimHost> {
        use std::os::unix::fs::PermissionsExt;
        let host = SimHost::new(count, total, name)?;
        let names = (0..count)
            .map(|index| format!("nvidia{index}"))
            .chain(["nvidiactl".to_string()]);
        for node in names {
            let path = host.path().join(node);
            fs::remove_file(&path)?;
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &path,
                rustix::fs::FileType::CharacterDevice,
                rustix::fs::Mode::from_raw_mode(0o666),
                rustix::fs::makedev(1, 3),
            )?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o666))?;
        }
        fs::set_permissions(host.path(), fs::Permissions::from_mode(0o755))?;
        fs::set_permissions(
            host.path().join("claims"),
            fs::Permissions::from_mode(0o1777),
        )?;
        Ok(host)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The `--backend` value for this host.
    pub fn backend(&self) -> String {
        format!("sim:{}", self.path().display())
    }

    /// Memory held on a GPU by no process: only a reset clears it.
    pub fn leak(&self, gpu: u32, bytes: u64) -> io::Result<()> {
        fs::write(self.path().join(format!("leak.{gpu}")), bytes.to_string())
    }

    /// Declares the memory the driver keeps for its own bookkeeping
    /// (`DIR/bookkeeping`): memory held by no process up to this much is not
    /// called held. Read when the driver opens.
    pub fn declare_bookkeeping(&self, bytes: u64) -> io::Result<()> {
        fs::write(self.path().join("bookkeeping"), bytes.to_string())
    }

    /// Makes a GPU answer as fallen off the bus.
    pub fn lose(&self, gpu: u32) -> io::Result<()> {
        fs::write(self.path().join(format!("lost.{gpu}")), "")
    }

    /// Appends a record to `DIR/kmsg`, the simulated kernel log, in
    /// /dev/kmsg's format: `prio,seq,µs since boot,-;message`.
    pub fn log_kernel(&self, prio: u32, since_boot_us: u64, message: &str) -> io::Result<()> {
        use std::io::Write as _;
        let mut file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path().join("kmsg"))?;
        writeln!(file, "{prio},0,{since_boot_us},-;{message}")
    }

    /// Logs an Xid for a GPU as the kernel does (facility 0, level 3), the
    /// line in the R535+ format, naming the GPU by its simulated PCI address.
    pub fn xid(&self, gpu: u32, xid: u32, since_boot_us: u64, detail: &str) -> io::Result<()> {
        let bus = super::sim_pci_bus_id(gpu);
        let short = crate::driver::evidence::PciAddress::parse(&bus)
            .map(|address| address.to_string())
            .unwrap_or(bus);
        self.log_kernel(
            3,
            since_boot_us,
            &format!("NVRM: Xid (PCI:{short}): {xid}, pid='<unknown>', name=<unknown>, {detail}"),
        )
    }

    /// Declares the memory each GPU sets aside (`DIR/reserved`, a line per
    /// GPU): `H100_RESERVED` or `H200_RESERVED` for a host of those. Read
    /// when the driver opens.
    pub fn reserve(&self, bytes: u64) -> io::Result<()> {
        let count = (0..)
            .take_while(|index| self.path().join(format!("nvidia{index}")).exists())
            .count();
        fs::write(
            self.path().join("reserved"),
            format!("{bytes}\n").repeat(count),
        )
    }

    /// Stages what a GPU is doing (`DIR/activity.N`: `utilization 87`,
    /// `temperature 64`, `power 312.5`, `power_limit 700`, `process_sm PID 41`).
    pub fn activity(&self, gpu: u32, lines: &str) -> io::Result<()> {
        fs::write(self.path().join(format!("activity.{gpu}")), lines)
    }

    /// Stages a GPU's health counters (`DIR/health.N`: `key value` lines).
    pub fn health(&self, gpu: u32, lines: &str) -> io::Result<()> {
        fs::write(self.path().join(format!("health.{gpu}")), lines)
    }
}

/// One process to stage, the way real CUDA processes look: every GPU's
/// device node open (the CUDA runtime opens them all when it starts, as
/// nvidia-smi, DCGM and exporters do), a context only on the GPUs in `gpus`
/// (a `none` claim on every other). With no `gpus`, a monitor.
#[derive(Debug, Clone, Default)]
pub struct Holder {
    pub title: String,
    /// (GPU index, bytes its context uses there): where the driver lists it.
    pub gpus: Vec<(u32, u64)>,
    /// Also open the control node, as every CUDA process and monitor does.
    pub control: bool,
    pub ignore_term: bool,
    /// Bytes of its context on its first GPU that the driver keeps when it
    /// exits on SIGTERM (driver-held memory). Stand-ins only.
    pub keeps: Option<u64>,
    /// Started in a session of its own and re-parented away from the stager,
    /// as a notebook kernel or a service is. Stand-ins only.
    pub own_session: bool,
}

impl Holder {
    pub fn new(title: &str) -> Holder {
        Holder {
            title: title.to_string(),
            control: true,
            ..Holder::default()
        }
    }

    pub fn on(mut self, gpu: u32, bytes: u64) -> Holder {
        self.gpus.push((gpu, bytes));
        self
    }

    pub fn ignoring_sigterm(mut self) -> Holder {
        self.ignore_term = true;
        self
    }

    /// When it exits on SIGTERM, the driver keeps `bytes` of its context on
    /// its first GPU, held by no process. Needs `Incident::with_stand_ins`.
    pub fn leaving_driver_held(mut self, bytes: u64) -> Holder {
        self.keeps = Some(bytes);
        self
    }

    /// Started in a session of its own, not a child of the stager. Needs
    /// `Incident::with_stand_ins`.
    pub fn in_own_session(mut self) -> Holder {
        self.own_session = true;
        self
    }

    /// The stand-in that plays this holder on the host in `dir`; its title
    /// is its command line, split at spaces. A stand-in always opens the
    /// control node too, as every CUDA process and monitor does.
    pub fn spec(&self, dir: &Path) -> Spec {
        let on_term = match (self.ignore_term, self.keeps, self.gpus.first()) {
            (true, _, _) => OnTerm::Ignore,
            (false, Some(bytes), Some(&(gpu, _))) => OnTerm::Keep { gpu, bytes },
            _ => OnTerm::Exit,
        };
        Spec {
            nodes: true,
            gpus: self.gpus.clone(),
            on_term,
            detached: self.own_session,
            ..Spec::new(dir, &self.title)
        }
    }

    /// A bash fragment that runs this holder in the current (sub)shell: writes
    /// the claims, opens the nodes, records its PID, then becomes `sleep`
    /// under its title. `$D` is the simulated host's directory. The claims
    /// come first, so that no scan sees a node open without its claim.
    pub fn script(&self) -> String {
        let mut script = String::new();
        if self.ignore_term {
            script.push_str("trap '' TERM; ");
        }
        const EVERY_NODE: &str = "for node in \"$D\"/nvidia[0-9]*; do";
        let _ = write!(
            script,
            "{EVERY_NODE} echo none > \"$D/claims/$BASHPID.${{node##*/nvidia}}\"; done; "
        );
        for (gpu, bytes) in &self.gpus {
            let _ = write!(script, "echo {bytes} > \"$D/claims/$BASHPID.{gpu}\"; ");
        }
        let _ = write!(script, "{EVERY_NODE} exec {{fd}}<\"$node\"; done; ");
        if self.control {
            script.push_str("exec 9<\"$D/nvidiactl\"; ");
        }
        let _ = write!(
            script,
            "echo \"$BASHPID {title}\" >> \"$D/pids\"; exec -a '{title}' sleep 100000",
            title = self.title
        );
        script
    }
}

/// The launcher's title in `Incident::sglang`.
pub const LAUNCHER: &str = "python3 -m sglang.launch_server";
/// The model on the launcher's command line.
pub const MODEL: &str = "meta-llama/Llama-3.1-70B-Instruct";
/// The detokenizer's title in `Incident::sglang`.
pub const DETOKENIZER: &str = "sglang::detokenizer";

/// The gpureap binary playing the processes, and the lifeline they read.
struct StandIns {
    exe: PathBuf,
    /// The only writer of the stand-ins' stdin: when it closes (this process
    /// ends or the incident is dropped) they read end-of-file and exit.
    _lifeline: io::PipeWriter,
    reader: io::PipeReader,
}

/// Real processes staged on a simulated host. Dropping it SIGKILLs every
/// process it recorded (by identity, so a recycled PID is never hit).
pub struct Incident {
    dir: PathBuf,
    children: Vec<Child>,
    /// Lines of `$D/pids` already waited for.
    expected: usize,
    /// Identities captured as soon as each process was running under its title.
    owned: Vec<ProcessId>,
    stand_ins: Option<StandIns>,
}

impl Incident {
    pub fn new(host: &SimHost) -> Incident {
        Incident {
            dir: host.path().to_path_buf(),
            children: Vec::new(),
            expected: 0,
            owned: Vec::new(),
            stand_ins: None,
        }
    }

    /// An incident whose processes are `exe`, the gpureap binary, as
    /// stand-ins (`stand_in`): real command lines, no stray arguments, own
    /// sessions and driver-held memory where a `Holder` asks for them. Their
    /// errors go to `DIR/stand-ins.log`.
    pub fn with_stand_ins(host: &SimHost, exe: &Path) -> io::Result<Incident> {
        let (reader, lifeline) = io::pipe()?;
        let mut incident = Incident::new(host);
        incident.stand_ins = Some(StandIns {
            exe: exe.to_path_buf(),
            _lifeline: lifeline,
            reader,
        });
        Ok(incident)
    }

    /// Starts a stand-in (and, through it, its children) and returns once
    /// `records` processes more are running under their titles.
    fn spawn_stand_in(&mut self, spec: &Spec, records: usize, own_group: bool) -> io::Result<u32> {
        let stand_ins = self
            .stand_ins
            .as_ref()
            .ok_or_else(|| io::Error::other("this incident stages no stand-ins"))?;
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stand-ins.log"))?;
        let mut command = spec.command(&stand_ins.exe, stand_ins.reader.try_clone()?.into())?;
        command.stderr(log);
        if own_group {
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
        }
        let mut child = command.spawn()?;
        let pid = child.id();
        if spec.detached {
            // It exits as soon as it has started the real one.
            child.wait()?;
        } else {
            self.children.push(child);
        }
        let earlier = self.expected;
        self.expected += records;
        self.wait_ready(earlier)?;
        Ok(pid)
    }

    /// Runs a bash script with `$D` set to the host's directory. `records` is
    /// how many processes the script will record in `$D/pids`; this returns
    /// once all of them are running under their titles.
    pub fn spawn(&mut self, script: &str, records: usize) -> io::Result<u32> {
        self.spawn_in_group(script, records, false)
    }

    /// `spawn`, where `own_group` makes the script lead a process group of
    /// its own, as a job started from an interactive shell does.
    fn spawn_in_group(&mut self, script: &str, records: usize, own_group: bool) -> io::Result<u32> {
        let mut command = Command::new("bash");
        if own_group {
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
        }
        let child = command
            .arg("-c")
            .arg(script)
            .env("D", &self.dir)
            .stdin(Stdio::null())
            // bash reports its killed jobs on stderr: noise here, by design.
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let pid = child.id();
        self.children.push(child);
        let earlier = self.expected;
        self.expected += records;
        self.wait_ready(earlier)?;
        Ok(pid)
    }

    /// Starts one holder: with bash, a direct child of the calling process;
    /// as a stand-in, one too unless it is `in_own_session`.
    pub fn holder(&mut self, holder: &Holder) -> io::Result<u32> {
        if self.stand_ins.is_some() {
            let spec = holder.spec(&self.dir);
            self.spawn_stand_in(&spec, 1, false)?;
        } else {
            if holder.keeps.is_some() || holder.own_session {
                return Err(io::Error::other(format!(
                    "{}: driver-held memory and own sessions need Incident::with_stand_ins",
                    holder.title
                )));
            }
            self.spawn(&holder.script(), 1)?;
        }
        self.pid_of(&holder.title)
    }

    /// An SGLang-like server: a launcher (`python3 -m sglang.launch_server`)
    /// with one `sglang::scheduler_TP{i}` worker per GPU and a detokenizer
    /// that holds no GPU, all in the launcher's process group, which it leads
    /// as a job started from a shell does. Returns the launcher's PID.
    pub fn sglang(&mut self, workers: &[Holder]) -> io::Result<u32> {
        if self.stand_ins.is_some() {
            let mut children: Vec<Spec> = workers
                .iter()
                .map(|worker| Spec {
                    detached: false,
                    ..worker.spec(&self.dir)
                })
                .collect();
            children.push(Spec::new(&self.dir, DETOKENIZER));
            let launcher = Spec {
                record: LAUNCHER.to_string(),
                children,
                ..Spec::new(
                    &self.dir,
                    &format!("{LAUNCHER} --model-path {MODEL} --tp {}", workers.len()),
                )
            };
            return self.spawn_stand_in(&launcher, workers.len() + 2, true);
        }
        let mut script = format!("echo \"$$ {LAUNCHER}\" >> \"$D/pids\"; ");
        for worker in workers {
            let _ = write!(script, "( {} ) & ", worker.script());
        }
        let _ = write!(
            script,
            "( echo \"$BASHPID {DETOKENIZER}\" >> \"$D/pids\"; exec -a '{DETOKENIZER}' sleep 100000 ) & ",
        );
        let _ = write!(
            script,
            "exec -a '{LAUNCHER} --model-path {MODEL} --tp {}' sleep 100000",
            workers.len()
        );
        self.spawn_in_group(&script, workers.len() + 2, true)
    }

    /// SIGKILLs a process this incident started, and reaps it if it is our
    /// child: the way a launcher dies and leaves its workers orphaned.
    pub fn kill(&mut self, pid: u32) -> io::Result<()> {
        let id = self
            .owned
            .iter()
            .find(|id| id.pid == pid)
            .copied()
            .ok_or_else(|| {
                io::Error::other(format!("pid {pid} was not started by this incident"))
            })?;
        send(id, Sig::Kill);
        if let Some(position) = self.children.iter().position(|child| child.id() == pid) {
            self.children.remove(position).wait()?;
        }
        Ok(())
    }

    /// The PID recorded under a title.
    pub fn pid_of(&self, title: &str) -> io::Result<u32> {
        self.records()?
            .into_iter()
            .rev()
            .find(|(_, recorded)| recorded == title)
            .map(|(pid, _)| pid)
            .ok_or_else(|| io::Error::other(format!("no process titled {title}")))
    }

    /// Every (PID, title) recorded so far, in order.
    pub fn records(&self) -> io::Result<Vec<(u32, String)>> {
        Ok(records_in(&self.dir))
    }

    /// Waits until every expected record is there and each process recorded
    /// after the first `earlier` runs under its title (its `exec -a` has
    /// happened), then remembers who they are. Earlier records were checked
    /// before, and their PIDs may belong to other processes by now.
    fn wait_ready(&mut self, earlier: usize) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let records = self.records()?;
            let ready = records.len() >= self.expected
                && records.iter().skip(earlier).all(|(pid, title)| {
                    // Gone already (a zombie child, a killed worker) counts as settled; an
                    // empty command line alone does not: it is also what an exec in progress shows.
                    runs_as(*pid, title)
                        || proc::identity(*pid)
                            .and_then(proc::state_of)
                            .is_none_or(proc::State::has_exited)
                });
            if ready {
                for (pid, title) in records {
                    if let Some(id) = titled(pid, &title)
                        && !self.owned.contains(&id)
                    {
                        self.owned.push(id);
                    }
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = fs::read_to_string(self.dir.join("stand-ins.log")).unwrap_or_default();
                return Err(io::Error::other(format!(
                    "staged processes did not start within 20s: {records:?}{}{}",
                    if log.is_empty() {
                        ""
                    } else {
                        "; stand-ins said: "
                    },
                    log.trim()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Whether `pid`'s command line, its arguments joined by spaces, starts with `title`.
fn runs_as(pid: u32, title: &str) -> bool {
    proc::cmdline(pid).starts_with(title)
}

/// The identity of `pid` if it still runs under `title`.
fn titled(pid: u32, title: &str) -> Option<ProcessId> {
    let id = proc::identity(pid)?;
    runs_as(pid, title).then_some(id)
}

/// SIGKILLs every process recorded in `DIR/pids` that still runs under its
/// title, until none is left: what a stager that is being interrupted (and
/// cannot reach its `Incident`) does before it exits. Stand-ins not recorded
/// yet end by themselves when the stager exits (their lifeline).
pub fn kill_recorded(dir: &Path) {
    kill_until_gone(dir, &[]);
}

/// SIGKILLs `owned` and every process recorded in `DIR/pids` that still runs
/// under its title, until a pass finds nothing alive: a parent killed in one
/// pass may have respawned a worker just before. Processes recorded after
/// the last wait are only killed while they still carry their title, so a
/// recycled PID is never hit.
fn kill_until_gone(dir: &Path, owned: &[ProcessId]) {
    for _ in 0..100 {
        let late = records_in(dir)
            .into_iter()
            .filter_map(|(pid, title)| titled(pid, &title));
        let alive: Vec<ProcessId> = owned
            .iter()
            .copied()
            .chain(late)
            .filter(|id| proc::state_of(*id).is_some_and(|state| !state.has_exited()))
            .collect();
        if alive.is_empty() {
            break;
        }
        for id in alive {
            send(id, Sig::Kill);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every (PID, title) recorded in `DIR/pids`, in order.
fn records_in(dir: &Path) -> Vec<(u32, String)> {
    let text = fs::read_to_string(dir.join("pids")).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (pid, title) = line.split_once(' ')?;
            Some((pid.parse().ok()?, title.to_string()))
        })
        .collect()
}

impl Drop for Incident {
    fn drop(&mut self) {
        kill_until_gone(&self.dir, &self.owned);
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_becomes_the_stand_in_that_plays_it() {
        let dir = Path::new("/sim");
        let spec = Holder::new("python3 -m ipykernel_launcher -f k.json")
            .on(3, 6 << 30)
            .in_own_session()
            .spec(dir);
        assert_eq!(
            spec.argv,
            ["python3", "-m", "ipykernel_launcher", "-f", "k.json"]
        );
        assert_eq!(spec.record, "python3 -m ipykernel_launcher -f k.json");
        assert_eq!(spec.gpus, [(3, 6 << 30)]);
        assert!(spec.nodes && spec.detached && !spec.new_session);
        assert_eq!(spec.on_term, OnTerm::Exit);

        let keeper = Holder::new("sglang::scheduler_TP3")
            .on(3, 100)
            .leaving_driver_held(92);
        assert_eq!(keeper.spec(dir).on_term, OnTerm::Keep { gpu: 3, bytes: 92 });
        // Ignoring SIGTERM means it never exits on it, so nothing is left behind then.
        assert_eq!(keeper.ignoring_sigterm().spec(dir).on_term, OnTerm::Ignore);
        // A monitor has no context to leave behind.
        assert_eq!(
            Holder::new("nvidia-smi")
                .leaving_driver_held(92)
                .spec(dir)
                .on_term,
            OnTerm::Exit
        );
    }

    #[test]
    fn bash_incidents_refuse_what_only_stand_ins_can_do() {
        let host = SimHost::new(1, 1 << 30, "Simulated").expect("host");
        let mut incident = Incident::new(&host);
        for holder in [
            Holder::new("a").on(0, 1).leaving_driver_held(1),
            Holder::new("b").in_own_session(),
        ] {
            let error = incident.holder(&holder).expect_err("refused");
            assert!(error.to_string().contains("with_stand_ins"), "{error}");
        }
        assert!(incident.records().expect("records").is_empty());
    }
}
