//! A lab of real ssh hosts on this machine, for the fleet tests: each host
//! is a network namespace (its own address, reached over a veth pair) whose
//! `/usr/sbin/sshd` runs in a PID, mount and UTS namespace of its own, so
//! that a gpureap run over ssh sees only that host's processes, with its
//! own simulated driver (`SetEnv GPUREAP_BACKEND=sim:DIR`).
//!
//! Host keys are checked for real: the client config names a test
//! known_hosts, and a host left out of it must be refused. Needs root,
//! iproute2, util-linux's unshare and openssh-server (`.ci/run` installs
//! them). Everything is torn down by PID and by name on drop: the sshd's
//! namespace init is killed (which ends every process of that host), then
//! the network namespace is deleted.

use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use gpureap_core::driver::sim::incident::{Holder, SimHost};

use crate::harness::{GIB, Run};

static LABS: AtomicU32 = AtomicU32::new(0);

/// Each host has its own, empty /usr/local, /var/lib and /root (tmpfs in
/// its mount namespace): what `push` installs on one host is not on the
/// others, nor on this machine.
const PRIVATE_DIRS: &str =
    "mount -t tmpfs lab /usr/local && mount -t tmpfs lab /var/lib && mount -t tmpfs lab /root";

pub struct LabHost {
    pub name: String,
    pub address: String,
    pub sim: SimHost,
    netns: String,
    /// `unshare … sshd`, whose child is the host's PID 1.
    server: Option<Child>,
}

pub struct Lab {
    pub dir: tempfile::TempDir,
    pub hosts: Vec<LabHost>,
}

/// How a host is set up.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// sshd running, its key in known_hosts.
    Up,
    /// No sshd: connections are refused.
    Refusing,
    /// sshd running, its key not in known_hosts.
    UnknownKey,
}

fn sh(program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .status()
        .unwrap_or_else(|error| panic!("{program} {args:?}: {error}"));
    assert!(status.success(), "{program} {args:?} failed: {status}");
}

fn require(path: &str, package: &str) {
    assert!(
        Path::new(path).exists(),
        "the fleet tests need {path}: install {package} (.ci/run does)"
    );
}

impl Lab {
    /// One host per entry, named h1, h2, ….
    pub fn new(kinds: &[Kind]) -> Lab {
        assert!(
            rustix::process::geteuid().is_root(),
            "the fleet tests make network namespaces: run them as root"
        );
        require("/usr/sbin/sshd", "openssh-server");
        require("/usr/bin/ssh", "openssh-client");
        require("/usr/bin/ssh-keygen", "openssh-client");
        fs::create_dir_all("/run/sshd").expect("sshd's privilege separation directory");
        let lab = LABS.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let dir = tempfile::Builder::new()
            .prefix("gpureap-lab-")
            .tempdir()
            .expect("lab dir");
        let path = dir.path().to_path_buf();
        keygen(&path.join("client"));
        fs::copy(path.join("client.pub"), path.join("authorized_keys")).expect("authorized_keys");
        let mut known_hosts = String::new();
        let mut config = format!(
            "Host *\n  User root\n  IdentityFile {dir}/client\n  IdentitiesOnly yes\n  UserKnownHostsFile {dir}/known_hosts\n  GlobalKnownHostsFile /dev/null\n  LogLevel ERROR\n",
            dir = path.display()
        );
        let mut hosts = Vec::new();
        for (index, kind) in kinds.iter().enumerate() {
            let name = format!("h{}", index + 1);
            // Unique per test process and lab: 10.A.B.C/30, A from the PID.
            let slot = lab * 16 + index as u32;
            let (a, b, c) = (100 + pid % 100, slot / 64, (slot % 64) * 4);
            let root_address = format!("10.{a}.{b}.{}", c + 1);
            let address = format!("10.{a}.{b}.{}", c + 2);
            let netns = format!("grl{pid}-{lab}-{index}");
            let (outer, inner) = (format!("grl{pid}x{slot}a"), format!("grl{pid}x{slot}b"));
            sh("ip", &["netns", "add", &netns]);
            sh(
                "ip",
                &[
                    "link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns", &netns,
                ],
            );
            sh(
                "ip",
                &["addr", "add", &format!("{root_address}/30"), "dev", &outer],
            );
            sh("ip", &["link", "set", &outer, "up"]);
            sh(
                "ip",
                &[
                    "-n",
                    &netns,
                    "addr",
                    "add",
                    &format!("{address}/30"),
                    "dev",
                    &inner,
                ],
            );
            sh("ip", &["-n", &netns, "link", "set", &inner, "up"]);
            sh("ip", &["-n", &netns, "link", "set", "lo", "up"]);
            let sim = SimHost::new(2, 80 * GIB, "NVIDIA H100 80GB HBM3").expect("sim host");
            let host_dir = path.join(&name);
            fs::create_dir(&host_dir).expect("host dir");
            keygen(&host_dir.join("hostkey"));
            config.push_str(&format!(
                "Host {name}\n  HostName {address}\n  HostKeyAlias {name}\n"
            ));
            if *kind == Kind::Up {
                let key = fs::read_to_string(host_dir.join("hostkey.pub")).expect("host key");
                let key: Vec<&str> = key.split_whitespace().take(2).collect();
                known_hosts.push_str(&format!("{name} {}\n", key.join(" ")));
            }
            let server = (*kind != Kind::Refusing).then(|| {
                let sshd_config = host_dir.join("sshd_config");
                fs::write(
                    &sshd_config,
                    format!(
                        "ListenAddress {address}\nHostKey {hostdir}/hostkey\nAuthorizedKeysFile {dir}/authorized_keys\nStrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\nPidFile none\nSetEnv GPUREAP_BACKEND={backend} PATH=/usr/bin:/bin:/usr/sbin:/sbin\nMaxStartups 100\nMaxSessions 100\n",
                        hostdir = host_dir.display(),
                        dir = path.display(),
                        backend = sim.backend(),
                    ),
                )
                .expect("sshd_config");
                let log = fs::File::create(host_dir.join("sshd.log")).expect("sshd log");
                let mut command = Command::new("ip");
                command
                    .args(["netns", "exec", &netns])
                    .args(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts"])
                    .args(["sh", "-c"])
                    .arg(format!(
                        "hostname {name} && {private} && exec /usr/sbin/sshd -D -e -f {}",
                        sshd_config.display(),
                        private = PRIVATE_DIRS
                    ))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log);
                // If this test process dies, so does the host.
                unsafe {
                    command.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                        Ok(())
                    });
                }
                command.spawn().expect("sshd starts")
            });
            hosts.push(LabHost {
                name,
                address,
                sim,
                netns,
                server,
            });
        }
        fs::write(path.join("known_hosts"), known_hosts).expect("known_hosts");
        fs::write(path.join("ssh_config"), config).expect("ssh_config");
        let lab = Lab { dir, hosts };
        for host in &lab.hosts {
            if host.server.is_some() {
                lab.wait_listening(host);
            }
        }
        lab
    }

    fn wait_listening(&self, host: &LabHost) {
        let address: SocketAddr = format!("{}:22", host.address).parse().expect("address");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "sshd of {} did not listen within 10s: {}",
                host.name,
                fs::read_to_string(self.path().join(&host.name).join("sshd.log"))
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn host(&self, name: &str) -> &LabHost {
        self.hosts
            .iter()
            .find(|host| host.name == name)
            .unwrap_or_else(|| panic!("no host {name} in the lab"))
    }

    /// `--ssh` for gpureap: ssh with the lab's client config.
    pub fn ssh(&self) -> String {
        format!("ssh -F {}", self.path().join("ssh_config").display())
    }

    /// gpureap on this machine, the lab's ssh, the hosts running the same binary.
    pub fn gpureap(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gpureap"));
        command
            .env_remove("GPUREAP_BACKEND")
            .env("GPUREAP_SSH", self.ssh())
            .stdin(Stdio::null());
        command
    }

    /// Runs gpureap with `args` as given.
    pub fn run_as_given(&self, args: &[&str]) -> Run {
        self.gpureap()
            .args(args)
            .output()
            .expect("gpureap runs")
            .into()
    }

    /// Runs gpureap with `args`, then `--remote-bin` this build.
    pub fn run(&self, args: &[&str]) -> Run {
        let mut args = args.to_vec();
        args.extend(["--remote-bin", env!("CARGO_BIN_EXE_gpureap")]);
        self.run_as_given(&args)
    }

    /// Runs a shell command on a host over ssh.
    pub fn on(&self, host: &str, script: &str) -> Run {
        Command::new("ssh")
            .args(["-F", &self.path().join("ssh_config").display().to_string()])
            .args(["-o", "BatchMode=yes", host, script])
            .stdin(Stdio::null())
            .output()
            .expect("ssh runs")
            .into()
    }

    /// Starts a holder on a host, in its own session there (as a detached
    /// job would be), and waits until it runs under its title. Returns its
    /// PID on that host.
    pub fn hold(&self, host: &str, holder: &Holder) -> u32 {
        self.hold_script(host, &holder.title, &holder.script())
    }

    /// `hold` for any script that records itself under `title` in `$D/pids`
    /// and runs under a command line that starts with it.
    pub fn hold_script(&self, host: &str, title: &str, script: &str) -> u32 {
        let sim = self.host(host).sim.path().to_path_buf();
        let before = records(&sim).len();
        let script = script.replace('\'', "'\\''");
        let launched = self.on(
            host,
            &format!(
                "D={} setsid bash -c '{script}' </dev/null >/dev/null 2>&1 &",
                sim.display()
            ),
        );
        assert_eq!(launched.code, 0, "staging on {host}: {}", launched.stderr);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let records = records(&sim);
            if let Some((pid, _)) = records.iter().skip(before).find(|(_, t)| t == title) {
                // Running under its title there once its cmdline says so.
                let check = self.on(host, &format!("tr '\\0' ' ' </proc/{pid}/cmdline"));
                if check.stdout.starts_with(title) {
                    return *pid;
                }
            }
            assert!(Instant::now() < deadline, "{host}: holder did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops a host's sshd (SIGSTOP): it accepts connections and says nothing.
    pub fn freeze(&self, host: &str) {
        let server = self.host(host).server.as_ref().expect("a host with sshd");
        let children = fs::read_to_string(format!(
            "/proc/{}/task/{}/children",
            server.id(),
            server.id()
        ))
        .expect("unshare's child");
        for child in children.split_whitespace() {
            sh("kill", &["-STOP", child]);
        }
    }
}

/// What the holders staged on a host recorded in its `$D/pids`: each
/// one's PID there and its title, in the order they started.
pub fn records(sim: &Path) -> Vec<(u32, String)> {
    fs::read_to_string(sim.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (pid, title) = line.split_once(' ')?;
            Some((pid.parse().ok()?, title.to_string()))
        })
        .collect()
}

fn keygen(path: &Path) {
    sh(
        "ssh-keygen",
        &[
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "gpureap-lab",
            "-f",
            &path.display().to_string(),
        ],
    );
}

impl Drop for Lab {
    fn drop(&mut self) {
        for host in &mut self.hosts {
            if let Some(mut server) = host.server.take() {
                // unshare --kill-child: its child, the host's PID 1, dies with
                // it, and with that every process of the host.
                let _ = server.kill();
                let _ = server.wait();
            }
            let _ = Command::new("ip")
                .args(["netns", "del", &host.netns])
                .status();
        }
    }
}

/// Reads a fleet document's host entry.
pub fn host_entry<'a>(document: &'a serde_json::Value, host: &str) -> &'a serde_json::Value {
    document["hosts"]
        .as_array()
        .expect("hosts array")
        .iter()
        .find(|entry| entry["host"] == host)
        .unwrap_or_else(|| panic!("{host} not in {document:#}"))
}
