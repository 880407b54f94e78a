//! What `status` shows: who uses which GPU, how much, since when, and how
//! sure it is, in a table that fits 120 columns.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};
use gpureap_core::units::Bytes;

use crate::harness::*;

/// One row of the holders table, cut into its columns.
#[derive(Debug)]
struct Row {
    gpu: String,
    pid: u32,
    memory: String,
    flags: String,
    command: String,
}

const COLUMNS: [&str; 12] = [
    "GPU",
    "PID",
    "PPID",
    "PGID",
    "SID",
    "USER",
    "S",
    "AGE",
    "GPU MEM",
    "FLAGS",
    "CONTAINER",
    "COMMAND",
];

/// The holders table's rows, cut at the columns its header shows (every
/// cell starts where its header does; GPU MEM is right-aligned within it).
fn holder_rows(stdout: &str) -> Vec<Row> {
    let mut lines = stdout
        .lines()
        .skip_while(|line| !line.trim_start().starts_with("GPU  PID"));
    let header = lines
        .next()
        .unwrap_or_else(|| panic!("no holders table:\n{stdout}"));
    let mut starts = Vec::new();
    let mut searched_to = 0;
    for label in COLUMNS {
        let start = searched_to + header[searched_to..].find(label).expect("column in header");
        starts.push(start);
        searched_to = start + label.len();
    }
    lines
        .take_while(|line| !line.trim().is_empty())
        .map(|line| {
            let chars: Vec<char> = line.chars().collect();
            let cell = |column: usize| -> String {
                let end = starts.get(column + 1).copied().unwrap_or(chars.len());
                chars[starts[column].min(chars.len())..end.min(chars.len())]
                    .iter()
                    .collect::<String>()
                    .trim()
                    .to_string()
            };
            Row {
                gpu: cell(0),
                pid: cell(1).parse().unwrap_or_else(|_| panic!("pid in {line}")),
                memory: cell(8),
                flags: cell(9),
                command: cell(11),
            }
        })
        .collect()
}

fn rows_of(rows: &[Row], pid: u32) -> Vec<&Row> {
    rows.iter().filter(|row| row.pid == pid).collect()
}

fn fits_120_columns(stdout: &str) {
    for line in stdout.lines() {
        assert!(
            line.chars().count() <= 120,
            "{} columns: {line}\n{stdout}",
            line.chars().count()
        );
    }
}

#[test]
fn eight_gpus_by_eight_workers_each_on_its_own_gpu() {
    let (host, mut incident) = Sim::gpus(8)
        .memory(141 * GIB)
        .named("NVIDIA H200 (simulated)")
        .stage();
    let memory = |rank: u32| 70 * GIB + u64::from(rank) * GIB / 4;
    // As CUDA does: every worker has all eight nodes open, a context on its own GPU only.
    let (_, tp) = incident.sglang_tree(std::array::from_fn::<_, 8, _>(|rank| {
        scheduler(rank as u32, memory(rank as u32))
    }));
    let notebook_title = "jupyter-kernel --notebook /home/colleague/experiments/long-context-ablation-2026-11/analysis-of-the-results.ipynb";
    let notebook = incident.hold(Holder::new(notebook_title).on(3, 6 * GIB));
    let exporter = incident.hold(Holder::new("gpu_exporter --port 9400"));

    // --monitors: every process's descriptors, the exporter among them.
    let table = run(&host, &["status", "--monitors"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    fits_120_columns(&table.stdout);
    let rows = holder_rows(&table.stdout);
    assert!(
        rows.iter().all(|row| row.memory != "unknown"),
        "{}",
        table.stdout
    );
    for (rank, &pid) in tp.iter().enumerate() {
        let mine = rows_of(&rows, pid);
        assert_eq!(mine.len(), 1, "TP{rank}: {mine:?}\n{}", table.stdout);
        assert_eq!(mine[0].gpu, rank.to_string(), "{}", table.stdout);
        assert_eq!(mine[0].memory, Bytes(memory(rank as u32)).to_string());
        assert_eq!(
            mine[0].command,
            format!("sglang::scheduler_TP{rank} 100000")
        );
    }
    let notebook_row = rows_of(&rows, notebook);
    assert_eq!(notebook_row.len(), 1, "{}", table.stdout);
    assert_eq!(
        (
            notebook_row[0].gpu.as_str(),
            notebook_row[0].memory.as_str()
        ),
        ("3", "6.0 GiB")
    );
    assert!(
        notebook_row[0].command.ends_with('…')
            && notebook_title.starts_with(notebook_row[0].command.trim_end_matches('…')),
        "the command line gives way to fit: {}",
        table.stdout
    );
    let exporter_row = rows_of(&rows, exporter);
    assert_eq!(exporter_row.len(), 1, "{}", table.stdout);
    assert_eq!(
        (
            exporter_row[0].gpu.as_str(),
            exporter_row[0].memory.as_str(),
            exporter_row[0].flags.as_str()
        ),
        ("-", "0 B", "monitor")
    );
    let order: Vec<&str> = rows.iter().map(|row| row.gpu.as_str()).collect();
    assert_eq!(order, ["0", "1", "2", "3", "3", "4", "5", "6", "7", "-"]);

    let tree = run(&host, &["status", "--tree"]);
    assert!(
        tree.stdout.contains("python3 -m sglang.launch_server"),
        "the launcher is read though only the listed were inspected:\n{}",
        tree.stdout
    );
    for (rank, &pid) in tp.iter().enumerate() {
        let line = tree
            .stdout
            .lines()
            .find(|line| {
                line.trim_start_matches(['│', '├', '└', '─', ' '])
                    .starts_with(&format!("{pid} ["))
            })
            .unwrap_or_else(|| panic!("TP{rank} not in the tree:\n{}", tree.stdout));
        assert_eq!(line.matches("  GPU ").count(), 1, "{line}");
        assert!(
            line.contains(&format!("  GPU {rank}: {}", Bytes(memory(rank as u32)))),
            "{line}"
        );
    }
    assert!(!tree.stdout.contains(": unknown"), "{}", tree.stdout);

    let status = run(&host, &["status", "--json"]).json();
    let holder = |pid: u32| holder_of(&status, pid);
    for (rank, &pid) in tp.iter().enumerate() {
        let gpus = holder(pid)["gpus"].as_array().expect("gpus").clone();
        assert_eq!(gpus.len(), 8, "every node open");
        let listed: Vec<_> = gpus
            .iter()
            .filter(|gpu| gpu["listed_by_driver"] == true)
            .collect();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0]["index"], rank);
        assert_eq!(listed[0]["memory"], memory(rank as u32));
    }

    // Every byte is explained by the driver's lists: only the listed were
    // inspected, and the status says the monitors were not looked for.
    assert_eq!(status["scan"]["descriptors"], "listed", "{status:#}");
    assert!(
        status["holders"]
            .as_array()
            .expect("holders")
            .iter()
            .all(|holder| holder["pid"] != exporter),
        "{status:#}"
    );
    let plain = run(&host, &["status"]);
    assert_eq!(plain.code, 0, "{}", plain.stderr);
    let plain_rows: Vec<u32> = holder_rows(&plain.stdout)
        .iter()
        .map(|row| row.pid)
        .collect();
    assert_eq!(plain_rows.len(), 9, "{}", plain.stdout);
    assert!(!plain_rows.contains(&exporter), "{}", plain.stdout);
    let words = plain
        .stdout
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        words.contains("`gpureap status --monitors` lists monitors too."),
        "{}",
        plain.stdout
    );
    let everything = run(&host, &["status", "--json", "--monitors"]).json();
    assert_eq!(everything["scan"]["descriptors"], "all");

    // GPU 3's users are the ones the driver lists there; the exporter watches it.
    let only_3 = run(&host, &["status", "--gpu", "3", "--monitors"]);
    let shown: Vec<u32> = holder_rows(&only_3.stdout)
        .iter()
        .map(|row| row.pid)
        .collect();
    assert_eq!(shown, [tp[3], notebook, exporter], "{}", only_3.stdout);
    let plan = run(&host, &["free", "--gpu", "3", "--dry-run", "--json"]).json();
    let mut expected = vec![tp[3], notebook];
    expected.sort_unstable();
    assert_eq!(target_pids(&plan), expected);
}

#[test]
fn where_no_driver_answers_an_open_node_is_shown_as_weaker_evidence() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let worker = incident.hold(scheduler(0, 40 * GIB));
    let watcher = incident.hold(Holder::new("gpu_exporter --port 9400"));
    host.lose(1).expect("lose GPU 1");

    let table = run(&host, &["status"]);
    fits_120_columns(&table.stdout);
    let rows = holder_rows(&table.stdout);
    let places = |pid: u32| -> Vec<(String, String)> {
        rows_of(&rows, pid)
            .iter()
            .map(|row| (row.gpu.clone(), row.memory.clone()))
            .collect()
    };
    let pair = |gpu: &str, memory: &str| (gpu.to_string(), memory.to_string());
    assert_eq!(
        places(worker),
        [pair("0", "40.0 GiB"), pair("(1)", "unknown")],
        "{}",
        table.stdout
    );
    // Whether it has a context on the lost GPU nobody can say: not a monitor.
    assert_eq!(
        places(watcher),
        [pair("(1)", "unknown")],
        "{}",
        table.stdout
    );
    assert_contains(&table.stdout, "weaker evidence");
    assert_contains(&table.stdout, "GPU 1 is lost");
    let tree = run(&host, &["status", "--tree"]);
    assert!(
        tree.stdout.contains("GPU 0: 40.0 GiB  GPU (1): nodes open")
            && tree.stdout.contains("weaker evidence"),
        "{}",
        tree.stdout
    );
    // Freeing the lost GPU takes what may use it: the watcher, which has its
    // node open and a context nowhere the driver can see; not the worker,
    // whose context the driver lists on GPU 0.
    let plan = run(&host, &["free", "--gpu", "1", "--dry-run", "--json"]).json();
    assert_eq!(target_pids(&plan), [watcher], "{plan:#}");
    assert_eq!(gpu(&plan, 1)["checked"], false);
}

#[test]
fn unknown_memory_says_why() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let holder = incident.hold(Holder::new("python3 serve.py").on(0, 4 * GIB));
    std::fs::write(host.path().join(format!("claims/{holder}.0")), "unknown").expect("claim");

    let table = run(&host, &["status"]);
    let rows = holder_rows(&table.stdout);
    let row = rows_of(&rows, holder);
    assert_eq!(
        (row[0].gpu.as_str(), row[0].memory.as_str()),
        ("0", "unknown")
    );
    assert_contains(&table.stdout, "reports no memory figure");
    assert_contains(&table.stdout, "MIG");
    assert!(!table.stdout.contains("not running as root"));
    let as_nobody = run_as_nobody(&host, &["status"]);
    assert_contains(&as_nobody.stdout, "gpureap is not running as root");
    let status = run(&host, &["status", "--json"]).json();
    assert_eq!(
        gpu(&status, 0)["memory_unattributed"],
        serde_json::Value::Null
    );
    assert_eq!(
        status["holders"][0]["gpus"][0]["memory"],
        serde_json::Value::Null
    );
    assert_eq!(status["holders"][0]["gpus"][0]["listed_by_driver"], true);
}

#[test]
fn a_process_younger_than_a_second_shows_its_age_in_tenths() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let holder = incident.hold(Holder::new("python3 young.py").on(0, GIB));
    let table = run(&host, &["status"]);
    let row = table
        .stdout
        .lines()
        .find(|line| line.split_whitespace().nth(1) == Some(&holder.to_string()))
        .unwrap_or_else(|| panic!("no row for {holder}:\n{}", table.stdout));
    let age = row.split_whitespace().nth(7).expect("age column");
    let tenths = age
        .strip_suffix('s')
        .and_then(|seconds| seconds.split_once('.'))
        .is_some_and(|(whole, tenth)| {
            whole.bytes().all(|b| b.is_ascii_digit()) && tenth.len() == 1
        });
    assert!(tenths, "age {age:?} in: {row}");
}

/// A process names itself: an escape sequence in its command line is shown
/// written out, and never reaches the terminal of whoever reads the table.
#[test]
fn control_characters_in_a_command_line_never_reach_the_terminal() {
    let (host, mut incident) = Sim::gpus(1).stage();
    let pid = incident
        .holder(&Holder::new("evil\x1b[2J\x1b]0;pwned\x07\rpython3").on(0, GIB))
        .expect("holder");
    for args in [
        &["status"][..],
        &["status", "--tree"],
        &["free", "--pid", &pid.to_string(), "--dry-run"],
    ] {
        let run = run(&host, args);
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        assert!(
            !run.stdout
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t'),
            "{args:?} printed a control character:\n{:?}",
            run.stdout
        );
        assert!(
            run.stdout.contains("evil\\u{1b}[2J"),
            "{args:?}:\n{}",
            run.stdout
        );
    }
    // JSON keeps the text as it is, escaped the JSON way.
    let json = run(&host, &["status", "--json"]).json();
    assert!(
        json["holders"]
            .as_array()
            .expect("holders")
            .iter()
            .any(|holder| holder["cmdline"]
                .as_str()
                .is_some_and(|c| c.starts_with("evil\x1b[2J")))
    );
}

/// Without a driver, `status` says so once, first: not "No GPUs reported
/// by the driver (none)." (the backend's name), then a "Driver error:" note
/// and, with the automatic fallback, a line on stderr saying it again.
#[test]
fn without_a_driver_status_says_so_once() {
    let status = |backend: &str, args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"))
            .args(["--backend", backend, "status"])
            .args(args)
            .env_remove("GPUREAP_BACKEND")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("gpureap runs");
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    };
    let mut cases = vec![("none", "--backend none: only processes")];
    // The automatic fallback, where this machine has no NVIDIA driver.
    let json = status("auto", &["--json"]);
    if json.contains("\"driver_error\": \"no NVIDIA driver found") {
        cases.push(("auto", "no NVIDIA driver found"));
    }
    for (backend, why) in cases {
        for args in [&[][..], &["--tree"]] {
            let text = status(backend, args);
            // Where processes hold /dev/nvidia* nodes (a GPU host), their GPUs
            // are listed first, and the note after them says it.
            if !text.contains(" GPU  NAME ") {
                assert!(
                    text.starts_with("No GPU driver: "),
                    "{backend} {args:?}:\n{text}"
                );
            }
            assert_eq!(
                text.matches(why).count(),
                1,
                "{backend} {args:?} says it more than once:\n{text}"
            );
            assert!(!text.contains("(none)"), "{backend} {args:?}:\n{text}");
        }
    }
}

/// Without a driver, `status` scans /proc while the (absent) driver opens
/// and numbers `/dev/nvidiaN` by its minor: an opener of `/dev/nvidia1` is
/// on GPU 1, one of `/dev/nvidiactl` only is on no GPU; `--gpu 1` and
/// `--gpu all` reach GPU 1, whose node is there. Run in a mount
/// namespace whose /dev is a tmpfs with plain files for the nodes (this
/// machine has no NVIDIA driver to open real ones).
#[test]
fn without_a_driver_dev_nvidia_openers_are_placed_by_minor() {
    let script = r#"
        mount -t tmpfs -o mode=755 gpureap-test-dev /dev && mknod -m 666 /dev/null c 1 3 \
            && : > /dev/nvidia1 && : > /dev/nvidiactl || exit 9
        sleep 30 < /dev/nvidia1 & gpu=$!
        sleep 30 3< /dev/nvidiactl & control=$!
        # Both have their node open before anything looks (20 s at most).
        n=0
        until [ "$(readlink /proc/$gpu/fd/0)" = /dev/nvidia1 ] \
            && [ "$(readlink /proc/$control/fd/3)" = /dev/nvidiactl ]; do
            n=$((n + 1)); [ $n -le 2000 ] || { kill $gpu $control; exit 7; }
            sleep 0.01
        done
        echo "$gpu $control"
        # The nodes say which GPUs there are: --gpu can name one.
        # Without a driver status cannot tell what is held: 3, the table still shown.
        "$GPUREAP" --backend none status --gpu 1 > /dev/null
        [ $? -eq 3 ] || { kill $gpu $control; exit 8; }
        # Nothing reports memory: wait says so at once instead of timing out as if held.
        timeout 20 "$GPUREAP" --backend none wait --gpu 1 --timeout 15s > /dev/null 2> /tmp/gpureap-test-wait.$$
        echo "wait exit $?" >&2
        cat /tmp/gpureap-test-wait.$$ >&2
        rm -f /tmp/gpureap-test-wait.$$
        "$GPUREAP" --backend none status --json --gpu all
        echo "status exit $?" >&2
        kill $gpu $control
    "#;
    let output = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .env("GPUREAP", env!("CARGO_BIN_EXE_gpureap"))
        .env_remove("GPUREAP_BACKEND")
        .output()
        .expect("unshare runs");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("wait exit 3") && stderr.contains("cannot wait"),
        "{stderr}"
    );
    assert!(stderr.contains("status exit 3"), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let (pids, json) = stdout.split_once('\n').expect("pids line");
    let pids: Vec<u64> = pids
        .split(' ')
        .map(|pid| pid.parse().expect("pid"))
        .collect();
    let status: serde_json::Value = serde_json::from_str(json).expect("json");
    let gpus = status["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 1, "{status:#}");
    assert_eq!(gpus[0]["index"], 1);
    let on_gpu: Vec<u64> = gpus[0]["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .map(|process| process["pid"].as_u64().expect("pid"))
        .collect();
    assert_eq!(on_gpu, [pids[0]], "{status:#}");
    for holder in status["holders"].as_array().expect("holders") {
        if holder["pid"] == pids[1] {
            assert_eq!(holder["gpus"], serde_json::json!([]), "{holder:#}");
        }
    }
}

/// The driver's error travels typed through the snapshot and is written as
/// the message it was before: a lost GPU in `status --json` (and its text),
/// `wait --json` and `check`, and no driver at all, byte for byte.
#[test]
fn a_driver_error_is_written_as_its_message() {
    const LOST: &str = "GPU 1 is lost (fallen off the bus or otherwise inaccessible)";
    let host = Sim::gpus(2).build();
    host.lose(1).expect("lost");
    let status = run(&host, &["status", "--json"]);
    let json = status.json();
    assert_eq!(
        json["gpus"][1],
        serde_json::json!({
            "index": 1,
            "name": null,
            "uuid": json["gpus"][1]["uuid"].clone(),
            "memory_total": null,
            "memory_used": null,
            "memory_reserved": null,
            "memory_unattributed": null,
            // Nor what it is doing: unknown, never 0.
            "utilization_percent": null,
            "temperature_celsius": null,
            "power_draw_watts": null,
            "power_limit_watts": null,
            "held_by_no_process": null,
            "unattributed_kind": null,
            "error": LOST,
            "processes": [],
            // A lost GPU is still named by its PCI address (its Xid 79 would be).
            "evidence": {
                "pci_bus_id": "00000000:02:00.0",
                "ecc_volatile_uncorrected": null,
                "ecc_aggregate_uncorrected": null,
                "retired_pages_pending": null,
                "row_remap_pending": null,
                "row_remap_failure": null,
                "recovery_action": null,
                "xid_counts": {},
                "xids": [],
            },
            "advice": [],
            // What the driver could not say of a lost GPU: its MIG mode.
            "mig_mode": null,
            "instances": [],
        }),
        "{}",
        status.stdout
    );
    assert_eq!(json["driver_error"], serde_json::Value::Null);
    let text = run(&host, &["status"]);
    assert_contains(&text.stdout, &format!("GPU 1 error: {LOST}"));
    let wait = run(&host, &["wait", "--gpu", "1", "--timeout", "1h", "--json"]);
    assert_eq!(wait.json()["gpus"][0]["error"], LOST, "{}", wait.stdout);

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"))
        .args(["--backend", "none", "status", "--json"])
        .env_remove("GPUREAP_BACKEND")
        .output()
        .expect("runs");
    let none: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(
        none["driver_error"], "--backend none: only processes with /dev/nvidia* open are shown",
        "{none:#}"
    );
}

/// Where the driver's lists leave memory unexplained (memory the driver
/// keeps for no listed process), `status` reads every process's descriptors
/// by itself, as `--monitors` does: the monitor is shown again. Where the
/// lists explain every byte, only the listed processes are inspected.
#[test]
fn memory_the_lists_do_not_explain_makes_status_read_every_process() {
    let (host, mut incident) = Sim::gpus(2).stage();
    let server =
        incident.hold(Holder::new("python3 -m vllm.entrypoints.openai.api_server").on(0, 20 * GIB));
    let exporter = incident.hold(Holder::new("gpu_exporter --port 9400"));
    let pids = |status: &serde_json::Value| -> Vec<u64> {
        status["holders"]
            .as_array()
            .expect("holders")
            .iter()
            .map(|holder| holder["pid"].as_u64().expect("pid"))
            .collect()
    };
    let explained = run(&host, &["status", "--json"]);
    assert_eq!(explained.code, 0, "{}", explained.stderr);
    let explained = explained.json();
    assert_eq!(explained["scan"]["descriptors"], "listed", "{explained:#}");
    assert_eq!(pids(&explained), [u64::from(server)], "{explained:#}");

    host.leak(1, 2 * GIB).expect("leak");
    let unexplained = run(&host, &["status", "--json"]).json();
    assert_eq!(unexplained["scan"]["descriptors"], "all", "{unexplained:#}");
    assert_eq!(unexplained["gpus"][1]["held_by_no_process"], true);
    let mut expected = vec![u64::from(server), u64::from(exporter)];
    expected.sort_unstable();
    assert_eq!(pids(&unexplained), expected, "{unexplained:#}");
    let table = run(&host, &["status"]);
    assert!(
        !table.stdout.contains("Monitors not looked for"),
        "{}",
        table.stdout
    );
    assert!(
        holder_rows(&table.stdout)
            .iter()
            .any(|row| row.pid == exporter && row.flags == "monitor"),
        "{}",
        table.stdout
    );
}

/// Each GPU's hardware evidence in status: the staged Xid (the kernel's
/// facility only), ECC and row-remap counters, `null` for what the driver
/// does not say, and the advice, in the JSON and as notes under the table.
#[test]
fn status_shows_each_gpus_hardware_evidence_and_its_advice() {
    let host = Sim::gpus(2).build();
    host.leak(1, 3 * GIB).expect("leak");
    host.xid(
        1,
        48,
        3_000_000,
        "An uncorrectable double bit error (DBE) has been detected",
    )
    .expect("xid 48");
    host.xid(1, 79, 4_000_000, "GPU has fallen off the bus.")
        .expect("xid 79");
    // Forged by a user (facility 1), with an escape sequence: never counted.
    host.log_kernel(
        12,
        5_000_000,
        "NVRM: Xid (PCI:0000:01:00): 95, \u{1b}[31mforged",
    )
    .expect("forged");
    host.health(1, "ecc_volatile_uncorrected 2\nrow_remap_pending yes\n")
        .expect("health");
    let result = run(&host, &["status", "--json"]);
    assert_eq!(result.code, 0, "{}", result.stderr);
    let document: serde_json::Value = serde_json::from_str(&result.stdout).expect("json");
    let gpu0 = &document["gpus"][0];
    assert_eq!(gpu0["evidence"]["pci_bus_id"], "00000000:01:00.0");
    assert_eq!(gpu0["evidence"]["xids"], serde_json::json!([]));
    assert_eq!(
        gpu0["evidence"]["ecc_volatile_uncorrected"],
        serde_json::Value::Null
    );
    assert_eq!(gpu0["advice"], serde_json::json!([]));
    let gpu1 = &document["gpus"][1];
    assert_eq!(
        gpu1["evidence"]["xid_counts"],
        serde_json::json!({"48": 1, "79": 1})
    );
    assert_eq!(gpu1["evidence"]["xids"][0]["xid"], 79);
    assert_eq!(gpu1["evidence"]["xids"][0]["since_boot_us"], 4_000_000);
    assert_eq!(gpu1["evidence"]["ecc_volatile_uncorrected"], 2);
    assert_eq!(gpu1["evidence"]["row_remap_pending"], true);
    assert_eq!(
        gpu1["evidence"]["row_remap_failure"],
        serde_json::Value::Null
    );
    let advice = gpu1["advice"][0].as_str().unwrap_or_default();
    assert!(
        advice.starts_with("Xid 79 at ")
            && advice.ends_with("a reset will not help; reboot the node"),
        "{advice}"
    );
    let table = run(&host, &["status"]);
    assert_contains(&table.stdout, "GPU 1: Xid 79 at ");
    assert!(
        table
            .stdout
            .contains("GPU 1: row remap pending: reset the GPU")
    );
    assert!(!table.stdout.contains('\u{1b}'));
}

/// A user's write to the real /dev/kmsg carries facility 1 whatever
/// priority it claims: the record is in the log (read raw), and the reader
/// does not count it.
#[test]
fn a_forged_xid_written_to_the_real_dev_kmsg_does_not_count() {
    use std::io::Write as _;
    let token = format!("gpureap-test-{}-{}", std::process::id(), past_nanos());
    let line = format!(
        "<3>NVRM: Xid (PCI:0000:ee:00): 79, pid=1, name={token}, GPU has fallen off the bus.\n"
    );
    let written = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .and_then(|mut kmsg| kmsg.write_all(line.as_bytes()));
    if let Err(error) = written {
        return skip(&format!("cannot write /dev/kmsg: {error}"));
    }
    let raw = match raw_kmsg_records() {
        Ok(records) => records,
        Err(error) => return skip(&format!("cannot read /dev/kmsg: {error}")),
    };
    let record = raw
        .iter()
        .find(|record| record.contains(&token))
        .expect("the forged record is in the log");
    let prio: u32 = record
        .split(',')
        .next()
        .and_then(|prio| prio.parse().ok())
        .expect("prio");
    assert_eq!(prio >> 3, 1, "facility user: {record}");
    let events =
        gpureap_core::driver::evidence::read_kmsg(std::path::Path::new("/dev/kmsg")).expect("read");
    assert!(
        !events
            .iter()
            .any(|event| event.name.as_deref() == Some(token.as_str())),
        "the forged Xid counted"
    );
}

fn past_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos())
}

/// Every record /dev/kmsg holds now, raw (one read each, to EAGAIN).
fn raw_kmsg_records() -> std::io::Result<Vec<String>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut kmsg = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_nonblock())
        .open("/dev/kmsg")?;
    let mut records = Vec::new();
    let mut buffer = vec![0u8; 16 << 10];
    loop {
        match kmsg.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => records.push(String::from_utf8_lossy(&buffer[..read]).into_owned()),
            Err(error) if error.raw_os_error() == Some(32) => continue,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(error) => return Err(error),
        }
    }
    Ok(records)
}

/// O_NONBLOCK.
fn libc_nonblock() -> i32 {
    0o4000
}

/// A kernel log of 40 MiB is read from its end within a bound, its newest
/// Xid found; one that is a FIFO is a note, never a hang.
#[test]
fn a_huge_or_hostile_kernel_log_is_read_bounded() {
    use std::io::Write as _;
    let host = Sim::gpus(1).build();
    {
        let mut file = std::fs::File::create(host.path().join("kmsg")).expect("kmsg");
        let junk = "3,1,1,-;NVRM: Xid (PCI:0000:01:00): 13, \u{1b}[2J garbage\n4,2,2,-;unrelated line\n\u{0}\u{7f}\u{1b}\n";
        let block = junk.repeat((1 << 20) / junk.len());
        for _ in 0..40 {
            file.write_all(block.as_bytes()).expect("write");
        }
    }
    host.xid(0, 79, 99_000_000, "GPU has fallen off the bus.")
        .expect("xid");
    let started = std::time::Instant::now();
    let result = run(&host, &["status", "--json"]);
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let document: serde_json::Value = serde_json::from_str(&result.stdout).expect("json");
    let evidence = &document["gpus"][0]["evidence"];
    assert_eq!(evidence["xids"][0]["xid"], 79);
    // The newest 1024 Xids of the last 16 MiB, not the 40 MiB's.
    let thirteen = evidence["xid_counts"]["13"].as_u64().unwrap_or_default();
    assert_eq!(thirteen, 1023, "{evidence}");
    let text = run(&host, &["status"]);
    assert!(!text.stdout.contains('\u{1b}'));

    std::fs::remove_file(host.path().join("kmsg")).expect("rm");
    let fifo = std::process::Command::new("mkfifo")
        .arg(host.path().join("kmsg"))
        .status()
        .expect("mkfifo");
    assert!(fifo.success());
    let result = run(&host, &["status"]);
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert_contains(&result.stdout, "not read: not a plain file");
}

/// The figures of the last line of `status --json` with `GPUREAP_LOG=debug`
/// ("memory at exit"), by name, the log's colours taken out.
fn memory_at_exit(
    host: &SimHost,
    env: &[(&str, &str)],
    args: &[&str],
) -> (String, Vec<(String, u64)>) {
    let run: Run = gpureap(host)
        .env("GPUREAP_LOG", "gpureap=debug")
        .envs(env.iter().copied())
        .args(args)
        .output()
        .expect("status runs")
        .into();
    assert_eq!(run.code, 0, "{}", run.stderr);
    exit_figures(&run.stderr)
}

/// The last line of a debug log, the memory at exit, and its figures.
fn exit_figures(stderr: &str) -> (String, Vec<(String, u64)>) {
    // ANSI escapes: `ESC [ ... m`.
    let last = stderr.lines().last().unwrap_or_default();
    let line: String = last
        .split('\x1b')
        .map(|part| {
            part.strip_prefix('[')
                .map_or(part, |p| p.split_once('m').map_or(p, |(_, rest)| rest))
        })
        .collect();
    assert!(line.contains("memory at exit"), "{stderr}");
    let figures = line
        .split_whitespace()
        .filter_map(|word| {
            let (name, value) = word.split_once('=')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect();
    (line, figures)
}

fn figure(figures: &[(String, u64)], name: &str) -> u64 {
    figures
        .iter()
        .find(|(named, _)| named == name)
        .map(|(_, value)| *value)
        .unwrap_or_else(|| panic!("no {name} in {figures:?}"))
}

/// With `GPUREAP_LOG=debug`, the process's memory at exit is logged last
/// (peak and current resident memory, anonymous, file-backed, shared), with
/// figures that agree with each other; without it, nothing of it is said.
#[test]
fn debug_logs_the_memory_at_exit() {
    let host = Sim::gpus(1).build();
    let (line, figures) = memory_at_exit(&host, &[], &["status", "--json"]);
    let at = |name| figure(&figures, name);
    let parts = at("rss_anon_kib") + at("rss_file_kib") + at("rss_shmem_kib");
    let (hwm, rss) = (at("vm_hwm_kib"), at("vm_rss_kib"));
    assert!(hwm >= rss && rss > 1024 && parts == rss, "{line}");
    let quiet: Run = gpureap(&host)
        .args(["status", "--json"])
        .output()
        .expect("status runs")
        .into();
    assert!(!quiet.stderr.contains("memory at exit"), "{}", quiet.stderr);
}

/// glibc's malloc is held to one arena in the modes left running (here the
/// exporter, whose scans of /proc run on several threads once there are
/// enough processes: each would get an arena of its own, and keep it); a cap
/// the environment sets (MALLOC_ARENA_MAX, GLIBC_TUNABLES) stands. A
/// one-shot command keeps glibc's arenas: its scanning threads would queue
/// on one arena's lock (`status --monitors` below).
#[test]
fn modes_left_running_allocate_from_one_malloc_arena_unless_told_otherwise() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return skip("one core: the /proc scan runs on one thread");
    }
    let host = Sim::gpus(1).build();
    // More than 256 processes: the scan takes a second thread.
    let _crowd = crate::incidents::Crowd::new(300);
    let (line, figures) = memory_at_exit(&host, &[], &["status", "--json", "--monitors"]);
    if !figures.iter().any(|(name, _)| name == "malloc_arenas") {
        return skip("not glibc: no malloc arenas to count");
    }
    assert!(
        figure(&figures, "malloc_arenas") > 1,
        "a one-shot status: {line}"
    );
    let (line, figures) = exporter_memory_at_exit(&host, &[]);
    assert_eq!(figure(&figures, "malloc_arenas"), 1, "{line}");
    for told in [
        ("MALLOC_ARENA_MAX", "8"),
        ("GLIBC_TUNABLES", "glibc.malloc.arena_max=8"),
    ] {
        let (line, figures) = exporter_memory_at_exit(&host, &[told]);
        assert!(figure(&figures, "malloc_arenas") > 1, "{told:?}: {line}");
    }
}

/// The exporter's memory at exit, once it has scanned twice (SIGTERM ends it
/// through the same exit as every command).
fn exporter_memory_at_exit(host: &SimHost, env: &[(&str, &str)]) -> (String, Vec<(String, u64)>) {
    use std::io::BufRead;
    let mut child = gpureap(host)
        .env("GPUREAP_LOG", "gpureap=debug")
        .envs(env.iter().copied())
        .args(["exporter", "--listen", "127.0.0.1:0", "--interval", "100ms"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("exporter starts");
    let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut text = String::new();
    let mut line = String::new();
    while text.matches(" snapshot ").count() < 2 {
        line.clear();
        if stderr.read_line(&mut line).expect("stderr") == 0 {
            panic!("the exporter ended: {text}");
        }
        text.push_str(&line);
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .expect("SIGTERM");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).expect("stderr");
    let _ = child.wait();
    text.push_str(&rest);
    exit_figures(&text)
}

/// What nvitop and nvtop show first: each GPU's utilization, temperature
/// and power (of its limit), and each process's SM utilization, where the
/// driver says; `null` (never 0) and `?` where it does not. The memory the
/// driver reserves is beside the used figure, which leaves it out.
#[test]
fn status_shows_each_gpus_activity_and_reserved_memory_where_the_driver_says() {
    use gpureap_core::driver::sim::incident::H100_RESERVED;
    let host = Sim::gpus(2).named("NVIDIA H100 80GB HBM3").build();
    host.reserve(H100_RESERVED).expect("reserved");
    let mut incident = Incident::new(&host);
    let busy = incident.hold(scheduler(0, 30 * GIB));
    let idle = incident.hold(Holder::new("sglang::scheduler_TP1").on(0, 10 * GIB));
    host.activity(
        0,
        &format!(
            "utilization 87\ntemperature 64\npower 312.4\npower_limit 700\nprocess_sm {busy} 41\n"
        ),
    )
    .expect("activity");
    host.activity(1, "temperature 33\n").expect("activity");

    let status = run(&host, &["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let document = status.json();
    crate::schema::conforms(&crate::schema::schema(), "status", &document);
    let gpu0 = gpu(&document, 0);
    assert_eq!(gpu0["utilization_percent"], 87, "{gpu0:#}");
    assert_eq!(gpu0["temperature_celsius"], 64);
    assert_eq!(gpu0["power_draw_watts"], 312.4);
    assert_eq!(gpu0["power_limit_watts"], 700.0);
    assert_eq!(gpu0["memory_reserved"], H100_RESERVED);
    assert_eq!(
        gpu0["memory_used"],
        40 * GIB,
        "reserved memory is not used memory"
    );
    let sm = |pid: u32| {
        gpu0["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|process| process["pid"] == pid)
            .map(|process| process["sm_utilization_percent"].clone())
            .expect("listed")
    };
    assert_eq!(sm(busy), 41);
    // Listed, and left out of the driver's samples: it used no SM.
    assert_eq!(sm(idle), 0);
    let holder = document["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .find(|holder| holder["pid"] == busy)
        .expect("busy holder");
    assert_eq!(holder["gpus"][0]["sm_utilization_percent"], 41);
    // GPU 1: only its temperature is said; nothing else becomes 0.
    let gpu1 = gpu(&document, 1);
    assert_eq!(gpu1["temperature_celsius"], 33);
    for unknown in [
        "utilization_percent",
        "power_draw_watts",
        "power_limit_watts",
    ] {
        assert!(gpu1[unknown].is_null(), "{unknown}: {gpu1:#}");
    }

    let table = run(&host, &["status"]);
    let header = table.stdout.lines().next().expect("GPU header");
    assert!(
        header.contains("UTIL") && header.contains("TEMP") && header.contains("POWER"),
        "{}",
        table.stdout
    );
    let line = |index: &str| {
        table
            .stdout
            .lines()
            .find(|line| line.split_whitespace().next() == Some(index))
            .unwrap_or_else(|| panic!("GPU {index}:\n{}", table.stdout))
            .to_string()
    };
    let gpu0 = line("0");
    assert!(
        gpu0.contains("87%") && gpu0.contains("64°C") && gpu0.contains("312/700 W"),
        "{}",
        table.stdout
    );
    let gpu1 = line("1");
    assert!(
        gpu1.contains("33°C") && gpu1.contains("?/? W"),
        "{}",
        table.stdout
    );
    assert!(!gpu1.contains("0%"), "{}", table.stdout);
}

/// A driver that says nothing of activity: `null` in JSON, and the table
/// as it was (no columns of question marks).
#[test]
fn status_without_activity_says_null_and_keeps_its_table() {
    let (host, mut incident) = Sim::gpus(1).stage();
    incident.hold(Holder::new("python3 train.py").on(0, 2 * GIB));
    let document = run(&host, &["status", "--json"]).json();
    let gpu0 = gpu(&document, 0);
    for unknown in [
        "utilization_percent",
        "temperature_celsius",
        "power_draw_watts",
        "power_limit_watts",
        "memory_reserved",
    ] {
        assert!(gpu0[unknown].is_null(), "{unknown}: {gpu0:#}");
    }
    assert!(gpu0["processes"][0]["sm_utilization_percent"].is_null());
    let table = run(&host, &["status"]).stdout;
    assert!(!table.contains("UTIL"), "{table}");
}

/// A holder the kernel started through an emulator registered in binfmt_misc with the
/// preserve-argv0 flag (qemu-user running another architecture's binary, as on an x86_64 host
/// running the aarch64 gpureap) is named by its own command line, not the emulator's
/// `INTERPRETER PATH ARGV0 ARGS`: the kernel marks such a start in the process's auxiliary
/// vector, which gpureap reads. The emulator here is Python under a name of qemu's, in a
/// binfmt_misc of a user namespace's own (Linux 6.7 and later), so nothing of the host's
/// changes. The same command line started directly, without the mark, stays whole.
#[test]
fn a_holder_run_by_an_emulator_through_binfmt_misc_is_named_by_its_own_command_line() {
    let python = match std::fs::canonicalize("/usr/bin/python3") {
        Ok(python) => python,
        Err(_) => return skip("no /usr/bin/python3"),
    };
    if let Some(why) = no_binfmt_misc_of_our_own() {
        return skip(&why);
    }
    let (host, _incident) = Sim::gpus(1).stage();
    let work = tempfile::tempdir().expect("tempdir");
    let emulator = work.path().join("qemu-x86_64");
    std::os::unix::fs::symlink(&python, &emulator).expect("symlink");
    // Holds GPU 0 as a stand-in does (its claim, then the nodes), then waits for its stdin.
    let program = work.path().join("scheduler.gpureaptest");
    std::fs::write(
        &program,
        format!(
            "import os, sys\n\
             d = {dir:?}\n\
             open(f'{{d}}/claims/{{os.getpid()}}.0', 'w').write('{bytes}')\n\
             nodes = [open(f'{{d}}/nvidia0'), open(f'{{d}}/nvidiactl')]\n\
             print('ready', flush=True)\n\
             sys.stdin.read()\n",
            dir = host.path().display().to_string(),
            bytes = 3 * GIB,
        ),
    )
    .expect("program");
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let start = |script: &str| -> Child {
        let mut child = Command::new("unshare")
            .args(["--user", "--map-root-user", "--mount", "bash", "-c", script])
            .arg("bash")
            .arg(&emulator)
            .arg(&program)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("unshare");
        let mut ready = String::new();
        let read = BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut ready);
        if ready.trim() != "ready" {
            let _ = child.kill();
            let output = child.wait_with_output().expect("wait");
            panic!(
                "{read:?} {ready:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        child
    };
    let mut emulated = start(
        "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc && \
         echo \":gpureaptest:E::gpureaptest::$1:FP\" > /proc/sys/fs/binfmt_misc/register && \
         exec -a sglang::scheduler_TP0 \"$2\" --tp-size 1",
    );
    let mut direct = start("exec -a \"$1\" \"$1\" \"$2\" sglang::scheduler_TP0 --tp-size 1");
    let json = run(&host, &["status", "--json"]).json();
    assert_eq!(
        holder_of(&json, emulated.id())["cmdline"],
        "sglang::scheduler_TP0 --tp-size 1"
    );
    assert_eq!(
        holder_of(&json, direct.id())["cmdline"],
        format!(
            "{} {} sglang::scheduler_TP0 --tp-size 1",
            emulator.display(),
            program.display()
        )
    );
    let table = run(&host, &["status"]);
    assert!(
        table
            .stdout
            .lines()
            .any(|line| line.contains(&format!(" {} ", emulated.id()))
                && line.contains("sglang::scheduler_TP0")),
        "{}",
        table.stdout
    );
    for child in [&mut emulated, &mut direct] {
        drop(child.stdin.take());
        assert!(child.wait().expect("wait").success());
    }
}
