//! The demo's third act: containers. After the server's free, two vLLM
//! containers on the same simulated host, laid out as docker's systemd
//! driver lays them out (`system.slice/docker-<id>.scope`, real cgroup v2
//! directories with the stand-ins moved in): `vllm-llama` runs, and a
//! container removed with `docker rm -f` whose engine lives on, holding its
//! GPU: invisible to `docker ps`, visible to the driver. The node's docker
//! state is staged under the simulated host (`node/var/lib/docker/containers`
//! lists `vllm-llama` and not the removed one): `status --host-root` reads
//! it, names the first and says the second's container is gone, from that
//! reading, not from a flag; `free --container` takes the gone one's
//! processes, and the running container is untouched.
//!
//! Cgroups can be made only as root or in a delegated cgroup v2 subtree;
//! elsewhere the act is skipped with one line saying why. What it makes
//! (its stand-ins, its cgroups) is gone when it ends.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::container::{Presence, Sources};
use crate::driver::SimDriver;
use crate::driver::sim::incident::{Holder, Incident};
use crate::members::{self, ContainerRef, Wanted};
use crate::reap::{self, FreeReport, Options};
use crate::report;
use crate::select::{Guard, Scope};
use crate::snapshot::Snapshot;
use crate::supervision;

use super::Said;

const GIB: u64 = 1 << 30;
/// The running container's id after the demo's PID (8 hex digits, so that
/// demos run at once never share an id), its docker name, GPU and memory.
const RUNNING: &str = "5c1e0b7a9d3f4e2a8b6c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c";
const RUNNING_NAME: &str = "vllm-llama";
const RUNNING_GPU: u32 = 5;
const RUNNING_TITLE: &str =
    "python3 -m vllm.entrypoints.openai.api_server --model meta-llama/Llama-3.1-8B-Instruct";
/// The container removed with `docker rm -f`, whose engine lives on.
const REMOVED: &str = "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4";
const REMOVED_GPU: u32 = 6;
const REMOVED_TITLE: &str = "VLLM::EngineCore";
const MEMORY: u64 = 60 * GIB;
/// The folder under the simulated host that plays the node's root.
const NODE: &str = "node";
/// The cgroups' folder under the v2 mount: `gpureap-demo-<pid>`.
const ROOT_PREFIX: &str = "gpureap-demo-";

/// What the act showed, for `--json` (docs/json.md, `demo`'s `containers`).
#[derive(Debug, Default, Serialize)]
pub struct ContainersJson {
    /// Why the act did not run (no cgroup could be made here); null when it did.
    pub skipped: Option<String>,
    /// The running container's holder, its name as `status` read it, and
    /// whether the free left it running.
    pub running_pid: Option<u32>,
    pub running_name: Option<String>,
    pub running_alive_after: bool,
    /// The removed container's holder and what `status` said of it.
    pub removed_pid: Option<u32>,
    /// The source that says its container is gone (`Presence::Gone`).
    pub gone_source: Option<String>,
    /// `free --container <its id>`'s document (kind `free`).
    pub free: Option<serde_json::Value>,
    pub removed_alive_after: bool,
}

impl ContainersJson {
    /// What did not play out as designed; empty when it did, or when skipped.
    pub fn differences(&self) -> Vec<String> {
        if self.skipped.is_some() {
            return Vec::new();
        }
        let mut differences = Vec::new();
        if self.running_name.as_deref() != Some(RUNNING_NAME) {
            differences.push(format!(
                "status did not name the running container {RUNNING_NAME}"
            ));
        }
        if self.gone_source.is_none() {
            differences.push("status did not say the removed container is gone".to_string());
        }
        if self.removed_alive_after {
            differences.push("free --container left the removed container's engine".to_string());
        }
        if !self.running_alive_after {
            differences.push("free --container ended the running container".to_string());
        }
        differences
    }
}

/// The cgroups of the act, removed when dropped (after its processes are gone).
struct Cgroups(PathBuf);

impl Drop for Cgroups {
    fn drop(&mut self) {
        remove_tree(&self.0, Duration::from_secs(2));
    }
}

/// A container's full id in this demo: the demo's PID, then `rest`.
fn id(rest: &str) -> String {
    format!("{:08x}{rest}", std::process::id())
}

/// Removes a cgroup tree whose processes were killed, retrying while one
/// not reaped yet keeps a cgroup busy, up to `limit`.
pub fn remove_tree(root: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    let leaves = [RUNNING, REMOVED].map(|rest| scope_of(root, &id(rest)));
    loop {
        for dir in leaves
            .iter()
            .chain([&root.join("system.slice"), &root.to_path_buf()])
        {
            let _ = fs::remove_dir(dir);
        }
        if !root.exists() || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn scope_of(root: &Path, id: &str) -> PathBuf {
    root.join("system.slice").join(format!("docker-{id}.scope"))
}

/// The act's cgroup root for this process: in its own cgroup v2 (the
/// mount's top as root; a delegated subtree otherwise), as `gpureap run`
/// makes its own.
pub fn root_of_this_process() -> Option<PathBuf> {
    let mount = supervision::cgroup2_mount()?;
    let own = fs::read_to_string("/proc/self/cgroup")
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("0::").map(str::to_string))?;
    Some(
        mount
            .join(own.trim_start_matches('/'))
            .join(format!("{ROOT_PREFIX}{}", std::process::id())),
    )
}

/// Plays the act on the demo's host; writes its transcript when `text`,
/// without the notes the transcript has said already.
pub fn play(
    out: &mut dyn Write,
    text: Option<&Said>,
    host: &Path,
    driver: &SimDriver,
    incident: &mut Incident,
) -> io::Result<ContainersJson> {
    let cgroups = match make_cgroups() {
        Ok(cgroups) => cgroups,
        Err(why) => {
            if text.is_some() {
                writeln!(out, "\nContainers: skipped, {why}.")?;
            }
            return Ok(ContainersJson {
                skipped: Some(why),
                ..ContainersJson::default()
            });
        }
    };
    let node = stage_node(host, &id(RUNNING))?;
    let (running_id, removed_id) = (id(RUNNING), id(REMOVED));
    let running = contained(
        incident,
        &cgroups.0,
        &running_id,
        Holder::new(RUNNING_TITLE)
            .on(RUNNING_GPU, MEMORY)
            .in_own_session(),
    )?;
    let removed = contained(
        incident,
        &cgroups.0,
        &removed_id,
        Holder::new(REMOVED_TITLE)
            .on(REMOVED_GPU, MEMORY + 12 * GIB)
            .in_own_session(),
    )?;
    let sources = Sources::new(node.clone(), None);
    let mut snapshot = Snapshot::take(driver);
    snapshot.attribute_containers(&sources);
    let container_of = |pid: u32| {
        snapshot
            .details
            .get(&pid)
            .and_then(|details| details.container.clone())
    };
    let mut facts = ContainersJson {
        running_pid: Some(running),
        running_name: container_of(running).and_then(|container| container.name),
        removed_pid: Some(removed),
        gone_source: container_of(removed).and_then(|container| match container.presence {
            Presence::Gone { source } => Some(source),
            _ => None,
        }),
        ..ContainersJson::default()
    };
    let gpus = Some(BTreeSet::from([RUNNING_GPU, REMOVED_GPU]));
    if let Some(said) = text {
        introduce(out, &node)?;
        writeln!(
            out,
            "{}",
            said.strip(&report::status_table(&snapshot, &gpus))
        )?;
        writeln!(
            out,
            "$ gpureap free --container {} --yes",
            members::short_id(&removed_id)
        )?;
    }
    let outcome = free_container(driver, &sources, &removed_id, snapshot)?;
    if let Some(said) = text {
        writeln!(out, "{}", said.strip(&report::free_outcome(&outcome)))?;
    }
    facts.removed_alive_after = alive(removed);
    facts.running_alive_after = alive(running);
    facts.free = Some(
        serde_json::from_str(&report::free_json(&outcome, outcome.exit()))
            .map_err(io::Error::other)?,
    );
    if text.is_some() {
        writeln!(
            out,
            "Only the removed container's engine was taken: {RUNNING_NAME} (pid {running}) still runs on GPU {RUNNING_GPU}."
        )?;
    }
    // Its processes first, then its cgroups (retried until they are reaped).
    incident.kill(running)?;
    incident.kill(removed)?;
    drop(cgroups);
    Ok(facts)
}

/// `free --container <id prefix> --yes`, as `free` does it: the members
/// found from every process's cgroups, then the one free.
fn free_container(
    driver: &SimDriver,
    sources: &Sources,
    id: &str,
    snapshot: Snapshot,
) -> io::Result<FreeReport> {
    let wanted = [Wanted::Container(ContainerRef::Id(
        members::short_id(id).to_string(),
    ))];
    let placed = members::scan();
    let known = members::known(sources, &wanted, &placed);
    let found = members::find(&wanted, &placed, &known).map_err(io::Error::other)?;
    let scope = Scope {
        members: Some(members::all_members(&found)),
        ..Scope::default()
    };
    let guard = Guard::for_this_process(&[]);
    let options = Options::new(Duration::from_secs(2), Duration::from_secs(2));
    let mut outcome = reap::free(driver, &scope, &guard, snapshot, options, &mut |_| {});
    outcome.cgroup_scopes = found;
    Ok(outcome)
}

/// The act's cgroups, or why none can be made here.
fn make_cgroups() -> Result<Cgroups, String> {
    let Some(root) = root_of_this_process() else {
        return Err("no cgroup v2 mount on this host".to_string());
    };
    if let Err(error) = fs::create_dir(&root) {
        return Err(format!(
            "cannot make a cgroup under {} ({error}): it needs root or a delegated cgroup v2 subtree",
            root.parent().unwrap_or(&root).display()
        ));
    }
    let cgroups = Cgroups(root);
    for rest in [RUNNING, REMOVED] {
        fs::create_dir_all(scope_of(&cgroups.0, &id(rest)))
            .map_err(|error| format!("cannot make a container's cgroup ({error})"))?;
    }
    Ok(cgroups)
}

/// The node's docker state: `vllm-llama` listed, the removed container not.
fn stage_node(host: &Path, running: &str) -> io::Result<PathBuf> {
    let node = host.join(NODE);
    let folder = node.join("var/lib/docker/containers").join(running);
    fs::create_dir_all(&folder)?;
    fs::write(
        folder.join("config.v2.json"),
        format!("{{\"ID\": \"{running}\", \"Name\": \"/{RUNNING_NAME}\"}}"),
    )?;
    Ok(node)
}

/// Alive, not a zombie.
fn alive(pid: u32) -> bool {
    crate::proc::identity(pid)
        .and_then(crate::proc::state_of)
        .is_some_and(|state| !state.has_exited())
}

/// Starts a holder and moves it into its container's cgroup. Each runs in a
/// session of its own, re-parented away from the demo, as a container's
/// processes are (under their shim).
fn contained(incident: &mut Incident, root: &Path, id: &str, holder: Holder) -> io::Result<u32> {
    let pid = incident.holder(&holder)?;
    fs::write(scope_of(root, id).join("cgroup.procs"), pid.to_string())?;
    Ok(pid)
}

fn introduce(out: &mut dyn Write, node: &Path) -> io::Result<()> {
    writeln!(
        out,
        "\nContainers. Two vLLM containers on GPUs {RUNNING_GPU} and {REMOVED_GPU} (real cgroups, laid out as docker's"
    )?;
    writeln!(
        out,
        "systemd driver does). The second was removed with `docker rm -f`: its engine lives on, holding"
    )?;
    writeln!(
        out,
        "its GPU, invisible to `docker ps`. The node's docker state is staged in {}.\n",
        node.display()
    )?;
    writeln!(
        out,
        "$ gpureap status --gpu {RUNNING_GPU},{REMOVED_GPU} --host-root {}",
        node.display()
    )
}
