//! `gpureap plan` finds the engine version a command would run from real
//! directory trees the test makes (a venv: `bin/python3`, `pyvenv.cfg`,
//! `lib/python3.11/site-packages/vllm-X.dist-info/METADATA`; a console
//! script on `PATH`), applies that version's rules, names it, and never
//! hangs on a FIFO, a huge file or a symlink loop.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::harness::*;
use crate::plan_fixture::{published, sglang, sglang_by, vllm, vllm_by};
use crate::says::says;

const GIB: u64 = 1 << 30;

/// A venv as `python3 -m venv` lays it out, with `package` at `version`
/// installed (its METADATA's text `metadata`, when given).
struct Venv {
    dir: tempfile::TempDir,
}

impl Venv {
    fn new() -> Venv {
        let dir = tempfile::Builder::new()
            .prefix("gpureap-venv-")
            .tempdir()
            .expect("venv dir");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        let python = bin.join("python3");
        std::fs::write(&python, "#!/bin/sh\nexit 0\n").expect("python3");
        make_executable(&python);
        std::fs::write(
            dir.path().join("pyvenv.cfg"),
            "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.4\n",
        )
        .expect("pyvenv.cfg");
        std::fs::create_dir_all(dir.path().join("lib/python3.11/site-packages"))
            .expect("site-packages");
        Venv { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn python(&self) -> String {
        self.path().join("bin/python3").display().to_string()
    }

    /// `site-packages/PACKAGE-VERSION.dist-info/`, its METADATA to be written.
    fn dist_info(&self, package: &str, version: &str) -> PathBuf {
        let dir = self.path().join(format!(
            "lib/python3.11/site-packages/{package}-{version}.dist-info"
        ));
        std::fs::create_dir_all(&dir).expect("dist-info");
        dir
    }

    fn install(&self, package: &str, version: &str) {
        let metadata = format!(
            "Metadata-Version: 2.4\nName: {package}\nVersion: {version}\nSummary: test\n\nlong description\n"
        );
        std::fs::write(self.dist_info(package, version).join("METADATA"), metadata)
            .expect("METADATA");
    }

    /// `bin/NAME`, a console script as pip writes it.
    fn console_script(&self, name: &str) {
        let script = self.path().join("bin").join(name);
        std::fs::write(
            &script,
            format!(
                "#!{}\nimport sys\nfrom {name}.cli.main import main\nsys.exit(main())\n",
                self.python()
            ),
        )
        .expect("script");
        make_executable(&script);
    }
}

fn make_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// The PATH of a host with no engine installed.
const SYSTEM: &str = "/usr/bin:/bin";

/// `gpureap plan --gpu-memory 80GiB FLAGS -- COMMAND` with `PATH` as given.
fn plan(path: &str, flags: &[&str], command: &[impl AsRef<OsStr>]) -> Run {
    plan_in(path, None, flags, command)
}

/// The same with `PYTHONPATH` set.
fn plan_in(
    path: &str,
    python_path: Option<&Path>,
    flags: &[&str],
    command: &[impl AsRef<OsStr>],
) -> Run {
    let started = std::time::Instant::now();
    let mut gpureap = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"));
    match python_path {
        Some(dir) => gpureap.env("PYTHONPATH", dir),
        None => gpureap.env_remove("PYTHONPATH"),
    };
    let run: Run = gpureap
        .arg("plan")
        .arg(format!("--gpu-memory={}", 80 * GIB))
        .args(flags)
        .arg("--")
        .args(command)
        .env("GPUREAP_BACKEND", "none")
        .env("PATH", path)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("gpureap runs")
        .into();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "plan took {:?}",
        started.elapsed()
    );
    run
}

fn version(run: &Run) -> serde_json::Value {
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    run.json()["engine_version"].clone()
}

/// A venv's interpreter named by path: its METADATA's version is the
/// version, and vLLM 0.33.0's rule applies (a pure-MLA model's offloaded
/// blocks stored once at TP 8, not once per worker as 0.26.0 does).
/// Before: plan knew no version and took 0.26.0's rule (8 copies).
#[test]
fn a_venv_s_interpreter_names_the_version_and_its_rules_apply() {
    let venv = Venv::new();
    venv.install("vllm", "0.33.0");
    let python = venv.python();
    let model = published("deepseek-v2-lite");
    let command = vllm_by(
        &python,
        &model,
        &["--tensor-parallel-size", "8", "--kv-offloading-size", "64"],
    );
    let found = plan(SYSTEM, &["--json", "--host-memory=1TiB"], &command);
    let engine_version = version(&found);
    assert_eq!(engine_version["version"], "0.33.0");
    assert_eq!(engine_version["source"], "metadata");
    assert_eq!(engine_version["rules"], "0.33.0");
    assert_eq!(engine_version["other_rules"], false);
    assert_eq!(engine_version["interpreter"], python.as_str());
    let metadata = venv
        .path()
        .join("lib/python3.11/site-packages/vllm-0.33.0.dist-info/METADATA");
    assert_eq!(
        engine_version["metadata"],
        metadata.display().to_string().as_str()
    );

    let old = plan(
        SYSTEM,
        &["--json", "--host-memory=1TiB", "--engine-version", "0.26.0"],
        &command,
    );
    assert_eq!(version(&old)["source"], "flag");
    let tokens = |run: &Run| {
        run.json()["host_tier"]["tokens_per_rank"]
            .as_u64()
            .expect("tier")
    };
    assert_eq!(tokens(&found) / 8, tokens(&old), "one copy, not 8");
    assert!(tokens(&found) > 8 * tokens(&old), "one copy, not 8");

    let text = plan(SYSTEM, &["--host-memory=1TiB"], &command);
    assert!(
        text.stdout.contains(&format!(
            "  version   vLLM 0.33.0 found ({}); planned with its rules",
            metadata.display()
        )),
        "{}",
        text.stdout
    );
}

/// `vllm serve` looked up on PATH: the console script's `#!` names the
/// venv's interpreter; a version between the kept ones gets the nearest's
/// rules and says so.
#[test]
fn a_console_script_on_path_leads_to_its_venv_and_the_nearest_rules() {
    let venv = Venv::new();
    venv.install("vllm", "0.29.1");
    venv.console_script("vllm");
    let path = format!("{}:/usr/bin:/bin", venv.path().join("bin").display());
    let model = published("llama-3.1-8b");
    let run = plan(&path, &[], &vllm(&model, &[]));
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("vLLM 0.29.1 found (")
            && run
                .stdout
                .contains("); planned with 0.26.0's rules, the nearest kept"),
        "{}",
        run.stdout
    );
    let json = plan(&path, &["--json"], &vllm(&model, &[]));
    let engine_version = version(&json);
    assert_eq!(engine_version["version"], "0.29.1");
    assert_eq!(engine_version["rules"], "0.26.0");
    assert_eq!(engine_version["other_rules"], true);
}

/// SGLang 0.5.23 caps a given --max-running-requests at tokens // 2
/// (`resolve_max_num_reqs`); 0.5.9 takes it as given. The venv's
/// sglang-0.5.23 decides which.
#[test]
fn sglang_0_5_23_caps_the_running_requests_given() {
    let venv = Venv::new();
    venv.install("sglang", "0.5.23");
    let python = venv.python();
    let model = published("llama-3.1-8b");
    let command = sglang_by(
        &python,
        &model,
        &[
            "--max-running-requests",
            "100000000",
            "--mem-fraction-static",
            "0.85",
        ],
    );
    let new = plan(SYSTEM, &["--json"], &command);
    assert_eq!(version(&new)["rules"], "0.5.23");
    let device = &new.json()["device"];
    let tokens = device["tokens_per_rank"].as_u64().expect("tokens");
    assert_eq!(device["max_running_requests"].as_u64(), Some(tokens / 2));

    let old = plan(SYSTEM, &["--json", "--engine-version", "0.5.9"], &command);
    assert_eq!(
        old.json()["device"]["max_running_requests"].as_u64(),
        Some(100_000_000)
    );
}

/// No interpreter, no metadata: said, and the default rules named.
#[test]
fn no_version_found_says_why_and_names_the_default_rules() {
    let model = published("llama-3.1-8b");
    let empty = tempfile::tempdir().expect("empty dir");
    let path = empty.path().display().to_string();
    let run = plan(&path, &[], &vllm(&model, &[]));
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains(
            "  version   no vLLM version found (vllm is not on the engine's PATH); planned with 0.26.0's rules (the default"
        ),
        "{}",
        run.stdout
    );
    let venv = Venv::new();
    let json = plan(&path, &["--json"], &sglang_by(&venv.python(), &model, &[]));
    let engine_version = version(&json);
    assert_eq!(engine_version["source"], "none");
    assert_eq!(engine_version["version"], serde_json::Value::Null);
    assert_eq!(engine_version["rules"], "0.5.9");
    assert!(
        engine_version["why"]
            .as_str()
            .is_some_and(|why| why.contains("has no sglang-*.dist-info")),
        "{engine_version}"
    );

    let bad = plan(&path, &["--engine-version", "latest"], &vllm(&model, &[]));
    assert_eq!(bad.code, 2, "{}", bad.stdout);
    says(&bad.stderr, &["--engine-version"]);
}

/// A METADATA that is a FIFO, one of 2 MiB, an interpreter that is a
/// symlink loop: no hang, "not found", the default rules; a version
/// carrying a terminal escape is written out, not sent to the terminal.
#[test]
fn hostile_metadata_never_hangs_and_never_reaches_the_terminal() {
    let model = published("llama-3.1-8b");
    let run_json = |python: &str| plan(SYSTEM, &["--json"], &vllm_by(python, &model, &[]));

    let fifo = Venv::new();
    let metadata = fifo.dist_info("vllm", "0.33.0").join("METADATA");
    let status = std::process::Command::new("mkfifo")
        .arg(&metadata)
        .status()
        .expect("mkfifo");
    assert!(status.success());
    let found = version(&run_json(&fifo.python()));
    assert_eq!(found["source"], "none");
    assert_eq!(found["rules"], "0.26.0");
    assert!(
        found["why"]
            .as_str()
            .unwrap_or("")
            .contains("not a regular file"),
        "{found}"
    );

    let huge = Venv::new();
    let mut text = "Metadata-Version: 2.4\nName: vllm\nVersion: 0.33.0\n\n".to_string();
    text.push_str(&"x".repeat(2 << 20));
    std::fs::write(huge.dist_info("vllm", "0.33.0").join("METADATA"), text).expect("huge");
    let found = version(&run_json(&huge.python()));
    assert_eq!(found["source"], "none");
    assert!(
        found["why"].as_str().unwrap_or("").contains("larger than"),
        "{found}"
    );

    let looped = Venv::new();
    looped.install("vllm", "0.33.0");
    let python = looped.path().join("bin/python3");
    std::fs::remove_file(&python).expect("rm python3");
    let other = looped.path().join("bin/python");
    std::os::unix::fs::symlink(&other, &python).expect("symlink");
    std::os::unix::fs::symlink(&python, &other).expect("symlink");
    let found = version(&run_json(&looped.python()));
    assert_eq!(found["source"], "none");
    assert!(
        found["why"]
            .as_str()
            .unwrap_or("")
            .contains("not an executable file"),
        "{found}"
    );

    let escaped = Venv::new();
    std::fs::write(
        escaped.dist_info("vllm", "0.33.0").join("METADATA"),
        "Name: vllm\nVersion: 0.33.0\x1b[2J\x1b]0;owned\x07\n\n",
    )
    .expect("METADATA");
    let text = plan(SYSTEM, &[], &vllm_by(&escaped.python(), &model, &[]));
    assert_eq!(text.code, 0, "{}", text.stderr);
    assert!(!text.stdout.contains('\x1b'), "{:?}", text.stdout);
    assert!(!text.stdout.contains('\x07'), "{:?}", text.stdout);
    says(&text.stdout, &["vLLM 0.33.0\\u{1b}[2J"]);
    let found = version(&run_json(&escaped.python()));
    assert_eq!(found["rules"], "0.33.0");
}

/// An interpreter outside any venv (a prefix as a source build or conda
/// lays it out: `bin/python3` a link to `bin/python3.11`, the packages in
/// `lib/python3.11/site-packages`), found on PATH as `python3`; a
/// `PYTHONPATH` directory comes before it, as in `sys.path`.
#[test]
fn a_prefix_s_interpreter_and_pythonpath_are_searched_in_sys_path_order() {
    let prefix = tempfile::tempdir().expect("prefix");
    let bin = prefix.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    let real = bin.join("python3.11");
    std::fs::write(&real, "#!/bin/sh\nexit 0\n").expect("python3.11");
    make_executable(&real);
    std::os::unix::fs::symlink("python3.11", bin.join("python3")).expect("python3");
    let site = prefix.path().join("lib/python3.11/site-packages");
    let dist_info = site.join("sglang-0.5.23.dist-info");
    std::fs::create_dir_all(&dist_info).expect("dist-info");
    std::fs::write(
        dist_info.join("METADATA"),
        "Name: sglang\nVersion: 0.5.23\n\n",
    )
    .expect("METADATA");
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let model = published("llama-3.1-8b");
    let command = sglang(&model, &[]);
    let found = version(&plan(&path, &["--json"], &command));
    assert_eq!(found["version"], "0.5.23", "{found}");
    assert_eq!(found["rules"], "0.5.23");
    assert_eq!(
        found["metadata"],
        dist_info.join("METADATA").display().to_string().as_str()
    );

    let first = tempfile::tempdir().expect("PYTHONPATH dir");
    let older = first.path().join("sglang-0.5.9.dist-info");
    std::fs::create_dir_all(&older).expect("dist-info");
    std::fs::write(older.join("METADATA"), "Name: sglang\nVersion: 0.5.9\n\n").expect("METADATA");
    let found = version(&plan_in(&path, Some(first.path()), &["--json"], &command));
    assert_eq!(found["version"], "0.5.9", "{found}");
    assert_eq!(found["rules"], "0.5.9");
}

/// SGLang 0.5.9 refuses a host tier no larger than the device pool (an
/// assert in `HostKVCache`); 0.5.23 starts with a warning.
#[test]
fn a_host_tier_smaller_than_the_device_pool_stops_only_sglang_0_5_9() {
    let model = published("llama-3.1-8b");
    let command = sglang(
        &model,
        &["--enable-hierarchical-cache", "--hicache-ratio", "0.5"],
    );
    let old = plan(
        SYSTEM,
        &["--host-memory=1TiB", "--engine-version=0.5.9"],
        &command,
    );
    assert_eq!(old.code, 4, "{}", old.stdout);
    says(&old.stdout, &["SGLang does not start: the host pool"]);
    let new = plan(
        SYSTEM,
        &["--host-memory=1TiB", "--engine-version=0.5.23"],
        &command,
    );
    assert_eq!(new.code, 0, "{}", new.stdout);
    says(
        &new.stdout,
        &["SGLang 0.5.23 starts, warning that the host tier helps less"],
    );
}

/// HiCache with neither --hicache-ratio nor --hicache-size on a host of
/// 64 GiB: SGLang 0.5.9 asks for twice the device pool and does not fit
/// (exit 4); 0.5.23 lowers the ratio until 0.8 of the host's budget holds
/// it, less its 5 % slack (`hicache_auto_size.py`), and starts.
#[test]
fn sglang_0_5_23_sizes_a_default_hicache_to_the_host() {
    let model = published("llama-3.1-8b");
    let command = sglang(
        &model,
        &[
            "--mem-fraction-static",
            "0.85",
            "--enable-hierarchical-cache",
        ],
    );
    let old = plan(
        SYSTEM,
        &["--json", "--host-memory=64GiB", "--engine-version=0.5.9"],
        &command,
    );
    assert_eq!(old.code, 4, "{}", old.stdout);
    let tier = &old.json()["host_tier"];
    assert_eq!(tier["fits"], false);
    let device = old.json()["device"]["tokens_per_rank"]
        .as_u64()
        .expect("tokens");
    assert!(tier["tokens_per_rank"].as_u64().expect("tier") > 2 * device);

    let new = plan(
        SYSTEM,
        &["--json", "--host-memory=64GiB", "--engine-version=0.5.23"],
        &command,
    );
    assert_eq!(new.code, 0, "{}", new.stdout);
    let tier = &new.json()["host_tier"];
    assert_eq!(tier["fits"], true);
    let share = (54 * GIB) as f64 * 0.8;
    let bytes = tier["bytes_per_rank"].as_u64().expect("bytes") as f64;
    assert!(
        bytes <= share * 0.95 + 1e6 && bytes > share * 0.94,
        "{bytes} of {share}"
    );
    let text = plan(
        SYSTEM,
        &["--host-memory=64GiB", "--engine-version=0.5.23"],
        &command,
    );
    assert!(
        text.stdout.contains(
            "SGLang HiCache, the ratio 2 lowered to fit 0.8 of this host's memory per rank"
        ),
        "{}",
        text.stdout
    );
}
