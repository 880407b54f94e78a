//! MIG instances on the simulated driver (docs/mig.md): listed under their
//! GPU, named by `G:I` and `MIG-<uuid>` where a GPU is named, freed and
//! verified one instance at a time, and bad names refused before anything
//! is signalled. The Slurm hooks with MIG UUIDs are in tests/slurm.rs.

use std::fs;

use gpureap_core::driver::sim::incident::{Holder, Incident, SimHost};

use crate::exporter::{samples, value};
use crate::harness::*;
use crate::held_by_no_process::wait_until;
use crate::schema::{conforms, schema};

/// Two GPUs; GPU 0 in MIG mode with instances 0:0 (1g.18gb) and 0:1 (3g.71gb).
fn mig_host() -> SimHost {
    let host = Sim::gpus(2).named("NVIDIA H200").build();
    fs::write(
        host.path().join("mig.0"),
        "1 0 1g.18gb 19327352832\n2 0 3g.71gb 76235669504 MIG-3f0e2b1c-aaaa-bbbb-cccc-000000000001\n",
    )
    .expect("mig.0");
    host
}

/// Stages a holder whose context is on MIG instance `instance` of `gpu`.
fn on_instance(incident: &mut Incident, title: &str, gpu: u32, instance: u32, bytes: u64) -> u32 {
    let script = Holder::new(title).on(gpu, bytes).script().replace(
        &format!("echo {bytes} > \"$D/claims/$BASHPID.{gpu}\""),
        &format!("echo {instance}:{bytes} > \"$D/claims/$BASHPID.{gpu}\""),
    );
    incident.spawn(&script, 1).expect("holder");
    incident.pid_of(title).expect("recorded")
}

fn free(host: &SimHost, gpu: &str) -> Run {
    run(host, &free_json(&["--gpu", gpu], "2s", "60s"))
}

#[test]
fn instances_are_listed_under_their_gpu_with_their_holders_and_memory() {
    let host = mig_host();
    let mut incident = Incident::new(&host);
    let small = on_instance(&mut incident, "mig_small", 0, 0, 2 * GIB);
    let big = on_instance(&mut incident, "mig_big", 0, 1, 5 * GIB);
    fs::write(host.path().join("leak.0.1"), GIB.to_string()).expect("leak");

    let status = run(&host, &["status", "--json"]).json();
    conforms(&schema(), "status with MIG", &status);
    let gpu = &status["gpus"][0];
    assert_eq!(gpu["mig_mode"], true, "{gpu:#}");
    assert_eq!(status["gpus"][1]["mig_mode"], false);
    let instances = gpu["instances"].as_array().expect("instances");
    assert_eq!(instances.len(), 2, "{gpu:#}");
    let big_one = &instances[1];
    assert_eq!(big_one["name"], "0:1");
    assert_eq!(big_one["gpu_instance_id"], 2);
    assert_eq!(big_one["compute_instance_id"], 0);
    assert_eq!(big_one["profile"], "3g.71gb");
    assert_eq!(big_one["uuid"], "MIG-3f0e2b1c-aaaa-bbbb-cccc-000000000001");
    assert_eq!(big_one["memory_total"], 76235669504u64);
    assert_eq!(big_one["memory_used"], 6 * GIB);
    assert_eq!(big_one["processes"][0]["pid"], big);
    assert_eq!(big_one["processes"][0]["memory"], 5 * GIB);
    // Held by no process, judged per instance: 0:1's gigabyte, not 0:0.
    assert_eq!(big_one["memory_unattributed"], GIB);
    assert_eq!(big_one["held_by_no_process"], true);
    assert_eq!(instances[0]["held_by_no_process"], false);
    assert_eq!(instances[0]["uuid"], "MIG-sim-00000000-0000");
    // The parent: its holders' memory read from their instances.
    assert_eq!(gpu["memory_used"], 8 * GIB);
    assert_eq!(gpu["memory_unattributed"], GIB);
    let holder = status["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .find(|holder| holder["pid"] == small)
        .expect("the small holder is listed");
    assert_eq!(holder["gpus"][0]["mig_instances"], serde_json::json!([0]));
    assert_eq!(holder["gpus"][0]["memory"], 2 * GIB);

    let table = run(&host, &["status"]);
    assert_contains(&table.stdout, "0:1  MIG 3g.71gb (gi 2, ci 0)");
    assert!(
        table
            .stdout
            .lines()
            .any(|line| line.trim_start().starts_with(&format!("0:1  {big}"))),
        "{}",
        table.stdout
    );
    let tree = run(&host, &["status", "--tree"]);
    assert!(tree.stdout.contains("GPU 0:0: 2.0 GiB"), "{}", tree.stdout);

    // The exporter: one series per instance, labelled with its ids and profile.
    let exposition = run(&host, &["status", "--prometheus"]);
    let found = samples(&exposition.stdout);
    let on = [
        ("gpu", "0"),
        ("instance", "0:1"),
        ("gpu_instance", "2"),
        ("compute_instance", "0"),
        ("profile", "3g.71gb"),
    ];
    let figure = |name: &str| value(&found, name, &on);
    assert_eq!(
        figure("gpureap_mig_instance_memory_used_bytes"),
        Some((6 * GIB) as f64),
        "{}",
        exposition.stdout
    );
    assert_eq!(
        figure("gpureap_mig_instance_memory_unattributed_bytes"),
        Some(GIB as f64)
    );
    assert_eq!(figure("gpureap_mig_instance_held_by_no_process"), Some(1.0));
    assert_eq!(figure("gpureap_mig_instance_holders"), Some(1.0));
    assert_eq!(
        value(&found, "gpureap_gpu_mig_mode", &[("gpu", "0")]),
        Some(1.0)
    );
    assert_eq!(
        value(&found, "gpureap_gpu_mig_mode", &[("gpu", "1")]),
        Some(0.0)
    );
    assert_eq!(
        value(
            &found,
            "gpureap_mig_instance_held_by_no_process",
            &[("instance", "0:0")]
        ),
        Some(0.0)
    );
}

#[test]
fn free_of_an_instance_signals_only_its_holders_and_verifies_its_memory() {
    let host = mig_host();
    let mut incident = Incident::new(&host);
    let neighbour = on_instance(&mut incident, "mig_neighbour", 0, 0, 2 * GIB);
    let target = on_instance(&mut incident, "mig_target", 0, 1, 5 * GIB);
    // Memory held by no process on the neighbour's instance: not 0:1's.
    fs::write(host.path().join("leak.0.0"), GIB.to_string()).expect("leak");

    let freed = free(&host, "0:1");
    let report = freed.json();
    conforms(&schema(), "free --gpu 0:1", &report);
    assert_eq!(freed.code, 0, "{}{}", freed.stdout, freed.stderr);
    assert_eq!(target_pids(&report), vec![target], "{report:#}");
    assert!(!signals(&report, target).is_empty(), "{report:#}");
    assert!(signals(&report, neighbour).is_empty(), "{report:#}");
    assert!(alive(neighbour), "the neighbour on 0:0 survives");
    assert!(!alive(target), "the holder of 0:1 is gone");
    // Verified against 0:1's memory: 0 B there, whatever 0:0 holds.
    assert_eq!(gpu(&report, 0)["memory_after"], 0, "{report:#}");

    // The same by its UUID, on a GPU named whole: the neighbour and the
    // leak are then in the way.
    let whole = free(&host, "GPU-sim-00000000");
    assert_eq!(whole.code, 1, "{}{}", whole.stdout, whole.stderr);
    assert!(
        !alive(neighbour),
        "GPU 0 named whole takes every instance's holders"
    );
}

#[test]
fn an_instance_named_by_its_mig_uuid_is_freed_like_its_index() {
    let host = mig_host();
    let mut incident = Incident::new(&host);
    let neighbour = on_instance(&mut incident, "mig_neighbour", 0, 0, 2 * GIB);
    let target = on_instance(&mut incident, "mig_target", 0, 1, 5 * GIB);
    let freed = free(&host, "MIG-3f0e2b1c-aaaa-bbbb-cccc-000000000001");
    assert_eq!(freed.code, 0, "{}{}", freed.stdout, freed.stderr);
    assert_eq!(target_pids(&freed.json()), vec![target]);
    assert!(alive(neighbour));
    // check judges the instance it is given, by the one rule.
    fs::write(host.path().join("leak.0.0"), GIB.to_string()).expect("leak");
    let clean = run(&host, &["check", "--gpu", "0:1"]);
    assert_eq!(clean.code, 0, "{}{}", clean.stdout, clean.stderr);
    let held = run(&host, &["check", "--gpu", "0:0"]);
    assert_eq!(held.code, 1, "{}{}", held.stdout, held.stderr);
    assert_contains(&held.stdout, "1.0 GiB held by no process");
}

#[test]
fn bad_mig_names_are_refused_before_anything_is_signalled() {
    let host = mig_host();
    // GPU 1 in MIG mode with no instance.
    fs::write(host.path().join("mig.1"), "").expect("mig.1");
    let mut incident = Incident::new(&host);
    let holder = on_instance(&mut incident, "mig_holder", 0, 1, 5 * GIB);
    for (name, said) in [
        ("0:7", "GPU 0 has no MIG instance 7 (it has 0:0, 0:1)"),
        ("1:0", "GPU 1 is in MIG mode with no instances"),
        ("2:0", "GPU 2 (of 2:0) is not on this host"),
        (
            "MIG-4b1e5c2a-7d0e-5f3b-9a1c-2e8d6f4a0b9c",
            "MIG instance MIG-4b1e5c2a-7d0e-5f3b-9a1c-2e8d6f4a0b9c is not on this host",
        ),
        ("GPU-4b1e5c2a", "GPU GPU-4b1e5c2a is not on this host"),
        ("0:x", "is not a MIG instance"),
    ] {
        let refused = free(&host, name);
        assert_eq!(
            refused.code, 2,
            "{name}: {}{}",
            refused.stdout, refused.stderr
        );
        assert!(refused.stderr.contains(said), "{name}: {}", refused.stderr);
        assert!(alive(holder), "{name}: nothing signalled");
    }
    let plain = Sim::gpus(1).named("NVIDIA H200").build();
    let refused = free(&plain, "0:0");
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert_contains(&refused.stderr, "GPU 0 is not in MIG mode");
    // A GPU in MIG mode without instances is said in the status table.
    let status = run(&host, &["status"]);
    assert_contains(&status.stdout, "GPU 1 is in MIG mode with no instances");
    // reset is of whole GPUs, and says so.
    let reset = run(&host, &["reset", "--gpu", "0:1"]);
    assert_eq!(reset.code, 2, "{}", reset.stderr);
    assert_contains(&reset.stderr, "reset resets whole GPUs");
    assert!(alive(holder));
}

/// `reap --gpu 0:1` (the watch's rules, one pass) looks through the
/// instance it names: of two orphans, one on each instance of GPU 0, only
/// 0:1's is freed.
#[test]
fn the_watch_scoped_to_an_instance_frees_only_its_orphan() {
    let host = mig_host();
    let mut incident = Incident::new(&host);
    // Each holder in a subshell of a bash that is then SIGKILLed: an orphan.
    let orphan_on = |incident: &mut Incident, title: &str, instance: u32| -> u32 {
        let script = Holder::new(title).on(0, 2 * GIB).script().replace(
            &format!("echo {} > \"$D/claims/$BASHPID.0\"", 2 * GIB),
            &format!("echo {instance}:{} > \"$D/claims/$BASHPID.0\"", 2 * GIB),
        );
        // Job control puts the launcher (a subshell) in a group of its own,
        // the holder in it; the launcher's death leaves the holder orphaned.
        incident
            .spawn(
                &format!(
                    "set -m; ( echo $BASHPID > \"$D/launcher.{instance}\"; ( {script} ) & wait ) & wait"
                ),
                1,
            )
            .expect("holder");
        let pid = incident.pid_of(title).expect("recorded");
        let launcher = fs::read_to_string(host.path().join(format!("launcher.{instance}")))
            .expect("the launcher's pid");
        let killed = std::process::Command::new("kill")
            .args(["-9", launcher.trim()])
            .status()
            .expect("kill");
        assert!(killed.success());
        assert!(
            wait_until(|| ppid(pid) == Some(1)),
            "{title} was not re-parented to PID 1"
        );
        pid
    };
    let neighbour = orphan_on(&mut incident, "mig_orphan_0", 0);
    let target = orphan_on(&mut incident, "mig_orphan_1", 1);
    let reaped = run(
        &host,
        &reap_now(
            "--orphans",
            &["--grace", "100ms", "--gpu", "0:1", "--enforce"],
        ),
    );
    assert_eq!(reaped.code, 0, "{}", reaped.stderr);
    assert!(
        wait_until(|| !alive(target)),
        "0:1 orphan still there: {}",
        reaped.stderr
    );
    assert!(
        alive(neighbour),
        "0:0's orphan was signalled: {}",
        reaped.stderr
    );
    // A name of no instance is bad input before anything runs.
    let bad = run(&host, &["reap", "--orphans", "--gpu", "0:7", "--enforce"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(alive(neighbour));
}

/// A scope that names an instance sees its GPU through the instance view
/// (`mig::InstanceView`), which forwards every driver question by hand:
/// the GPU's activity (one sensor, one power limit for all its instances)
/// must come through it, not the trait's nothing.
#[test]
fn an_instance_scope_shows_its_gpus_temperature_and_power() {
    let host = mig_host();
    let mut incident = Incident::new(&host);
    on_instance(&mut incident, "mig_big", 0, 1, 5 * GIB);
    host.activity(0, "temperature 51\npower 250\npower_limit 700\n")
        .expect("activity");
    let whole = run(&host, &["status", "--gpu", "0", "--json"]).json();
    assert_eq!(gpu(&whole, 0)["temperature_celsius"], 51, "{whole:#}");
    let scoped = run(&host, &["status", "--gpu", "0:1", "--json"]);
    assert_eq!(scoped.code, 0, "{}", scoped.stderr);
    let document = scoped.json();
    conforms(&schema(), "status --gpu 0:1", &document);
    let gpu0 = gpu(&document, 0);
    assert!(
        gpu0["name"]
            .as_str()
            .is_some_and(|name| name.contains("MIG 0:1")),
        "not the instance view: {gpu0:#}"
    );
    assert_eq!(gpu0["temperature_celsius"], 51, "{gpu0:#}");
    assert_eq!(gpu0["power_draw_watts"], 250.0);
    assert_eq!(gpu0["power_limit_watts"], 700.0);
    assert!(gpu0["utilization_percent"].is_null());
}
