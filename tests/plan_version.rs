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
    _temp: Option<tempfile::TempDir>,
    dir: PathBuf,
}

impl Venv {
    fn new() -> Venv {
        let temp = tempfile::Builder::new()
            .prefix("gpureap-venv-")
            .tempdir()
            .expect("venv dir");
        let mut venv = Venv::at(temp.path());
        venv._temp = Some(temp);
        venv
    }

    /// A venv made at `dir` (`uv sync`'s `.venv`).
    fn at(dir: &Path) -> Venv {
        let dir = Venv {
            _temp: None,
            dir: dir.to_path_buf(),
        };
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        let python = bin.join("python3");
        std::fs::write(&python, "#!/bin/sh\nexit 0\n").expect("python3");
        make_executable(&python);
        std::os::unix::fs::symlink("python3", bin.join("python")).expect("python");
        std::fs::write(
            dir.path().join("pyvenv.cfg"),
            "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.4\n",
        )
        .expect("pyvenv.cfg");
        std::fs::create_dir_all(dir.path().join("lib/python3.11/site-packages"))
            .expect("site-packages");
        dir
    }

    fn path(&self) -> &Path {
        &self.dir
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
    std::fs::remove_file(&other).expect("rm python");
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

/// `gpureap plan --json --gpu-memory 80GiB -- COMMAND` started in `cwd`,
/// with `PATH` and `HOME` as given, `vars` set, and no pyenv or uv
/// variable of the caller's.
fn plan_at(cwd: &Path, home: &Path, path: &str, vars: &[(&str, &str)], command: &[String]) -> Run {
    let started = std::time::Instant::now();
    let mut gpureap = std::process::Command::new(env!("CARGO_BIN_EXE_gpureap"));
    for name in [
        "PYTHONPATH",
        "PYENV_ROOT",
        "PYENV_VERSION",
        "PYENV_DIR",
        "VIRTUAL_ENV",
        "UV_PROJECT_ENVIRONMENT",
        "CUDA_VISIBLE_DEVICES",
    ] {
        gpureap.env_remove(name);
    }
    let run: Run = gpureap
        .current_dir(cwd)
        .arg("plan")
        .arg(format!("--gpu-memory={}", 80 * GIB))
        .arg("--json")
        .arg("--")
        .args(command)
        .env("GPUREAP_BACKEND", "none")
        .env("PATH", path)
        .env("HOME", home)
        .envs(vars.iter().copied())
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

/// `WORDS… vllm serve MODEL`.
fn launched_by(words: &[&str], command: Vec<String>) -> Vec<String> {
    words
        .iter()
        .map(|word| word.to_string())
        .chain(command)
        .collect()
}

/// The `why` of a version not found, asserted to say `says`.
fn why_none(run: &Run, says: &str) -> String {
    let found = version(run);
    assert_eq!(found["source"], "none", "{found}");
    assert_eq!(found["version"], serde_json::Value::Null, "{found}");
    let why = found["why"].as_str().unwrap_or_default().to_string();
    assert!(why.contains(says), "{why:?} does not say {says:?}");
    why
}

/// `DIR/uv.lock` as uv writes it, pinning vLLM at `version`.
fn lock(dir: &Path, version: &str) {
    std::fs::write(
        dir.join("uv.lock"),
        format!(
            "version = 1\nrevision = 3\nrequires-python = \">=3.11\"\n\n[[package]]\nname = \"serving\"\nversion = \"0.1.0\"\nsource = {{ virtual = \".\" }}\ndependencies = [\n    {{ name = \"vllm\" }},\n]\n\n[package.metadata]\nrequires-dist = [{{ name = \"vllm\", specifier = \"==0.1.0\" }}]\n\n[[package]]\nname = \"vllm\"\nversion = \"{version}\"\nsource = {{ registry = \"https://pypi.org/simple\" }}\n"
        ),
    )
    .expect("uv.lock");
}

/// A uv project: `pyproject.toml` and its `uv.lock`, and `uv sync`'s `.venv` with vLLM
/// 0.33.0 and its console script; the project's own `sub/` directory.
fn uv_project() -> (tempfile::TempDir, Venv) {
    let project = tempfile::Builder::new()
        .prefix("gpureap-uv-")
        .tempdir()
        .expect("project");
    std::fs::write(
        project.path().join("pyproject.toml"),
        "[project]\nname = \"serving\"\nversion = \"0.1.0\"\ndependencies = [\"vllm==0.33.0\"]\n",
    )
    .expect("pyproject.toml");
    std::fs::create_dir_all(project.path().join("sub")).expect("sub");
    lock(project.path(), "0.33.0");
    let venv = Venv::at(&project.path().join(".venv"));
    venv.install("vllm", "0.33.0");
    venv.console_script("vllm");
    (project, venv)
}

/// `uv run vllm serve …` started in a project's subdirectory, `uv run
/// --project DIR -m vllm.entrypoints.openai.api_server …` and `uv run
/// --directory DIR python -m …` from elsewhere: the project's `.venv`
/// holds the version (0.33.0) and its rules apply;
/// `UV_PROJECT_ENVIRONMENT` moves the environment. Before: `uv run` was
/// not an engine command (exit 2).
#[test]
fn uv_run_finds_the_version_in_the_project_environment() {
    let (project, venv) = uv_project();
    let model = published("llama-3.1-8b");
    let home = tempfile::tempdir().expect("home");
    let elsewhere = home.path();
    let dir = project.path().display().to_string();
    let metadata = venv
        .path()
        .join("lib/python3.11/site-packages/vllm-0.33.0.dist-info/METADATA")
        .display()
        .to_string();
    let runs = [
        (
            project.path().join("sub"),
            launched_by(&["uv", "run", "--frozen"], vllm(&model, &[])),
        ),
        (
            elsewhere.to_path_buf(),
            launched_by(
                &[
                    "uv",
                    "run",
                    "--project",
                    &dir,
                    "-m",
                    "vllm.entrypoints.openai.api_server",
                    "--model",
                ],
                vec![model.display().to_string()],
            ),
        ),
        (
            elsewhere.to_path_buf(),
            launched_by(
                &["uv", "--directory", &dir, "run", "--"],
                vllm_by("python3", &model, &[]),
            ),
        ),
    ];
    for (cwd, command) in &runs {
        let run = plan_at(cwd, home.path(), SYSTEM, &[], command);
        let found = version(&run);
        assert_eq!(found["version"], "0.33.0", "{command:?}: {found}");
        assert_eq!(found["rules"], "0.33.0", "{command:?}: {found}");
        assert_eq!(found["metadata"], metadata.as_str(), "{command:?}: {found}");
        let bin = venv.path().join("bin").display().to_string();
        assert!(
            found["interpreter"]
                .as_str()
                .is_some_and(|python| python.starts_with(&bin)),
            "{command:?}: {found}"
        );
    }

    let other = Venv::at(&project.path().join("envs/serve"));
    other.install("vllm", "0.26.0");
    other.console_script("vllm");
    let command = launched_by(&["uv", "run"], vllm(&model, &[]));
    let moved = plan_at(
        project.path(),
        home.path(),
        SYSTEM,
        &[
            ("UV_PROJECT_ENVIRONMENT", "envs/serve"),
            ("UV_NO_SYNC", "1"),
        ],
        &command,
    );
    assert_eq!(version(&moved)["version"], "0.26.0");

    // uv syncs the environment to uv.lock first: a lock pinning another
    // version says so; with --no-sync the environment is taken as it is.
    lock(project.path(), "0.26.0");
    let stale = plan_at(project.path(), home.path(), SYSTEM, &[], &command);
    why_none(&stale, "has vllm 0.33.0 but ");
    why_none(
        &stale,
        "/uv.lock pins 0.26.0: `uv run` syncs the environment",
    );
    let unsynced = launched_by(&["uv", "run", "--no-sync"], vllm(&model, &[]));
    let as_is = plan_at(project.path(), home.path(), SYSTEM, &[], &unsynced);
    assert_eq!(version(&as_is)["version"], "0.33.0");
}

/// What `uv run` builds at the start (`--with vllm==0.33.0`, `--isolated`,
/// `--no-project`), no project above the working directory, a project
/// whose `.venv` is not made yet: no version, and the reason names it;
/// the default rules. Before: exit 2, `uv` not an engine.
#[test]
fn uv_run_in_an_environment_plan_cannot_know_says_why() {
    let (project, venv) = uv_project();
    let model = published("llama-3.1-8b");
    let home = tempfile::tempdir().expect("home");
    let cwd = project.path();
    let serve = |words: &[&str]| launched_by(words, vllm(&model, &[]));
    for (words, says) in [
        (
            &["uv", "run", "--with", "vllm==0.33.0"][..],
            "`uv run --with vllm==0.33.0`",
        ),
        (
            &["uv", "run", "--with=vllm==0.33.0"][..],
            "`uv run --with vllm==0.33.0`",
        ),
        (&["uv", "run", "--isolated"][..], "`uv run --isolated`"),
        (
            &["uv", "run", "--no-project", "--python", "3.12"][..],
            "`uv run --no-project`",
        ),
        (
            &["uv", "run", "--with-requirements", "r.txt"][..],
            "`uv run --with-requirements r.txt`",
        ),
    ] {
        let run = plan_at(cwd, home.path(), SYSTEM, &[], &serve(words));
        why_none(&run, says);
        assert_eq!(version(&run)["rules"], "0.26.0");
    }

    let outside = plan_at(
        home.path(),
        home.path(),
        SYSTEM,
        &[],
        &serve(&["uv", "run"]),
    );
    why_none(&outside, "no pyproject.toml in");

    std::fs::remove_dir_all(venv.path()).expect("rm .venv");
    let unmade = plan_at(cwd, home.path(), SYSTEM, &[], &serve(&["uv", "run"]));
    why_none(&unmade, "/.venv does not exist: `uv run` would make it");
    why_none(&unmade, "/uv.lock pins vllm 0.33.0)");
}

/// A pyenv root as pyenv lays it out: `shims/` (bash shims for `vllm`,
/// `python3`), `versions/3.12.3` with vLLM 0.33.0 (console script and
/// interpreter), `versions/3.11.9` without vLLM.
fn pyenv_root(root: &Path) {
    let shims = root.join("shims");
    std::fs::create_dir_all(&shims).expect("shims");
    for name in ["vllm", "python3"] {
        let shim = shims.join(name);
        std::fs::write(
            &shim,
            format!(
                "#!/usr/bin/env bash\nset -e\n[ -n \"$PYENV_DEBUG\" ] && set -x\n\nprogram=\"${{0##*/}}\"\n\nexport PYENV_ROOT=\"{root}\"\nexec \"{root}/libexec/pyenv\" exec \"$program\" \"$@\"\n",
                root = root.display()
            ),
        )
        .expect("shim");
        make_executable(&shim);
    }
    for version in ["3.11.9", "3.12.3"] {
        let prefix = root.join("versions").join(version);
        let bin = prefix.join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        let minor = &version[..version.rfind('.').unwrap_or(version.len())];
        let python = bin.join(format!("python{minor}"));
        std::fs::write(&python, "\x7fELF").expect("python");
        make_executable(&python);
        std::os::unix::fs::symlink(format!("python{minor}"), bin.join("python3")).expect("python3");
        let site = prefix.join(format!("lib/python{minor}/site-packages"));
        std::fs::create_dir_all(&site).expect("site-packages");
        if version == "3.12.3" {
            let dist_info = site.join("vllm-0.33.0.dist-info");
            std::fs::create_dir_all(&dist_info).expect("dist-info");
            std::fs::write(
                dist_info.join("METADATA"),
                "Metadata-Version: 2.4\nName: vllm\nVersion: 0.33.0\n\n",
            )
            .expect("METADATA");
            let script = bin.join("vllm");
            std::fs::write(
                &script,
                format!(
                    "#!{}\nimport sys\nfrom vllm.entrypoints.cli.main import main\nsys.exit(main())\n",
                    python.display()
                ),
            )
            .expect("vllm");
            make_executable(&script);
        }
    }
}

/// pyenv's shims on PATH: `vllm serve` and `python3 -m …` resolve through
/// the version pyenv picks, in its order: `PYENV_VERSION`, the first
/// `.python-version` from the working directory up (of its versions, the
/// first that has the command), `ROOT/version`; the root is
/// `$PYENV_ROOT`, else `~/.pyenv`. Before: the shim, a bash script, gave
/// no version.
#[test]
fn pyenv_shims_resolve_to_the_version_pyenv_picks() {
    let home = tempfile::tempdir().expect("home");
    let root = home.path().join(".pyenv");
    pyenv_root(&root);
    let project = home.path().join("project");
    std::fs::create_dir_all(project.join("deep/down")).expect("project");
    std::fs::write(
        project.join(".python-version"),
        "# pinned\n3.11.9\n3.12.3\n",
    )
    .expect("pin");
    let model = published("llama-3.1-8b");
    let path = format!("{}:{SYSTEM}", root.join("shims").display());
    let interpreter = root
        .join("versions/3.12.3/bin/python3.12")
        .display()
        .to_string();
    let metadata = root
        .join("versions/3.12.3/lib/python3.12/site-packages/vllm-0.33.0.dist-info/METADATA")
        .display()
        .to_string();
    let cwd = project.join("deep/down");
    // `python3` is in both versions: PYENV_VERSION picks 3.12.3's.
    for (command, vars) in [
        (vllm(&model, &[]), &[][..]),
        (
            vllm_by("python3", &model, &[]),
            &[("PYENV_VERSION", "3.12.3")][..],
        ),
    ] {
        let run = plan_at(&cwd, home.path(), &path, vars, &command);
        let found = version(&run);
        assert_eq!(found["version"], "0.33.0", "{command:?}: {found}");
        assert_eq!(found["rules"], "0.33.0", "{command:?}: {found}");
        assert_eq!(found["metadata"], metadata.as_str(), "{command:?}: {found}");
        assert!(
            found["interpreter"]
                .as_str()
                .is_some_and(|python| python
                    .starts_with(&*root.join("versions/3.12.3/bin").to_string_lossy())),
            "{found}"
        );
    }
    let serve = vllm(&model, &[]);
    let shim_in_env = plan_at(
        &cwd,
        home.path(),
        &path,
        &[],
        &launched_by(&["env"], serve.clone()),
    );
    assert_eq!(version(&shim_in_env)["interpreter"], interpreter.as_str());

    // PYENV_VERSION first: a version without vllm, then system (none on PATH).
    let pinned = plan_at(
        &cwd,
        home.path(),
        &path,
        &[("PYENV_VERSION", "3.11.9:system")],
        &serve,
    );
    why_none(
        &pinned,
        "no version of 3.11.9:system (PYENV_VERSION) has vllm installed in",
    );
    // A prefix as pyenv takes it: 3.12 is the newest 3.12.N installed.
    let prefix = plan_at(
        &cwd,
        home.path(),
        &path,
        &[("PYENV_VERSION", "3.12")],
        &serve,
    );
    assert_eq!(version(&prefix)["version"], "0.33.0");

    // No .python-version up the tree: ROOT/version; PYENV_ROOT names the root.
    let moved = home.path().join("elsewhere/pyenv");
    pyenv_root(&moved);
    let moved_root = moved.display().to_string();
    let moved_path = format!("{}:{SYSTEM}", moved.join("shims").display());
    std::fs::write(moved.join("version"), "3.12.3\n").expect("global version");
    let global = plan_at(
        home.path(),
        home.path(),
        &moved_path,
        &[("PYENV_ROOT", &moved_root)],
        &serve,
    );
    assert_eq!(version(&global)["version"], "0.33.0", "{}", global.stdout);
    // Shims of a root that is neither PYENV_ROOT nor ~/.pyenv are not pyenv's.
    let foreign = plan_at(home.path(), home.path(), &moved_path, &[], &serve);
    why_none(&foreign, "not a Python interpreter");
}

/// A `.python-version` that is a FIFO is passed by (pyenv's `[ -f ]`), the
/// next one up is read; one of 2 MiB is not read and says so; a version
/// named `../…` is skipped as pyenv skips it, never reaching outside
/// `versions/`. No hang. Before: no shim was followed.
#[test]
fn hostile_python_version_files_never_hang_nor_escape_the_root() {
    let home = tempfile::tempdir().expect("home");
    let root = home.path().join(".pyenv");
    pyenv_root(&root);
    let path = format!("{}:{SYSTEM}", root.join("shims").display());
    let model = published("llama-3.1-8b");
    let serve = vllm(&model, &[]);

    let project = home.path().join("project");
    let fifo_dir = project.join("fifo");
    std::fs::create_dir_all(&fifo_dir).expect("dirs");
    std::fs::write(project.join(".python-version"), "3.12.3\n").expect("pin");
    let status = std::process::Command::new("mkfifo")
        .arg(fifo_dir.join(".python-version"))
        .status()
        .expect("mkfifo");
    assert!(status.success());
    let passed = plan_at(&fifo_dir, home.path(), &path, &[], &serve);
    assert_eq!(version(&passed)["version"], "0.33.0", "{}", passed.stdout);

    let huge_dir = project.join("huge");
    std::fs::create_dir_all(&huge_dir).expect("huge");
    let mut huge = "3.12.3\n".to_string();
    huge.push_str(&"#".repeat(2 << 20));
    std::fs::write(huge_dir.join(".python-version"), huge).expect("huge");
    let big = plan_at(&huge_dir, home.path(), &path, &[], &serve);
    why_none(&big, "larger than 1 MiB");

    // `../evil` would be ROOT/evil, with a vllm 9.9.9 of its own.
    let evil = root.join("evil");
    let evil_venv = Venv::at(&evil);
    evil_venv.install("vllm", "9.9.9");
    evil_venv.console_script("vllm");
    let escape_dir = project.join("escape");
    std::fs::create_dir_all(&escape_dir).expect("escape");
    std::fs::write(escape_dir.join(".python-version"), "../evil\n..\n").expect("escape");
    let escaped = plan_at(&escape_dir, home.path(), &path, &[], &serve);
    let why = why_none(&escaped, "no version of system");
    assert!(!why.contains("9.9.9"), "{why}");
    let by_env = plan_at(
        &escape_dir,
        home.path(),
        &path,
        &[("PYENV_VERSION", "../evil")],
        &serve,
    );
    why_none(&by_env, "(PYENV_VERSION) has vllm installed");
}
