//! Real `status`, `free` and `wait` documents against the JSON Schema kept in
//! docs/json.schema.json: a field renamed, retyped, added or dropped in the
//! program shows here before it reaches a user's script.

use gpureap_core::driver::sim::incident::Holder;
use serde_json::Value;

use crate::harness::*;

pub(crate) fn schema() -> jsonschema::Validator {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/json.schema.json"
    ))
    .expect("docs/json.schema.json");
    let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    jsonschema::validator_for(&schema).expect("the schema is a valid JSON Schema")
}

pub(crate) fn conforms(validator: &jsonschema::Validator, what: &str, document: &Value) {
    let errors: Vec<String> = validator
        .iter_errors(document)
        .map(|error| format!("{} at {}", error, error.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{what} does not match docs/json.schema.json:\n{}\n{document:#}",
        errors.join("\n")
    );
}

#[test]
fn every_document_matches_the_published_schema() {
    let validator = schema();
    let (host, mut incident) = Sim::gpus(3).stage();
    let launcher = incident
        .sglang(&[
            scheduler(0, 30 * GIB),
            scheduler(1, 30 * GIB).ignoring_sigterm(),
        ])
        .expect("sglang");
    incident.hold(Holder::new("jupyter-kernel colleague").on(1, 5 * GIB));
    incident.hold(Holder::new("gpu_exporter --port 9400"));
    incident.hold(Holder::new("nvidia-smi").on(0, GIB));
    incident.hold(Holder::new("python3 lost.py").on(2, GIB));
    incident.kill(launcher).expect("kill launcher");
    host.leak(1, 3 * GIB).expect("leak");
    host.lose(2).expect("lose GPU 2");
    // Hardware evidence: an Xid for the lost GPU, ECC and row remapping on GPU 1.
    host.xid(2, 79, 9_000_000, "GPU has fallen off the bus.")
        .expect("xid");
    host.health(
        1,
        "ecc_volatile_uncorrected 2\necc_aggregate_uncorrected 5\nrow_remap_pending yes\nrecovery_action gpu_reset\n",
    )
    .expect("health");

    let mut documents = vec![
        ("status", run(&host, &["status", "--json"])),
        (
            "reset --plan",
            run(&host, &["reset", "--plan", "--gpu", "all", "--json"]),
        ),
        (
            "status --gpu 1",
            run(&host, &["status", "--gpu", "1", "--json"]),
        ),
        (
            "free --dry-run",
            run(&host, &["free", "--all", "--dry-run", "--json"]),
        ),
        (
            "wait (timed out)",
            run(
                &host,
                &["wait", "--gpu", "0,1", "--timeout", "100ms", "--json"],
            ),
        ),
        (
            "free",
            run(&host, &free_json(&["--gpu", "0-2"], "200ms", "300ms")),
        ),
    ];
    documents.push((
        "wait (ready)",
        run(
            &host,
            &[
                "wait",
                "--gpu",
                "0",
                "--below",
                "80GiB",
                "--timeout",
                "1s",
                "--json",
            ],
        ),
    ));
    documents.push(("status (no driver)", {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"))
            .args(["--backend", "none", "status", "--json"])
            .env_remove("GPUREAP_BACKEND")
            .output()
            .expect("runs");
        Run::from(output)
    }));
    let mut reasons = std::collections::BTreeSet::new();
    for (what, result) in &documents {
        let document = result.json();
        conforms(&validator, what, &document);
        for gpu in document["gpus"].as_array().into_iter().flatten() {
            for reason in gpu["reasons"].as_array().into_iter().flatten() {
                reasons.insert(reason["reason"].as_str().unwrap_or("").to_string());
            }
        }
    }
    // The documents above carry these reasons: the schema was checked on them.
    for reason in ["driver_held", "driver_error", "protected"] {
        assert!(
            reasons.contains(reason),
            "no {reason} reason in {reasons:?}"
        );
    }

    // And the check can fail: a renamed field is caught.
    let mut renamed = documents[0].1.json();
    let holder = renamed["holders"][0].as_object_mut().expect("holder");
    let cmdline = holder.remove("cmdline").expect("cmdline");
    holder.insert("command_line".to_string(), cmdline);
    assert!(
        !validator.is_valid(&renamed),
        "a renamed field passed the schema"
    );
}

#[test]
fn fleet_documents_match_the_published_schema() {
    use crate::sshd_lab::{Kind, Lab};
    let validator = schema();
    let lab = Lab::new(&[Kind::Up, Kind::Refusing]);
    lab.hold("h1", &scheduler(0, 30 * GIB).ignoring_sigterm());
    lab.host("h1").sim.leak(1, 3 * GIB).expect("leak");
    let runs = [
        ("status -H", lab.run(&["status", "-H", "h1,h2", "--json"])),
        (
            "free -H --dry-run",
            lab.run(&["free", "-H", "h1,h2", "--all", "--dry-run", "--json"]),
        ),
        (
            "wait -H",
            lab.run(&["wait", "-H", "h1,h2", "--timeout", "100ms", "--json"]),
        ),
        (
            "free -H",
            lab.run(&[
                "free",
                "-H",
                "h1,h2",
                "--gpu",
                "0,1",
                "--grace",
                "100ms",
                "--timeout",
                "300ms",
                "--yes",
                "--json",
            ]),
        ),
    ];
    for (what, run) in &runs {
        let document = run.json();
        assert_eq!(document["kind"], "fleet", "{what}");
        conforms(&validator, what, &document);
    }
    let push: Run = lab.run_as_given(&["push", "-H", "h1,h2", "--json"]);
    let document = push.json();
    assert_eq!(
        document["hosts"][0]["report"]["kind"], "push",
        "{document:#}"
    );
    conforms(&validator, "push -H", &document);
    // The host's own report is checked too: a broken one fails the fleet document.
    let mut broken = runs[0].1.json();
    broken["hosts"][0]["report"]["gpus"] = Value::from("not a list");
    assert!(!validator.is_valid(&broken), "a broken host report passed");
    // Every reason carries the sentence `free` prints for it.
    let free = runs[3].1.json();
    let reasons = free["hosts"][0]["report"]["gpus"][1]["reasons"].clone();
    assert_eq!(reasons[0]["reason"], "driver_held", "{free:#}");
    assert!(
        reasons[0]["text"]
            .as_str()
            .is_some_and(|text| !text.is_empty())
    );
}
