//! What `status` shows: who uses which GPU, how much, since when, and how
//! sure it is, in a table that fits 120 columns.

use gpureap::driver::sim::incident::{Holder, Incident, SimHost};
use gpureap::units::Bytes;

use crate::harness::*;

fn host(gpus: u32) -> SimHost {
    SimHost::new(gpus, 80 * GIB, "Simulated H200").expect("sim host")
}

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
    let host = SimHost::new(8, 141 * GIB, "NVIDIA H200 (simulated)").expect("sim host");
    let mut incident = Incident::new(&host);
    let memory = |rank: u32| 70 * GIB + u64::from(rank) * GIB / 4;
    // As CUDA does: every worker has all eight nodes open, a context on its own GPU only.
    let workers: Vec<Holder> = (0..8)
        .map(|rank| Holder::new(&format!("sglang::scheduler_TP{rank}")).on(rank, memory(rank)))
        .collect();
    incident.sglang(&workers).expect("sglang tree");
    let tp: Vec<u32> = (0..8)
        .map(|rank| {
            incident
                .pid_of(&format!("sglang::scheduler_TP{rank}"))
                .expect("worker")
        })
        .collect();
    let notebook_title = "jupyter-kernel --notebook /home/colleague/experiments/long-context-ablation-2026-11/analysis-of-the-results.ipynb";
    let notebook = incident
        .holder(&Holder::new(notebook_title).on(3, 6 * GIB))
        .expect("notebook");
    let exporter = incident
        .holder(&Holder::new("gpu_exporter --port 9400"))
        .expect("exporter");

    let table = run(&host, &["status"]);
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
    let holder = |pid: u32| {
        status["holders"]
            .as_array()
            .expect("holders")
            .iter()
            .find(|holder| holder["pid"] == pid)
            .unwrap_or_else(|| panic!("{pid} not listed: {status:#}"))
            .clone()
    };
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

    // GPU 3's users are the ones the driver lists there; the exporter watches it.
    let only_3 = run(&host, &["status", "--gpu", "3"]);
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
    let host = host(2);
    let mut incident = Incident::new(&host);
    let worker = incident
        .holder(&Holder::new("sglang::scheduler_TP0").on(0, 40 * GIB))
        .expect("worker");
    let watcher = incident
        .holder(&Holder::new("gpu_exporter --port 9400"))
        .expect("exporter");
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
    assert!(
        table.stdout.contains("weaker evidence") && table.stdout.contains("GPU 1 is lost"),
        "{}",
        table.stdout
    );
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
    let host = host(1);
    let mut incident = Incident::new(&host);
    let holder = incident
        .holder(&Holder::new("python3 serve.py").on(0, 4 * GIB))
        .expect("holder");
    std::fs::write(host.path().join(format!("claims/{holder}.0")), "unknown").expect("claim");

    let table = run(&host, &["status"]);
    let rows = holder_rows(&table.stdout);
    let row = rows_of(&rows, holder);
    assert_eq!(
        (row[0].gpu.as_str(), row[0].memory.as_str()),
        ("0", "unknown")
    );
    assert!(
        table.stdout.contains("reports no memory figure") && table.stdout.contains("MIG"),
        "{}",
        table.stdout
    );
    assert!(!table.stdout.contains("not running as root"));
    let as_nobody = run_as_nobody(&host, &["status"]);
    assert!(
        as_nobody.stdout.contains("gpureap is not running as root"),
        "{}",
        as_nobody.stdout
    );
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
    let host = host(1);
    let mut incident = Incident::new(&host);
    let holder = incident
        .holder(&Holder::new("python3 young.py").on(0, GIB))
        .expect("holder");
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
    let host = host(1);
    let mut incident = Incident::new(&host);
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
    let host = host(2);
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
            "memory_unattributed": null,
            "held_by_no_process": null,
            "error": LOST,
            "processes": [],
        }),
        "{}",
        status.stdout
    );
    assert_eq!(json["driver_error"], serde_json::Value::Null);
    let text = run(&host, &["status"]);
    assert!(
        text.stdout.contains(&format!("GPU 1 error: {LOST}")),
        "{}",
        text.stdout
    );
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
