//! The fleet's answers as a person reads them: one table with a HOST column
//! for what is held, the hosts with nothing to report folded into one line,
//! and the hosts that failed last, each with its reason.
//!
//! It reads the hosts' own JSON documents through the services' one typed
//! reader (`status_doc`), and only renders.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use comfy_table::{Cell, CellAlignment};
use serde::Deserialize;

use super::HostResult;
use crate::hostlist;
use crate::plan::fit::Verdict;
use crate::plan::render;
use crate::report::HolderGpuJson;
use crate::report::{age_text, new_table};
use crate::status_doc::{
    ContainerView, DeliveryView, FreeView, GpuView, HolderView, HoldersView, MAX_ENTRIES,
    PlanDeviceView, PlanView, StatusView, WaitView, view,
};
use crate::units::GpuRanges;
use crate::units::{Bytes, Elapsed, Field, MaybeBytes, short};

/// `status -H`: what is held where, the quiet hosts in one line, failures last.
pub fn status(results: &[HostResult]) -> String {
    let mut out = String::new();
    let mut gpu_rows = Vec::new();
    let mut holder_rows: Vec<Vec<String>> = Vec::new();
    let mut quiet = Vec::new();
    let mut quiet_gpus = 0;
    let mut notes = Vec::new();
    for (result, status) in answered::<StatusView>(results) {
        let host = result.host.as_str();
        let holders: Vec<&HolderView> = status.holders.iter().filter(|h| h.holds()).collect();
        let busy: Vec<&GpuView> = status
            .gpus
            .iter()
            .filter(|gpu| {
                gpu.worth_reporting()
                    || holders.iter().any(|holder| {
                        holder
                            .gpus
                            .iter()
                            .any(|place| place.index == gpu.index && place.listed_by_driver)
                    })
            })
            .collect();
        notes.extend(host_notes(host, &status));
        if busy.is_empty() && holders.is_empty() && status.driver_error.is_none() {
            quiet.push(host);
            quiet_gpus += status.gpus.len();
            continue;
        }
        for gpu in busy {
            gpu_rows.push(match &gpu.error {
                Some(error) => vec![
                    host.to_string(),
                    gpu.index.to_string(),
                    short(&format!("error: {error}"), 40),
                    "?".into(),
                    "?".into(),
                    "?".into(),
                ],
                None => vec![
                    host.to_string(),
                    gpu.index.to_string(),
                    short(gpu.name.as_deref().unwrap_or("?"), 40),
                    MaybeBytes(gpu.memory_used).to_string(),
                    MaybeBytes(gpu.memory_total).to_string(),
                    MaybeBytes(gpu.memory_unattributed).to_string(),
                ],
            });
        }
        holder_rows.extend(host_holder_rows(host, &holders));
    }
    if !gpu_rows.is_empty() {
        let mut table = new_table(&["HOST", "GPU", "NAME", "USED", "TOTAL", "UNATTRIBUTED"]);
        for row in gpu_rows {
            table.add_row(right_aligned(row, &[3, 4, 5]));
        }
        let _ = writeln!(out, "{}\n", table.trim_fmt());
    }
    holder_table(holder_rows, &mut out);
    fold(
        &mut out,
        "Nothing held on",
        &quiet,
        &format!(" ({quiet_gpus} GPUs)"),
    );
    for note in notes {
        let _ = writeln!(out, "{note}");
    }
    failures(results, &mut out);
    out
}

/// What a person must know of one host's answer beside its rows: its
/// driver's error, a partial scan, holders it could not see, holders past
/// what is shown.
fn host_notes(host: &str, status: &StatusView) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(error) = &status.driver_error {
        notes.push(format!("{host}: driver error: {error}"));
    }
    if let Some(scan) = &status.scan
        && !scan.complete
    {
        notes.push(format!(
            "{host}: partial scan, {} process(es) could not be inspected",
            scan.unreadable
        ));
    }
    if let Some(visibility) = &status.visibility
        && visibility.hidden.len() + visibility.hidden.more > 0
    {
        let count = visibility.hidden.len() + visibility.hidden.more;
        notes.push(if visibility.host_pids == Some(false) {
            format!(
                "{host}: {count} holder(s) hidden: gpureap there runs without the host's PIDs (give it `--pid=host`, or `hostPID: true` in Kubernetes)"
            )
        } else {
            format!("{host}: {count} holder(s) hidden: processes of another PID namespace")
        });
    }
    let unseen: BTreeSet<u32> = status
        .gpus
        .iter()
        .filter(|gpu| gpu.unattributed_kind.as_deref() == Some("unseen"))
        .map(|gpu| gpu.index)
        .collect();
    if !unseen.is_empty() {
        notes.push(format!(
            "{host}: GPU {}: memory no listed process explains, and gpureap there runs without the host's PIDs: processes it cannot see may hold it, not the driver (give it `--pid=host`, or `hostPID: true` in Kubernetes)",
            GpuRanges(&unseen)
        ));
    }
    for gpu in status.gpus.iter() {
        notes.extend(
            gpu.advice
                .iter()
                .map(|line| format!("{host}: GPU {}: {line}", gpu.index)),
        );
    }
    if status.holders.more > 0 {
        notes.push(format!(
            "{host}: {} more holders listed than are shown here ({MAX_ENTRIES})",
            status.holders.more
        ));
    }
    notes
}

/// One row per holder and GPU the driver lists it on, sorted by GPU then PID;
/// a holder listed nowhere (no driver answered) gets one row with GPU `-`.
fn host_holder_rows(host: &str, holders: &[&HolderView]) -> Vec<Vec<String>> {
    let mut rows: Vec<(u32, u32, Vec<String>)> = Vec::new();
    for &holder in holders {
        let places: Vec<&HolderGpuJson> = holder
            .gpus
            .iter()
            .filter(|place| place.listed_by_driver)
            .collect();
        let row = |gpu: String, memory: String| {
            vec![
                host.to_string(),
                gpu,
                holder.pid.to_string(),
                holder.user.as_deref().unwrap_or("?").to_string(),
                holder.state.as_deref().unwrap_or("?").to_string(),
                age_text(holder.age_ms),
                memory,
                holder
                    .flags
                    .iter()
                    .map(|flag| &**flag)
                    .collect::<Vec<_>>()
                    .join(","),
                short(
                    &holder
                        .container
                        .as_ref()
                        .map_or("-".to_string(), ContainerView::label),
                    22,
                ),
                short(
                    holder.cmdline.as_deref().unwrap_or("(not visible there)"),
                    48,
                ),
            ]
        };
        if places.is_empty() {
            // Where no driver answered: the node is open, the GPU unknown.
            rows.push((u32::MAX, holder.pid, row("-".into(), "unknown".into())));
        }
        for place in places {
            rows.push((
                place.index,
                holder.pid,
                row(
                    place.index.to_string(),
                    MaybeBytes(place.memory).to_string(),
                ),
            ));
        }
    }
    rows.sort_by_key(|(gpu, pid, _)| (*gpu, *pid));
    rows.into_iter().map(|(_, _, row)| row).collect()
}

fn holder_table(mut rows: Vec<Vec<String>>, out: &mut String) {
    if rows.is_empty() {
        return;
    }
    const CONTAINER: usize = 8;
    let mut headers = vec![
        "HOST",
        "GPU",
        "PID",
        "USER",
        "S",
        "AGE",
        "GPU MEM",
        "FLAGS",
        "CONTAINER",
        "COMMAND",
    ];
    // The column only where some holder runs in a container: the command
    // then gives it room, so that the table stays within 120 columns.
    if rows.iter().all(|row| row[CONTAINER] == "-") {
        headers.remove(CONTAINER);
        for row in &mut rows {
            row.remove(CONTAINER);
        }
    } else {
        for row in &mut rows {
            if let Some(command) = row.last_mut() {
                *command = short(command, 28);
            }
        }
    }
    let mut table = new_table(&headers);
    for row in rows {
        table.add_row(right_aligned(row, &[6]));
    }
    let _ = writeln!(out, "{}\n", table.trim_fmt());
}

fn right_aligned(row: Vec<String>, columns: &[usize]) -> Vec<Cell> {
    row.into_iter()
        .enumerate()
        .map(|(column, text)| {
            let cell = Cell::new(text);
            if columns.contains(&column) {
                cell.set_alignment(CellAlignment::Right)
            } else {
                cell
            }
        })
        .collect()
}

/// The hosts that answered, each beside its document read as `T`; a host
/// without one is left to `failures`.
fn answered<'a, T: Deserialize<'a>>(
    results: &'a [HostResult],
) -> impl Iterator<Item = (&'a HostResult, T)> {
    results
        .iter()
        .filter_map(|result| Some((result, view::<T>(&result.answer.report)?)))
}

/// Hosts folded into one line: `Nothing in scope on 3 hosts: h[3-5]`.
pub fn fold(out: &mut String, what: &str, hosts: &[&str], detail: &str) {
    if !hosts.is_empty() {
        let _ = writeln!(
            out,
            "{what} {} host{}{detail}: {}",
            hosts.len(),
            plural(hosts.len()),
            hostlist::compress(hosts)
        );
    }
}

fn plural(count: usize) -> &'static str {
    if count == 1 { "" } else { "s" }
}

/// The hosts with no report, last, each with its reason.
pub fn failures(results: &[HostResult], out: &mut String) {
    let failed: Vec<&HostResult> = results
        .iter()
        .filter(|result| result.answer.report.is_none())
        .collect();
    if failed.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nFailed on {} of {} host{}:",
        failed.len(),
        results.len(),
        plural(results.len())
    );
    for result in failed {
        let _ = writeln!(
            out,
            "  {}: {}",
            result.host,
            Field(result.answer.error.as_deref().unwrap_or("no report"))
        );
    }
}

/// `free -H --dry-run`, and what is asked before a real free: per host, what
/// would be signalled.
pub fn free_plan(results: &[HostResult]) -> String {
    let mut out = String::new();
    let mut rows = Vec::new();
    let mut nothing = Vec::new();
    let mut spared = Vec::new();
    let mut scopes = Vec::new();
    for (result, plan) in answered::<FreeView>(results) {
        if plan.targets.is_empty() {
            nothing.push(result.host.as_str());
        }
        for target in &plan.targets {
            rows.push(vec![
                result.host.clone(),
                target.pid.to_string(),
                gpu_list(&target.gpus),
                target.because.to_string(),
                short(&target.cmdline, 60),
            ]);
        }
        for entry in &plan.spared {
            spared.push(format!(
                "  {}: {} {} ({})",
                result.host, entry.pid, entry.comm, entry.why
            ));
        }
        for scope in &plan.cgroup_scopes {
            let note = scope
                .note
                .as_ref()
                .map(|note| format!(" ({note})"))
                .unwrap_or_default();
            scopes.push(format!(
                "  {}: --{} {}: {} process(es){note}",
                result.host,
                scope.kind,
                scope.given,
                scope.members.len() + scope.members.more,
            ));
        }
    }
    if !rows.is_empty() {
        let mut table = new_table(&["HOST", "PID", "GPUS", "BECAUSE", "COMMAND"]);
        for row in rows {
            table.add_row(row);
        }
        let _ = writeln!(out, "Would signal (SIGTERM, grace, SIGSTOP+SIGKILL):");
        let _ = writeln!(out, "{}\n", table.trim_fmt());
    }
    if !spared.is_empty() {
        let _ = writeln!(out, "Spared:");
        for line in spared {
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(out);
    }
    if !scopes.is_empty() {
        let _ = writeln!(out, "Found in their cgroups:");
        for line in scopes {
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(out);
    }
    fold(&mut out, "Nothing in scope on", &nothing, "");
    failures(results, &mut out);
    out
}

/// `free -H`: what was signalled where, then one line per host and GPU.
pub fn free_outcome(results: &[HostResult]) -> String {
    let mut out = String::new();
    let mut rows = Vec::new();
    let mut lines = Vec::new();
    let mut nothing = Vec::new();
    for (result, outcome) in answered::<FreeView>(results) {
        let host = result.host.as_str();
        if outcome.targets.is_empty() && outcome.gpus.is_empty() {
            nothing.push(host);
        }
        for target in &outcome.targets {
            let signals: Vec<&str> = target
                .signals
                .iter()
                .filter(
                    |event| matches!(&event.delivery, DeliveryView::Word(word) if word == "sent"),
                )
                .map(|event| &*event.signal)
                .collect();
            let result = match (&*target.fate, target.exited_after_ms) {
                ("exited", Some(ms)) => {
                    format!("exited after {}", Elapsed(ms_duration(ms)))
                }
                ("zombie", _) => "zombie (already exited)".to_string(),
                (fate, _) => fate.replace('_', " "),
            };
            rows.push(vec![
                host.to_string(),
                target.pid.to_string(),
                if signals.is_empty() {
                    "-".to_string()
                } else {
                    signals.join(",")
                },
                result,
                short(&target.cmdline, 56),
            ]);
        }
        for gpu in &outcome.gpus {
            let elapsed = Elapsed(ms_duration(outcome.elapsed_ms));
            lines.push(if gpu.freed {
                format!(
                    "{host}: GPU {}: freed {} in {} ({} used now)",
                    gpu.index,
                    MaybeBytes(gpu.freed_bytes),
                    Elapsed(ms_duration(
                        gpu.freed_after_ms.unwrap_or(outcome.elapsed_ms)
                    )),
                    MaybeBytes(gpu.memory_after)
                )
            } else if !gpu.checked {
                format!(
                    "{host}: GPU {}: not verified after {elapsed}: the driver cannot report on it",
                    gpu.index
                )
            } else {
                format!(
                    "{host}: GPU {}: still held, {} used after {elapsed}",
                    gpu.index,
                    MaybeBytes(gpu.memory_after)
                )
            });
            for reason in &gpu.reasons {
                let text = reason
                    .text
                    .as_deref()
                    .or(reason.reason.as_deref())
                    .unwrap_or("(no reason given)");
                lines.push(format!("  - {}", Field(text)));
            }
        }
    }
    if !rows.is_empty() {
        let mut table = new_table(&["HOST", "PID", "SIGNALS", "RESULT", "COMMAND"]);
        for row in rows {
            table.add_row(row);
        }
        let _ = writeln!(out, "{}\n", table.trim_fmt());
    }
    fold(&mut out, "Nothing in scope on", &nothing, "");
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
    failures(results, &mut out);
    out
}

/// `wait -H`: ready hosts in one line, the GPUs still held by host, and,
/// for those, who holds them (as `status -H` shows them).
pub fn wait(results: &[HostResult]) -> String {
    let mut out = String::new();
    let mut ready = Vec::new();
    let mut busy_lines = Vec::new();
    let mut busy_hosts = Vec::new();
    for (result, wait) in answered::<WaitView>(results) {
        if wait.ready {
            ready.push(result.host.as_str());
            continue;
        }
        busy_hosts.push(result);
        for gpu in wait.gpus.iter().filter(|gpu| !gpu.ready) {
            let mut line = format!(
                "{}: GPU {}: busy, {} used (limit {}) after {}",
                result.host,
                gpu.index,
                MaybeBytes(gpu.memory_used),
                Bytes(wait.below),
                Elapsed(ms_duration(wait.waited_ms))
            );
            if let Some(error) = &gpu.error {
                let _ = write!(line, " ({error})");
            }
            busy_lines.push(line);
        }
    }
    fold(&mut out, "Ready on", &ready, "");
    if !busy_hosts.is_empty() {
        let names: Vec<&str> = busy_hosts
            .iter()
            .map(|result| result.host.as_str())
            .collect();
        let _ = writeln!(
            out,
            "Still held on {} of {} host{}: {}",
            names.len(),
            results.len(),
            plural(results.len()),
            hostlist::compress(&names)
        );
    }
    for line in &busy_lines {
        let _ = writeln!(out, "{line}");
    }
    // The holders of the busy hosts, from the holders each wait listed.
    let mut rows = Vec::new();
    for result in busy_hosts {
        let holders = view::<HoldersView>(&result.answer.report)
            .map(|view| view.holders.items)
            .unwrap_or_default();
        let holding: Vec<&HolderView> = holders.iter().filter(|holder| holder.holds()).collect();
        rows.extend(host_holder_rows(&result.host, &holding));
    }
    if !rows.is_empty() {
        let _ = writeln!(out);
        holder_table(rows, &mut out);
    }
    failures(results, &mut out);
    out
}

/// `plan -H`: one section per host, from the plan each host made on its own
/// GPUs, model cache and holders; the hosts that failed last.
pub fn plan(results: &[HostResult]) -> String {
    let mut out = String::new();
    for (result, plan) in answered::<PlanView>(results) {
        let verdict = match &*plan.fit.verdict {
            "fits" => render::verdict_text(Verdict::Fits),
            "fits_after_free" => render::verdict_text(Verdict::FitsAfterFree),
            "does_not_fit" => render::verdict_text(Verdict::DoesNotFit),
            other => other,
        };
        if !out.is_empty() {
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "{}: {verdict} (exit {})",
            result.host,
            result.answer.exit_code.code()
        );
        if let Some(launch) = &plan.launch {
            let gpus: Vec<u32> = launch.gpus.items.clone();
            let _ = writeln!(
                out,
                "  {} {}, TP {} on GPU{} {}",
                plan.engine,
                short(&launch.model, 60),
                launch.tp,
                if gpus.len() == 1 { "" } else { "s" },
                gpu_list(&gpus)
            );
        }
        let device = |device: &PlanDeviceView| {
            render::pool_summary(
                device.tokens_per_rank,
                device.starts != Some(false),
                device.ranks.unwrap_or(1),
                device.concurrency,
            )
        };
        let _ = writeln!(
            out,
            "  now: {}; on clean GPUs: {}",
            device(&plan.device),
            device(&plan.device_clean)
        );
        for holder in &plan.fit.holders.items {
            let _ = writeln!(out, "  {}", render::holder_summary(&holder.holder()));
        }
        // The host's own commands: `free` runs from here through -H; a
        // reset is run on the host itself.
        if let Some(command) = &plan.fit.free_command {
            let shown = match command.strip_prefix("gpureap free ") {
                Some(args) => format!("gpureap free -H {} {args}", result.host),
                None => command.to_string(),
            };
            let _ = writeln!(out, "  free them: {shown}");
        }
        if let Some(command) = &plan.fit.reset_command {
            let _ = writeln!(out, "  then, on {}: {command}", result.host);
        }
    }
    failures(results, &mut out);
    out
}

fn ms_duration(ms: u64) -> std::time::Duration {
    std::time::Duration::from_millis(ms)
}

fn gpu_list(gpus: &[u32]) -> String {
    if gpus.is_empty() {
        "-".to_string()
    } else {
        crate::units::GpuRanges(&gpus.iter().copied().collect()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::GpuView;

    #[test]
    fn a_plan_section_says_each_holders_cost_by_its_kind_and_escapes_its_name() {
        let report = r#"{"kind": "plan", "engine": "sglang",
            "launch": {"model": "/m", "tp": 2, "gpus": [0, 1]},
            "device": {"tokens_per_rank": 10, "starts": false},
            "device_clean": {"tokens_per_rank": 500, "starts": true, "ranks": 1},
            "fit": {"verdict": "fits_after_free", "free_command": "gpureap free --gpu 0-1 --pid 7 --pid 8",
              "reset_command": "gpureap reset --gpu 1",
              "holders": [
                {"pid": 7, "name": "a\ngpureap: forged", "gpu": 0, "bytes": 1024,
                 "tokens_lost_per_rank": 40, "cost": {"kind": "tokens", "per_rank": 40}},
                {"pid": 8, "name": "big", "gpu": 1, "bytes": 2048,
                 "tokens_lost_per_rank": null, "cost": {"kind": "refuses_start"}},
                {"pid": 9, "name": "mig", "gpu": 1, "bytes": null,
                 "tokens_lost_per_rank": null, "cost": {"kind": "unknown"}},
                {"pid": null, "name": "held by no process (driver-held)", "gpu": 1, "bytes": 4096,
                 "tokens_lost_per_rank": 0, "cost": {"kind": "nothing"}}]}}"#;
        let result = super::HostResult {
            host: "n1".to_string(),
            answer: super::super::Answer {
                exit_code: crate::exit::Exit::StillHeld,
                report: super::super::nested_json(report),
                error: None,
                elapsed: std::time::Duration::ZERO,
            },
        };
        let text = super::plan(&[result]);
        assert_eq!(
            text,
            "n1: fits only after freeing what others hold (exit 1)\n\
             \x20 sglang /m, TP 2 on GPUs 0,1\n\
             \x20 now: would not start; on clean GPUs: 500 tokens per rank\n\
             \x20 GPU 0: pid 7 (a\\ngpureap: forged) holds 1 KiB: costs every rank 40 tokens\n\
             \x20 GPU 1: pid 8 (big) holds 2 KiB: alone stops the start\n\
             \x20 GPU 1: pid 9 (mig) holds an unknown amount: costs what cannot be told (no figure from the driver)\n\
             \x20 GPU 1: held by no process (driver-held) holds 4 KiB: costs nothing\n\
             \x20 free them: gpureap free -H n1 --gpu 0-1 --pid 7 --pid 8\n\
             \x20 then, on n1: gpureap reset --gpu 1\n"
        );
    }

    /// A host's verdict reads as `plan` says it on the host itself; one
    /// this gpureap does not know is shown as the host sent it.
    #[test]
    fn a_plan_section_says_the_verdict_in_the_plan_s_own_words() {
        let section = |verdict: &str, exit_code: crate::exit::Exit| {
            let report = format!(
                r#"{{"kind": "plan", "engine": "vllm",
                "device": {{"tokens_per_rank": 0, "starts": false}},
                "device_clean": {{"tokens_per_rank": 0, "starts": false}},
                "fit": {{"verdict": "{verdict}", "holders": []}}}}"#
            );
            let result = super::HostResult {
                host: "n2".to_string(),
                answer: super::super::Answer {
                    exit_code,
                    report: super::super::nested_json(&report),
                    error: None,
                    elapsed: std::time::Duration::ZERO,
                },
            };
            super::plan(&[result])
        };
        assert_eq!(
            section("does_not_fit", crate::exit::Exit::CannotFit),
            "n2: does not fit on this hardware, even on clean GPUs (exit 4)\n\
             \x20 now: would not start; on clean GPUs: would not start\n"
        );
        assert_eq!(
            section("fits_somewhere_else", crate::exit::Exit::Success),
            "n2: fits_somewhere_else (exit 0)\n\
             \x20 now: would not start; on clean GPUs: would not start\n"
        );
    }

    fn view(json: &str) -> GpuView {
        serde_json::from_str(json).expect("a GPU view")
    }

    /// The host's verdict decides; a host too old to give one has any
    /// memory no process explains shown, never hidden by an allowance of
    /// the fleet's own.
    #[test]
    fn a_gpu_is_shown_by_its_hosts_verdict_or_else_by_any_unexplained_memory() {
        let gpu = |rest: &str| {
            view(&format!(
                r#"{{"index": 0, "name": "H200", "memory_total": 1, "memory_used": 104857600, "error": null, {rest}}}"#
            ))
        };
        let mib100 = r#""memory_unattributed": 104857600"#;
        assert!(gpu(&format!(r#"{mib100}, "held_by_no_process": true"#)).worth_reporting());
        assert!(!gpu(&format!(r#"{mib100}, "held_by_no_process": false"#)).worth_reporting());
        // An older host: no verdict.
        assert!(gpu(mib100).worth_reporting());
        assert!(!gpu(r#""memory_unattributed": 0"#).worth_reporting());
        assert!(gpu(r#""memory_unattributed": null"#).worth_reporting());
    }

    /// Each host's holders carry their container, escaped as a host's text
    /// is; a host that sees no host PIDs says so, with the remedy; a host
    /// older than containers still renders.
    #[test]
    fn status_says_each_hosts_containers_and_hidden_holders() {
        let id = "4444444444444444444444444444444444444444444444444444444444444444";
        let holder = |container: &str| {
            format!(
                r#"{{"pid": 42, "user": "root", "state": "S", "age_ms": 1000, "cmdline": "vllm",
                "flags": [], "gpus": [{{"index": 0, "memory": 1024, "listed_by_driver": true}}]{container}}}"#
            )
        };
        let report = |holder: String, visibility: &str| {
            format!(
                r#"{{"kind": "status", "gpus": [{{"index": 0, "name": "H200", "memory_total": 2048,
                "memory_used": 1024, "memory_unattributed": 0, "held_by_no_process": false, "error": null}}],
                "holders": [{holder}]{visibility}}}"#
            )
        };
        let host = |name: &str, report: String| super::HostResult {
            host: name.to_string(),
            answer: super::super::Answer {
                exit_code: crate::exit::Exit::Success,
                report: super::super::nested_json(&report),
                error: None,
                elapsed: std::time::Duration::ZERO,
            },
        };
        let named = format!(
            r#", "container": {{"runtime": "containerd", "id": "{id}", "pod_uid": null,
            "pod": "server-0", "namespace": "llm", "name": "vl\u001b[2J\nFORGED", "local_pid": 1}}"#
        );
        let unnamed = format!(
            r#", "container": {{"runtime": "docker", "id": "{id}", "pod_uid": null,
            "pod": null, "namespace": null, "name": null, "local_pid": null}}"#
        );
        let hidden = r#", "visibility": {"host_pids": false, "hidden": [7, 8], "note": "x"}"#;
        let text = super::status(&[
            host("n1", report(holder(&named), "")),
            host("n2", report(holder(&unnamed), hidden)),
            host("n3", report(holder(""), "")),
        ]);
        assert!(text.contains("CONTAINER"), "{text}");
        assert!(text.contains("llm/server-0 vl\\u{1b}"), "{text}");
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(
            !text.lines().any(|line| line.starts_with("FORGED")),
            "{text}"
        );
        assert!(text.contains("docker:444444444444"), "{text}");
        assert!(
            text.contains("n2: 2 holder(s) hidden: gpureap there runs without the host's PIDs"),
            "{text}"
        );
        assert!(text.contains("hostPID: true"), "{text}");
        let n3 = text
            .lines()
            .find(|line| line.trim_start().starts_with("n3") && line.contains("vllm"))
            .expect("n3's row");
        assert!(n3.contains(" - "), "{n3}");
    }

    /// A host whose gpureap runs without the host's PIDs, where memory no
    /// listed process explains is `unseen`: its GPU is shown, and a note
    /// says that processes it cannot see may hold it, with the remedy;
    /// nothing calls it held by no process.
    #[test]
    fn status_says_where_a_hosts_unexplained_memory_is_unseen() {
        let unseen = view(
            r#"{"index": 0, "name": "H200", "memory_total": 1, "memory_used": 104857600, "error": null,
            "memory_unattributed": 104857600, "held_by_no_process": null, "unattributed_kind": "unseen"}"#,
        );
        assert!(unseen.worth_reporting());
        let report = r#"{"kind": "status", "gpus": [{"index": 0, "name": "H200", "memory_total": 2048,
            "memory_used": 1024, "memory_unattributed": 1024, "held_by_no_process": null,
            "unattributed_kind": "unseen", "error": null}], "holders": [],
            "visibility": {"host_pids": false, "hidden": [], "note": "x"}}"#;
        let text = super::status(&[super::HostResult {
            host: "n4".to_string(),
            answer: super::super::Answer {
                exit_code: crate::exit::Exit::Success,
                report: super::super::nested_json(report),
                error: None,
                elapsed: std::time::Duration::ZERO,
            },
        }]);
        assert!(
            text.contains("n4: GPU 0: memory no listed process explains"),
            "{text}"
        );
        assert!(text.contains("--pid=host"), "{text}");
        assert!(!text.contains("held by no process"), "{text}");
    }

    /// A host's hardware advice (an Xid, a pending row remap) is a note
    /// under the table, escaped as everything a host sends.
    #[test]
    fn status_gives_each_hosts_hardware_advice() {
        let report = r#"{"kind": "status", "gpus": [{"index": 3, "name": "H200", "memory_total": 2048,
            "memory_used": 0, "memory_unattributed": 0, "held_by_no_process": false,
            "unattributed_kind": "bookkeeping", "error": null,
            "advice": ["Xid 79 at 03:12 UTC (GPU has fallen off the bus): a reset will not help; reboot the node",
                       "forged\u001b[2J\nline"]}], "holders": []}"#;
        let text = super::status(&[super::HostResult {
            host: "n7".to_string(),
            answer: super::super::Answer {
                exit_code: crate::exit::Exit::Success,
                report: super::super::nested_json(report),
                error: None,
                elapsed: std::time::Duration::ZERO,
            },
        }]);
        assert!(
            text.contains("n7: GPU 3: Xid 79 at 03:12 UTC (GPU has fallen off the bus): a reset will not help; reboot the node"),
            "{text}"
        );
        assert!(!text.contains('\u{1b}'), "{text:?}");
        assert!(text.contains("n7: GPU 3: forged"), "{text}");
        assert!(!text.contains("\nline"), "{text:?}");
    }
}
