//! `-H` carries the command's one config to each host: the remote command
//! line is built from the config a local run acts on, and read back by the
//! real parser into the same config. A flag added to `free`, `wait` or
//! `plan` and not carried to the hosts fails to compile (`free_flags`,
//! `wait_flags` and `plan_flags` name every field) or fails here.

use std::fmt::Debug;
use std::time::Duration;

use clap::Parser;
use gpureap::cli::{Cli, Command};
use gpureap::config;
use gpureap::fleet::commands::{free_flags, plan_flags, status_flags, wait_flags};
use gpureap_services::request::{FreeRequest, StatusRequest, WaitRequest};

fn parse(argv: &[String]) -> Command {
    match Cli::try_parse_from(argv) {
        Ok(cli) => cli.command,
        Err(error) => panic!("{argv:?} does not parse: {error}"),
    }
}

fn free_request(argv: &[String]) -> FreeRequest {
    match parse(argv) {
        Command::Free(args) => config::free(&args).expect("a free with a scope"),
        other => panic!("{argv:?} is not free: {other:?}"),
    }
}

fn status_request(argv: &[String]) -> StatusRequest {
    match parse(argv) {
        Command::Status(args) => config::status(&args),
        other => panic!("{argv:?} is not status: {other:?}"),
    }
}

fn wait_request(argv: &[String]) -> WaitRequest {
    match parse(argv) {
        Command::Wait(args) => config::wait(&args),
        other => panic!("{argv:?} is not wait: {other:?}"),
    }
}

/// Asserts that what the hosts read (`there`, parsed from `remote`) is
/// `expected`, the config `line` asked for here.
fn reaches_as(line: &str, remote: &[String], there: impl Debug, expected: impl Debug) {
    assert_eq!(
        format!("{there:?}"),
        format!("{expected:?}"),
        "`{line}` reaches the hosts as {remote:?}"
    );
}

fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

#[test]
fn free_on_the_hosts_is_the_free_asked_here() {
    for line in [
        "gpureap free --gpu 0,2-3 --gpu 5 --pid 42 --pid 7 --match=-x --match sglang.*serve \
         --user bob --user 1000 --protect myd --protect=-odd --orphans --stale-runs \
         --grace 1500ms --timeout 2m -H node[1-2]",
        "gpureap free --all --grace 0s --timeout 1s --protect keep -H a,b",
        "gpureap free --gpu all --dry-run --json -H a",
        "gpureap free --orphans --yes -H a",
        "gpureap free --mps-server 5120 --mps-server gpu:1 --dry-run -H a",
        "gpureap free --container 3F2A9C81D4E7 --container=-odd-name --pod ml/llama-0 \
         --pod 0F6B7C1E_2D7A_4B8E_9C3D_5A1F2E3D4C5B --cgroup /system.slice/x.scope/ \
         --cgroup /sys/fs/cgroup/unified/kubepods --gpu 1 -H a",
        "gpureap free --orphans --host-root /host --kubelet-socket=-k.sock -H a",
    ] {
        let here = free_request(&words(line));
        // What the fleet sends: the flags, then `--dry-run` to plan or
        // `--yes` to free, and `--json` (Fleet::remote_args).
        for (phase, dry_run, yes) in [("--dry-run", true, false), ("--yes", false, true)] {
            let mut remote = words("gpureap free");
            remote.extend(free_flags(&here));
            remote.extend([phase.to_string(), "--json".to_string()]);
            let there = free_request(&remote);
            let expected = FreeRequest {
                dry_run,
                yes,
                json: true,
                ..here.clone()
            };
            reaches_as(line, &remote, there, expected);
        }
    }
}

/// `status -H` passes the GPUs, the container sources and `--monitors` as
/// given: each host reads its own node root and kubelet socket.
#[test]
fn status_on_the_hosts_reads_the_sources_asked_here() {
    for line in [
        "gpureap status --gpu 1 --host-root /host --kubelet-socket /k/kubelet.sock -H a",
        "gpureap status --kubelet-socket=-odd.sock -H a",
        "gpureap status -H a",
        "gpureap status --monitors -H a",
    ] {
        let here = status_request(&words(line));
        let mut remote = words("gpureap status");
        remote.extend(status_flags(&here.gpu, &here.sources, here.monitors));
        let there = status_request(&remote);
        reaches_as(line, &remote, there, here);
    }
}

#[test]
fn wait_on_the_hosts_is_the_wait_asked_here() {
    for line in [
        "gpureap wait --gpu 1,3 --gpu 7 --below 2GiB --timeout 90s -H a",
        "gpureap wait --json -H a",
        "gpureap wait --keep-waiting -H a",
    ] {
        let here = wait_request(&words(line));
        let mut remote = words("gpureap wait");
        remote.extend(wait_flags(&here, here.timeout));
        remote.push("--json".to_string());
        let there = wait_request(&remote);
        let expected = WaitRequest {
            json: true,
            ..here.clone()
        };
        reaches_as(line, &remote, there, expected);
        // A host started late gets what is left of the fleet's deadline.
        let late = wait_flags(&here, Duration::from_millis(1234));
        let mut remote = words("gpureap wait");
        remote.extend(late);
        assert_eq!(wait_request(&remote).timeout, Duration::from_millis(1234));
    }
}

#[test]
fn plan_on_the_hosts_is_the_plan_asked_here() {
    let plan = |argv: &[String]| match parse(argv) {
        Command::Plan(args) => config::plan(&args).expect("a plan"),
        other => panic!("{argv:?} is not plan: {other:?}"),
    };
    for line in [
        "gpureap plan --avg-prompt 1000 --avg-output 4100 --concurrency 150 --gpu-memory 96GiB \
         --gpus 8 --gpu-free 90GiB --weights 72.8GiB --kv-memory 7GiB --host-memory 400GiB \
         --from-log /shared/sglang.log --model-config /shared/kimi --engine-version 0.5.23 -H a,b \
         -- python3 -m sglang.launch_server --model-path moonshotai/Kimi-K2.5 --tp 8",
        "gpureap plan --avg-output 4100 --json -H a -- vllm serve x --max-model-len=-1",
        "gpureap plan -H a -- sglang serve --model-path m",
    ] {
        let here = plan(&words(line));
        // What the fleet sends: the flags, `--json`, then the command
        // behind `--` (Fleet::remote_args_then).
        let mut remote = words("gpureap plan");
        remote.extend(plan_flags(&here));
        remote.push("--json".to_string());
        remote.push("--".to_string());
        remote.extend(here.command.iter().cloned());
        let there = plan(&remote);
        let mut expected = here.clone();
        expected.json = true;
        reaches_as(line, &remote, there, expected);
    }
}
