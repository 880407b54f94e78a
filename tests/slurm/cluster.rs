//! A real single-host Slurm cluster for the tests of `gpureap slurm`: munged,
//! slurmctld and slurmd, started by this test process, one per process.
//!
//! Everything lives in one temporary directory (state, spool, logs, the
//! munge socket and key, slurm.conf, gres.conf) with a cluster name, node
//! name and ports of its own, so that other clusters on the host are not
//! disturbed. gres.conf points at a simulated GPU host whose device nodes
//! are character devices, as slurmd requires. Prolog= and Epilog= run the
//! gpureap binary under test against that host, after sourcing DIR/prolog.env
//! or DIR/epilog.env where a test wrote one (to change what slurmd set).
//!
//! The daemons are stopped by PID when the test process ends, however it
//! ends: a watchdog (bash) holds the read end of a pipe whose write end only
//! this process has; when it closes, the watchdog kills exactly the PIDs it
//! was given (each checked against its recorded start time first) and
//! removes the directory.

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::SimHost;

pub const SCONTROL: &str = "/usr/bin/scontrol";
const SBATCH: &str = "/usr/bin/sbatch";
const SQUEUE: &str = "/usr/bin/squeue";
const SLURMCTLD: &str = "/usr/sbin/slurmctld";
const SLURMD: &str = "/usr/sbin/slurmd";
const MUNGED: &str = "/usr/sbin/munged";

pub const GPUS: u32 = 2;

pub struct Cluster {
    pub dir: PathBuf,
    pub node: String,
    pub sim: SimHost,
    /// Held for the life of the process: when it closes, the watchdog
    /// stops the daemons.
    _watchdog: Mutex<ChildStdin>,
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
/// The tests share one node: one at a time.
static TURN: Mutex<()> = Mutex::new(());

/// The cluster, started on first use, and this test's turn on it. Panics,
/// saying what is missing, when it cannot be started.
pub fn cluster() -> (&'static Cluster, MutexGuard<'static, ()>) {
    let turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match CLUSTER.get_or_init(Cluster::start) {
        Ok(cluster) => {
            cluster.reset();
            (cluster, turn)
        }
        Err(why) => panic!("no Slurm test cluster: {why}"),
    }
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|error| format!("cannot find a free port: {error}"))
}

fn io(what: &str) -> impl Fn(std::io::Error) -> String + '_ {
    move |error| format!("{what}: {error}")
}

/// The start time of a process (field 22 of /proc/PID/stat).
fn start_time(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(19)
        .map(str::to_string)
}

impl Cluster {
    fn start() -> Result<Cluster, String> {
        let missing: Vec<&str> = [
            SCONTROL,
            SBATCH,
            SQUEUE,
            SLURMCTLD,
            SLURMD,
            MUNGED,
            "/usr/bin/setpriv",
        ]
        .into_iter()
        .filter(|path| !Path::new(path).exists())
        .collect();
        if !missing.is_empty() {
            return Err(format!(
                "missing {}: install the Debian packages slurmctld slurmd slurm-client munge \
                 util-linux (.ci/run does)",
                missing.join(", ")
            ));
        }
        if !rustix::process::geteuid().is_root() {
            return Err(
                "the Slurm tests run as root (slurmd, mknod); run cargo test as root".into(),
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("gpureap-slurm-")
            .tempdir()
            .map_err(io("cannot create a temporary directory"))?
            .keep();
        let result = Cluster::start_in(&dir);
        if result.is_err() {
            let _ = fs::remove_dir_all(&dir);
        }
        result
    }

    fn start_in(dir: &Path) -> Result<Cluster, String> {
        let dir = dir.to_path_buf();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
            .map_err(io("cannot chmod the cluster directory"))?;
        let node = format!("gpureap{}", std::process::id());
        let sim = SimHost::with_char_devices(GPUS, 80 << 30, "NVIDIA H200 (simulated)")
            .map_err(io("cannot create the simulated GPU host"))?;
        // Jobs of any user record their holders here (Holder::script).
        fs::write(sim.path().join("pids"), "").map_err(io("pids"))?;
        fs::set_permissions(sim.path().join("pids"), fs::Permissions::from_mode(0o666))
            .map_err(io("pids"))?;

        // The watchdog first, so that whatever starts next is stopped too.
        let mut watchdog = Watchdog::start(&dir, sim.path())?;
        // munge: its own key, socket and files, run as the munge user.
        let munge = dir.join("munge");
        fs::create_dir(&munge).map_err(io("munge dir"))?;
        let mut key = vec![0u8; 1024];
        fs::File::open("/dev/urandom")
            .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut key))
            .map_err(io("/dev/urandom"))?;
        fs::write(munge.join("key"), key).map_err(io("munge key"))?;
        fs::set_permissions(munge.join("key"), fs::Permissions::from_mode(0o600))
            .map_err(io("munge key"))?;
        let chown = Command::new("chown")
            .args(["-R", "munge:munge"])
            .arg(&munge)
            .status()
            .map_err(io("chown"))?;
        if !chown.success() {
            return Err("cannot give the munge directory to user munge".into());
        }
        let munged = Command::new("/usr/bin/setpriv")
            .args([
                "--reuid=munge",
                "--regid=munge",
                "--clear-groups",
                MUNGED,
                "-F",
            ])
            .arg(format!("--key-file={}", munge.join("key").display()))
            .arg(format!("--socket={}", munge.join("socket").display()))
            .arg(format!("--pid-file={}", munge.join("pid").display()))
            .arg(format!("--seed-file={}", munge.join("seed").display()))
            .arg(format!("--log-file={}", munge.join("log").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.join("munged.out")).map_err(io("munged.out"))?)
            .spawn()
            .map_err(io("cannot start munged"))?;
        watchdog.add(munged.id())?;
        wait_for(Duration::from_secs(10), || munge.join("socket").exists())
            .map_err(|()| format!("munged did not start: {}", tail(&dir.join("munged.out"))))?;

        let host = fs::read_to_string("/proc/sys/kernel/hostname")
            .map_err(io("hostname"))?
            .trim()
            .to_string();
        let (ctld_port, d_port) = (free_port()?, free_port()?);
        let gpureap = env!("CARGO_BIN_EXE_gpureap");
        let backend = sim.backend();
        for hook in ["prolog", "epilog"] {
            let path = dir.join(hook);
            fs::write(
                &path,
                format!(
                    "#!/bin/sh\n[ -r {env} ] && . {env}\nexec {gpureap} --backend {backend} slurm {hook} --scontrol {SCONTROL} --log {log} 2>>{err}\n",
                    env = dir.join(format!("{hook}.env")).display(),
                    log = dir.join("audit.jsonl").display(),
                    err = dir.join(format!("{hook}.err")).display(),
                ),
            )
            .map_err(io("hook script"))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).map_err(io("chmod"))?;
        }
        let mut conf = String::new();
        let d = dir.display();
        let _ = write!(
            conf,
            "ClusterName={node}\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={ctld_port}\nSlurmdPort={d_port}\n\
             SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nAuthInfo=socket={d}/munge/socket\nCredType=cred/munge\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\nSlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\nSchedulerType=sched/builtin\nSelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\nGresTypes=gpu\nReturnToService=2\nMpiDefault=none\n\
             Prolog={d}/prolog\nEpilog={d}/epilog\nPrologEpilogTimeout=120\n\
             NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=2 Gres=gpu:{GPUS} State=UNKNOWN\n\
             PartitionName=gpureap Nodes={node} Default=YES MaxTime=INFINITE State=UP\n"
        );
        fs::write(dir.join("slurm.conf"), conf).map_err(io("slurm.conf"))?;
        fs::write(
            dir.join("gres.conf"),
            format!(
                "Name=gpu File={}/nvidia[0-{}]\n",
                sim.path().display(),
                GPUS - 1
            ),
        )
        .map_err(io("gres.conf"))?;
        for sub in ["state", "spool"] {
            fs::create_dir(dir.join(sub)).map_err(io(sub))?;
        }
        for (program, args, out) in [
            (SLURMCTLD, vec!["-D"], "slurmctld.out"),
            (SLURMD, vec!["-D", "-N", node.as_str()], "slurmd.out"),
        ] {
            let child = Command::new(program)
                .args(&args)
                .arg("-f")
                .arg(dir.join("slurm.conf"))
                .env("SLURM_CONF", dir.join("slurm.conf"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(fs::File::create(dir.join(out)).map_err(io(out))?)
                .spawn()
                .map_err(io("cannot start a Slurm daemon"))?;
            watchdog.add(child.id())?;
        }
        let cluster = Cluster {
            dir: dir.clone(),
            node,
            sim,
            _watchdog: Mutex::new(watchdog.arm()?),
        };
        wait_for(Duration::from_secs(30), || {
            cluster
                .node_state()
                .is_some_and(|(state, _)| state == "IDLE")
        })
        .map_err(|()| {
            format!(
                "the node did not become idle in 30s: {}\n{}",
                tail(&dir.join("slurmctld.out")),
                tail(&dir.join("slurmd.out"))
            )
        })?;
        Ok(cluster)
    }

    pub fn conf(&self) -> PathBuf {
        self.dir.join("slurm.conf")
    }

    /// A Slurm client command with this cluster's configuration.
    pub fn client(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.env("SLURM_CONF", self.conf()).stdin(Stdio::null());
        command
    }

    pub fn scontrol(&self, args: &[&str]) -> String {
        let output = self
            .client(SCONTROL)
            .args(args)
            .output()
            .expect("scontrol runs");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `State=` and `Reason=` of the node (the reason without Slurm's `[user@time]`).
    /// The node's drain reason, once it is drained (within 20 s; panics if it is not).
    pub fn drain_reason(&self) -> Option<String> {
        let mut last = None;
        let drained = wait_for(Duration::from_secs(20), || {
            last = self.node_state();
            last.as_ref()
                .is_some_and(|(state, _)| state.contains("DRAIN"))
        });
        assert!(drained.is_ok(), "node not drained: {last:?}");
        last.and_then(|(_, reason)| reason)
    }

    pub fn node_state(&self) -> Option<(String, Option<String>)> {
        let text = self.scontrol(&["-o", "show", "node", &self.node]);
        let state = text
            .split_whitespace()
            .find_map(|token| token.strip_prefix("State="))?
            .to_string();
        let reason = text.find(" Reason=").map(|at| {
            let reason = text[at + " Reason=".len()..].trim_end();
            reason
                .rfind(" [")
                .map_or(reason, |cut| &reason[..cut])
                .to_string()
        });
        Some((state, reason))
    }

    /// Submits a batch job; its id. `env` is added to the job's environment.
    pub fn sbatch(&self, options: &[&str], script: &str) -> u64 {
        let path = self.dir.join(format!("job-{}.sh", unique()));
        fs::write(&path, format!("#!/bin/bash\n{script}\n")).expect("job script");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
        let output = self
            .client(SBATCH)
            .args([
                "--parsable",
                "-w",
                &self.node,
                "-o",
                "/dev/null",
                "-e",
                "/dev/null",
            ])
            .args(options)
            .arg(&path)
            .env("D", self.sim.path())
            .current_dir("/")
            .output()
            .expect("sbatch runs");
        let text = String::from_utf8_lossy(&output.stdout);
        text.trim()
            .split(';')
            .next()
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "sbatch failed: {}{}",
                    text,
                    String::from_utf8_lossy(&output.stderr)
                )
            })
    }

    /// The audit lines of one job, parsed.
    pub fn audit(&self, job: u64) -> Vec<serde_json::Value> {
        fs::read_to_string(self.dir.join("audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|line| line["job"] == job)
            .collect()
    }

    /// Waits until the job's `command` (prolog or epilog) has logged its
    /// last decision; those lines.
    pub fn wait_for_hook(&self, job: u64, command: &str) -> Vec<serde_json::Value> {
        let done = |lines: &[serde_json::Value]| {
            lines.iter().any(|line| {
                line["command"] == command
                    && ["clean", "drain", "skip", "error"]
                        .iter()
                        .any(|action| line["action"] == *action)
            })
        };
        let _ = wait_for(Duration::from_secs(90), || done(&self.audit(job)));
        let lines = self.audit(job);
        assert!(
            done(&lines),
            "job {job}: the {command} logged no verdict in 90s; audit: {lines:#?}\n{command}.err: {}\nslurmd: {}",
            tail(&self.dir.join(format!("{command}.err"))),
            tail(&self.dir.join("slurmd.log")),
        );
        lines
            .into_iter()
            .filter(|line| line["command"] == command)
            .collect()
    }

    /// The job's state, from squeue (scontrol writes the job's name, which
    /// may hold `JobState=`, before its state).
    pub fn job_state(&self, job: u64) -> String {
        let output = self
            .client(SQUEUE)
            .args(["-h", "--states=all", "-j", &job.to_string(), "-o", "%T"])
            .output()
            .expect("squeue runs");
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// Back to a clean, idle node between tests: no leaks, no drain, no jobs.
    fn reset(&self) {
        // What an earlier test's jobs staged and nothing freed (a failed
        // test's escaped worker) goes first: it would hold a GPU here.
        gpureap_core::driver::sim::incident::kill_recorded(self.sim.path());
        // What a test set in slurmd's hooks' environment (HOOK.env).
        for hook in ["prolog", "epilog"] {
            let _ = fs::remove_file(self.dir.join(format!("{hook}.env")));
        }
        // Incidents count the lines of this file: each test starts it afresh.
        let _ = fs::write(self.sim.path().join("pids"), "");
        for index in 0..GPUS {
            let _ = fs::remove_file(self.sim.path().join(format!("leak.{index}")));
            let _ = fs::remove_file(self.sim.path().join(format!("health.{index}")));
            // MIG staged by a test (docs/mig.md), and memory on its instances.
            let _ = fs::remove_file(self.sim.path().join(format!("mig.{index}")));
            for instance in 0..8 {
                let _ = fs::remove_file(self.sim.path().join(format!("leak.{index}.{instance}")));
            }
        }
        // The simulated kernel log: an earlier test's Xids would drain here.
        let _ = fs::remove_file(self.sim.path().join("kmsg"));
        let _ = fs::remove_file(self.sim.path().join("bookkeeping"));
        let _ = self
            .client("/usr/bin/scancel")
            .args(["--partition", "gpureap"])
            .status();
        let _ = self.scontrol(&["update", &format!("nodename={}", self.node), "state=resume"]);
        // An epilog of the last test's job that ends after the resume (on a
        // loaded machine) drains the node again: resumed until it stays idle.
        let mut polls = 0u32;
        let idle = wait_for(Duration::from_secs(60), || match self.node_state() {
            Some((state, _)) if state == "IDLE" => true,
            // Once a second (a poll is 50 ms), not at every look.
            Some((state, _)) if state.contains("DRAIN") && !state.contains("COMPLETING") => {
                polls += 1;
                if !polls.is_multiple_of(20) {
                    return false;
                }
                let _ =
                    self.scontrol(&["update", &format!("nodename={}", self.node), "state=resume"]);
                false
            }
            _ => false,
        });
        assert!(
            idle.is_ok(),
            "the test node did not come back to IDLE: {:?}",
            self.node_state()
        );
    }
}

/// Waits until `ready` holds, polling; `Err` after `limit`.
pub fn wait_for(limit: Duration, mut ready: impl FnMut() -> bool) -> Result<(), ()> {
    let deadline = Instant::now() + limit;
    loop {
        if ready() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "{}:\n{}",
        path.display(),
        lines[lines.len().saturating_sub(15)..].join("\n")
    )
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The bash process that stops the daemons when this process's end of its
/// stdin closes. PIDs are handed over as `PID START_TIME` lines before
/// `arm`; after that, EOF is the signal.
struct Watchdog {
    stdin: ChildStdin,
}

const WATCHDOG: &str = r#"
pids=()
while read -r pid start; do
    [ "$pid" = go ] && break
    pids+=("$pid:$start")
done
cat >/dev/null
alive() { [ "$(cut -d' ' -f22 "/proc/$1/stat" 2>/dev/null)" = "$2" ]; }
for entry in "${pids[@]}"; do alive "${entry%%:*}" "${entry##*:}" && kill -TERM "${entry%%:*}"; done
for _ in $(seq 50); do
    left=0
    for entry in "${pids[@]}"; do alive "${entry%%:*}" "${entry##*:}" && left=1; done
    [ $left = 0 ] && break
    sleep 0.1
done
for entry in "${pids[@]}"; do alive "${entry%%:*}" "${entry##*:}" && kill -KILL "${entry%%:*}"; done
rm -rf -- "$1" "$2"
"#;

impl Watchdog {
    fn start(dir: &Path, sim: &Path) -> Result<Watchdog, String> {
        let mut command = Command::new("/bin/bash");
        command
            .arg("-c")
            .arg(WATCHDOG)
            .arg("watchdog")
            .arg(dir)
            .arg(sim)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Its own group: a ^C to the test run reaches the daemons, not
        // the watchdog, which then cleans up what is left.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command.spawn().map_err(io("cannot start the watchdog"))?;
        let stdin = child.stdin.take().ok_or("the watchdog has no stdin")?;
        Ok(Watchdog { stdin })
    }

    fn add(&mut self, pid: u32) -> Result<(), String> {
        let start = start_time(pid).ok_or(format!("pid {pid} ended at once"))?;
        writeln!(self.stdin, "{pid} {start}").map_err(io("watchdog"))
    }

    fn arm(mut self) -> Result<ChildStdin, String> {
        writeln!(self.stdin, "go").map_err(io("watchdog"))?;
        Ok(self.stdin)
    }
}
