//! The one typed reader of a host's documents (docs/json.md): what `status`,
//! `free`, `wait` and `plan` answered with `--json`, read through small views
//! of the fields the front ends show (`fleet`, `top -H`), so that a host
//! running a newer gpureap that adds fields still reads. `header` is the one
//! check of a document's schema and kind; `readable` says whether a host's
//! answer has the fields shown. Every text is escaped as it is read, and
//! every list bounded.

use std::ops::Deref;

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::plan::fit::{Cost, Holder};
use crate::report::{self, HolderGpuJson, SCHEMA_VERSION};
use crate::snapshot::UnattributedKind;
use crate::units::one_line;

/// Checks a document's header: gpureap's JSON (`what` is the first line of
/// it, for the message), of this schema, of `kind`. Only the header is read:
/// every other field is skipped, never built.
pub fn header(text: &str, kind: &str) -> Result<(), String> {
    #[derive(Deserialize)]
    struct Header {
        schema_version: Option<serde_json::Number>,
        kind: Option<String>,
    }
    let header: Header = serde_json::from_str(text).map_err(|_| {
        format!(
            "answered something that is not gpureap's JSON (is --remote-bin gpureap?): {}",
            first_line(text)
        )
    })?;
    let version = header
        .schema_version
        .as_ref()
        .and_then(serde_json::Number::as_u64);
    judge_header(version, header.kind.as_deref(), kind, text)
}

/// The one verdict on a header's fields: this schema, then `kind`.
fn judge_header(
    version: Option<u64>,
    found: Option<&str>,
    kind: &str,
    text: &str,
) -> Result<(), String> {
    match version {
        Some(version) if version == u64::from(SCHEMA_VERSION) => {}
        Some(version) => {
            return Err(format!(
                "remote gpureap speaks schema {version}, this one {SCHEMA_VERSION}"
            ));
        }
        None => {
            return Err(format!(
                "answered JSON without a schema_version: not a gpureap report: {}",
                first_line(text)
            ));
        }
    }
    if found != Some(kind) {
        return Err(format!("answered a document that is not a {kind} report"));
    }
    Ok(())
}

/// A status document, header checked, its fields read (`top -H`'s stream,
/// a line a sample): read once; only a line that does not read as a status
/// document is read again, for the header's words on what it is.
pub fn status(text: &str) -> Result<StatusView, String> {
    match serde_json::from_str::<StatusView>(text) {
        Ok(view) => {
            judge_header(view.schema_version, view.kind.as_deref(), "status", text)?;
            Ok(view)
        }
        Err(_) => {
            header(text, "status")?;
            Err(
                "answered a status report this gpureap cannot read (another version of gpureap?)"
                    .to_string(),
            )
        }
    }
}

/// The first line of a host's answer, cut and escaped, for a message.
pub fn first_line(text: &str) -> String {
    let line = text
        .lines()
        .find(|line| !line.trim().is_empty())
        .unwrap_or("");
    crate::units::short(line.trim(), 100)
}

/// A host's text, escaped as it is read (`units::one_line`): a view holds
/// nothing raw, so no field of a host's answer can put a control character
/// or a line of its own into what a person reads.
#[derive(Debug, Clone, Default)]
pub struct Text(pub String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Text, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ok(Text(one_line(&text).into_owned()))
    }
}

impl Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A host's `status` document (docs/json.md), the fields the front ends
/// show: `fleet` (`status -H`, `wait -H`) and `top -H`.
#[derive(Deserialize)]
pub struct StatusView {
    /// The header (`header` checks it where the document is taken).
    pub schema_version: Option<u64>,
    pub kind: Option<Text>,
    #[serde(default)]
    pub backend: Text,
    #[serde(default)]
    pub driver_error: Option<Text>,
    #[serde(default)]
    pub scan: Option<ScanView>,
    #[serde(default)]
    pub gpus: Bounded<GpuView, MAX_ENTRIES>,
    #[serde(default)]
    pub holders: Bounded<HolderView, MAX_ENTRIES>,
    #[serde(default)]
    pub visibility: Option<VisibilityView>,
}

#[derive(Deserialize)]
pub struct ScanView {
    pub complete: bool,
    /// Only how many: their contents are not shown.
    #[serde(default, deserialize_with = "count")]
    pub unreadable: usize,
}

#[derive(Deserialize)]
pub struct GpuView {
    pub index: u32,
    pub name: Option<Text>,
    pub memory_total: Option<u64>,
    pub memory_used: Option<u64>,
    pub memory_unattributed: Option<u64>,
    /// The host's own verdict on `memory_unattributed` (the one rule, with
    /// its driver's tolerance); absent from a host too old to give it.
    #[serde(default)]
    pub held_by_no_process: Option<bool>,
    /// What the host's one rule calls that memory (`unseen` where gpureap
    /// there does not see the host's PIDs); absent from an older host.
    #[serde(default)]
    pub unattributed_kind: Option<Text>,
    pub error: Option<Text>,
    /// What the host's hardware evidence implies (Xids, ECC, row remapping:
    /// `gpus[].advice`); absent from a host older than #26.
    #[serde(default)]
    pub advice: Bounded<Text, MAX_NESTED>,
    /// The driver's process list for this GPU.
    #[serde(default)]
    pub processes: Bounded<GpuProcessView, MAX_ENTRIES>,
    /// What the GPU is doing; absent from an older host.
    #[serde(default)]
    pub utilization_percent: Option<u32>,
    #[serde(default)]
    pub temperature_celsius: Option<u32>,
    #[serde(default)]
    pub power_draw_watts: Option<f64>,
    #[serde(default)]
    pub power_limit_watts: Option<f64>,
}

#[derive(Deserialize)]
pub struct GpuProcessView {
    pub pid: u32,
    pub memory: Option<u64>,
}

#[derive(Deserialize)]
pub struct HolderView {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub user: Option<Text>,
    pub state: Option<Text>,
    pub age_ms: Option<u64>,
    pub comm: Option<Text>,
    pub cmdline: Option<Text>,
    #[serde(default)]
    pub flags: Bounded<Text, MAX_NESTED>,
    /// As `status --json` writes them, read back (`report::places_of`
    /// places them as a snapshot here is).
    #[serde(default)]
    pub gpus: Bounded<HolderGpuJson, MAX_NESTED>,
    /// Absent from hosts older than containers (#24).
    #[serde(default)]
    pub container: Option<ContainerView>,
    pub orphan: Option<Text>,
    pub protected: Option<Text>,
    pub supervisor: Option<SupervisorView>,
}

#[derive(Deserialize)]
pub struct SupervisorView {
    pub gone: Option<Text>,
}

#[derive(Deserialize)]
pub struct ContainerView {
    pub runtime: Text,
    pub id: Text,
    pub pod: Option<Text>,
    pub namespace: Option<Text>,
    pub name: Option<Text>,
}

impl ContainerView {
    pub fn label(&self) -> String {
        report::container_label(
            &self.runtime,
            &self.id,
            self.pod.as_deref(),
            self.namespace.as_deref(),
            self.name.as_deref(),
        )
    }
}

/// What a host's gpureap could see of its holders (`visibility`); absent
/// from hosts older than #24.
#[derive(Deserialize)]
pub struct VisibilityView {
    pub host_pids: Option<bool>,
    #[serde(default)]
    pub hidden: Bounded<u32, MAX_ENTRIES>,
}

#[derive(Deserialize)]
pub(crate) struct HoldersView {
    #[serde(default)]
    pub holders: Bounded<HolderView, MAX_ENTRIES>,
}

impl GpuView {
    /// A GPU the host calls held by no process, or that failed. The verdict
    /// is the host's own: only it knows its driver's tolerance. A host too
    /// old to send it (no `held_by_no_process`) is judged as carefully as
    /// can be: any memory no process explains, or none known, is shown.
    pub(crate) fn worth_reporting(&self) -> bool {
        if self.error.is_some() {
            return true;
        }
        match self.memory_unattributed {
            None => self.held_by_no_process != Some(false),
            Some(bytes) => self.unattributed(bytes) != UnattributedKind::Bookkeeping,
        }
    }

    /// What the host's memory no process explains (`bytes`) is: the host's
    /// own verdict (only it knows its driver's tolerance and whether it sees
    /// the host's PIDs); from a host too old to give one, any of it is held
    /// by no process. `fleet` and `top -H` both judge by this.
    pub fn unattributed(&self, bytes: u64) -> UnattributedKind {
        if self.unattributed_kind.as_deref() == Some("unseen") {
            return UnattributedKind::Unseen;
        }
        match self.held_by_no_process {
            Some(true) => UnattributedKind::NoProcess,
            None if bytes > 0 => UnattributedKind::NoProcess,
            Some(false) | None => UnattributedKind::Bookkeeping,
        }
    }
}

impl HolderView {
    /// A monitor (nvidia-smi, DCGM) watches; it holds nothing.
    pub fn holds(&self) -> bool {
        !self.flags.iter().any(|flag| &**flag == "monitor")
    }
}

/// A host's list as read here: its first N entries (GPUs, holders,
/// targets), the rest counted and skipped unread, so that what a host's
/// view costs is bounded whatever it sends: a real host has a few GPUs and
/// tens of holders, each with a few flags and GPUs.
pub(crate) const MAX_ENTRIES: usize = 1024;
/// The lists inside an entry: a holder's flags and GPUs, a target's signals.
pub(crate) const MAX_NESTED: usize = 64;

pub struct Bounded<T, const N: usize> {
    pub items: Vec<T>,
    /// Entries past the first N, not read.
    pub more: usize,
}

impl<T, const N: usize> Default for Bounded<T, N> {
    fn default() -> Self {
        Bounded {
            items: Vec::new(),
            more: 0,
        }
    }
}

impl<T, const N: usize> std::ops::Deref for Bounded<T, N> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.items
    }
}

impl<T, const N: usize> IntoIterator for Bounded<T, N> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

impl<'a, T, const N: usize> IntoIterator for &'a Bounded<T, N> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for Bounded<T, N> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<T, const N: usize>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const N: usize> serde::de::Visitor<'de> for Visit<T, N> {
            type Value = Bounded<T, N>;
            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("an array")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut bounded = Bounded::default();
                while bounded.items.len() < N {
                    match seq.next_element()? {
                        Some(item) => bounded.items.push(item),
                        None => return Ok(bounded),
                    }
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    bounded.more += 1;
                }
                Ok(bounded)
            }
        }
        deserializer.deserialize_seq(Visit::<T, N>(std::marker::PhantomData))
    }
}

/// An array's length, its elements skipped unread: what it costs is its
/// text, already held, not one value per element.
pub fn count<'de, D: Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    struct Count;
    impl<'de> serde::de::Visitor<'de> for Count {
        type Value = usize;
        fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
            formatter.write_str("an array")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
            let mut count = 0;
            while seq.next_element::<IgnoredAny>()?.is_some() {
                count += 1;
            }
            Ok(count)
        }
    }
    deserializer.deserialize_seq(Count)
}

/// Whether a host's document of `kind` has the fields this side shows.
pub fn readable(kind: &str, report: &RawValue) -> bool {
    let text = report.get();
    match kind {
        "status" => serde_json::from_str::<StatusView>(text).is_ok(),
        "free" => serde_json::from_str::<FreeView>(text).is_ok(),
        "wait" => serde_json::from_str::<WaitView>(text).is_ok(),
        "plan" => serde_json::from_str::<PlanView>(text).is_ok(),
        _ => true,
    }
}

/// The fields of a host's document this side shows, parsed from its text
/// (only those: the rest is skipped, never built).
pub fn view<'a, T: Deserialize<'a>>(report: &'a Option<Box<RawValue>>) -> Option<T> {
    serde_json::from_str(report.as_ref()?.get()).ok()
}

#[derive(Deserialize)]
pub(crate) struct FreeView {
    #[serde(default)]
    pub elapsed_ms: u64,
    #[serde(default)]
    pub targets: Bounded<TargetView, MAX_ENTRIES>,
    #[serde(default)]
    pub spared: Bounded<SparedView, MAX_ENTRIES>,
    #[serde(default)]
    pub gpus: Bounded<OutcomeView, MAX_ENTRIES>,
    #[serde(default)]
    pub cgroup_scopes: Bounded<CgroupScopeView, MAX_ENTRIES>,
}

/// What a host's `--container`, `--pod` or `--cgroup` resolved to there.
#[derive(Deserialize)]
pub(crate) struct CgroupScopeView {
    pub kind: Text,
    pub given: Text,
    #[serde(default)]
    pub members: Bounded<u32, MAX_NESTED>,
    pub note: Option<Text>,
}

#[derive(Deserialize)]
pub(crate) struct TargetView {
    pub pid: u32,
    pub cmdline: Text,
    pub because: Text,
    #[serde(default)]
    pub gpus: Bounded<u32, MAX_NESTED>,
    #[serde(default)]
    pub signals: Bounded<SignalView, MAX_NESTED>,
    pub fate: Text,
    pub exited_after_ms: Option<u64>,
}

#[derive(Deserialize)]
pub(crate) struct SignalView {
    pub signal: Text,
    pub delivery: DeliveryView,
}

#[derive(Deserialize)]
pub(crate) struct SparedView {
    pub pid: u32,
    pub comm: Text,
    pub why: Text,
}

#[derive(Deserialize)]
pub(crate) struct OutcomeView {
    pub index: u32,
    pub freed: bool,
    pub checked: bool,
    pub memory_after: Option<u64>,
    pub freed_bytes: Option<u64>,
    pub freed_after_ms: Option<u64>,
    #[serde(default)]
    pub reasons: Bounded<ReasonView, MAX_NESTED>,
}

/// A signal's delivery: `"sent"`, or an object saying why not.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum DeliveryView {
    Word(String),
    Other(IgnoredAny),
}

/// Why a GPU is still held: its text, or its tag.
#[derive(Deserialize)]
pub(crate) struct ReasonView {
    pub text: Option<String>,
    pub reason: Option<String>,
}

#[derive(Deserialize)]
pub(crate) struct WaitView {
    pub ready: bool,
    pub waited_ms: u64,
    pub below: u64,
    #[serde(default)]
    pub gpus: Bounded<WaitGpuView, MAX_ENTRIES>,
}

#[derive(Deserialize)]
pub(crate) struct WaitGpuView {
    pub index: u32,
    pub memory_used: Option<u64>,
    pub ready: bool,
    pub error: Option<Text>,
}

#[derive(Deserialize)]
pub(crate) struct PlanView {
    pub engine: Text,
    pub device: PlanDeviceView,
    pub device_clean: PlanDeviceView,
    pub fit: PlanFitView,
    #[serde(default)]
    pub launch: Option<PlanLaunchView>,
}

#[derive(Deserialize)]
pub(crate) struct PlanLaunchView {
    pub model: Text,
    pub tp: u32,
    #[serde(default)]
    pub gpus: Bounded<u32, MAX_NESTED>,
}

#[derive(Deserialize)]
pub(crate) struct PlanDeviceView {
    pub tokens_per_rank: u64,
    #[serde(default)]
    pub ranks: Option<u32>,
    #[serde(default)]
    pub concurrency: Option<f64>,
    #[serde(default)]
    pub starts: Option<bool>,
}

#[derive(Deserialize)]
pub(crate) struct PlanFitView {
    pub verdict: Text,
    #[serde(default)]
    pub holders: Bounded<PlanHolderView, MAX_ENTRIES>,
    #[serde(default)]
    pub free_command: Option<Text>,
    #[serde(default)]
    pub reset_command: Option<Text>,
}

#[derive(Deserialize)]
pub(crate) struct PlanHolderView {
    pub pid: Option<u32>,
    pub name: Text,
    pub gpu: u32,
    pub bytes: Option<u64>,
    /// Null when it stops the start instead, or its cost cannot be told.
    pub tokens_lost_per_rank: Option<u64>,
    #[serde(default)]
    pub cost: Option<PlanCostView>,
}

#[derive(Deserialize)]
pub(crate) struct PlanCostView {
    pub kind: Text,
}

impl PlanHolderView {
    /// The holder as the plan that sent it has it; a cost of a kind this
    /// gpureap does not know is told by the tokens it names, or as unknown.
    pub fn holder(&self) -> Holder {
        let kind = self.cost.as_ref().map(|cost| &*cost.kind);
        let cost = match (self.tokens_lost_per_rank, kind) {
            (Some(0), _) => Cost::Nothing,
            (Some(per_rank), _) => Cost::Tokens { per_rank },
            (None, Some("refuses_start")) => Cost::RefusesStart,
            (None, _) => Cost::Unknown,
        };
        Holder {
            pid: self.pid,
            name: self.name.to_string(),
            gpu: self.gpu,
            bytes: self.bytes,
            cost,
            unseen: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(json: &str) -> GpuView {
        serde_json::from_str(json).expect("a GPU of a status document")
    }

    /// The host's verdict where it gives one; from an older host, any memory
    /// no process explains is held by no process (shown), none is not.
    #[test]
    fn the_hosts_verdict_or_for_an_older_host_any_unexplained_memory() {
        let older = gpu(r#"{"index":0,"memory_unattributed":4096}"#);
        assert_eq!(older.unattributed(4096), UnattributedKind::NoProcess);
        assert!(older.worth_reporting());
        let older_clean = gpu(r#"{"index":0,"memory_unattributed":0}"#);
        assert_eq!(older_clean.unattributed(0), UnattributedKind::Bookkeeping);
        assert!(!older_clean.worth_reporting());
        let within = gpu(r#"{"index":0,"memory_unattributed":4096,"held_by_no_process":false}"#);
        assert_eq!(within.unattributed(4096), UnattributedKind::Bookkeeping);
        assert!(!within.worth_reporting());
        let unseen = gpu(r#"{"index":0,"memory_unattributed":4096,"unattributed_kind":"unseen"}"#);
        assert_eq!(unseen.unattributed(4096), UnattributedKind::Unseen);
        assert!(unseen.worth_reporting());
        let unknown = gpu(r#"{"index":0}"#);
        assert!(unknown.worth_reporting(), "no figure at all is shown");
    }

    /// Only the header is judged; its words name what is wrong.
    #[test]
    fn the_header_names_what_is_wrong() {
        assert_eq!(
            header(r#"{"schema_version":1,"kind":"plan"}"#, "plan"),
            Ok(())
        );
        assert_eq!(
            header(r#"{"kind":"plan"}"#, "plan"),
            Err(
                r#"answered JSON without a schema_version: not a gpureap report: {"kind":"plan"}"#
                    .to_string()
            )
        );
        assert!(
            header("Last login: today\n", "status")
                .is_err_and(|why| why.starts_with("answered something that is not gpureap's JSON"))
        );
    }
}
