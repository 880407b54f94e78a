//! Which engine version a command would run, and whose rules plan applies.
//!
//! The version is read the way the interpreter would find the package,
//! without running or importing anything: the command's interpreter (its
//! path, or looked up on the engine's `PATH` as `execvp` does; for `vllm
//! serve` / `sglang serve`, the console script's `#!` line), then the
//! directories its `sys.path` holds (`PYTHONPATH`; a venv's `pyvenv.cfg`
//! and `lib/pythonX.Y/site-packages` beside it, the base's too with
//! `include-system-site-packages`; else the prefix's
//! `lib/pythonX.Y/site-packages`, and for a prefix of `/usr` Debian's
//! `/usr/local/lib/pythonX.Y/dist-packages`, `/usr/lib/python3/dist-packages`),
//! the first holding a `vllm-*.dist-info` (`sglang-*`) wins, and its
//! `METADATA`'s `Version:` is the version. Every file is read bounded and
//! without waiting (`file::read_regular`): a FIFO, a huge file, a symlink
//! loop give "not found", never a hang.
//!
//! Launchers are followed as they would resolve, from their files: `uv run`
//! in its project's environment (`uv_environment`), a pyenv shim (the
//! command or the `#!` interpreter) to the version pyenv would pick
//! (`follow_shim`). Where the environment is one the launcher builds at the
//! start (`uv run --with …`), no version is found, and the reason says so.
//!
//! Rules kept (`Rules`): vLLM 0.26.0 and 0.33.0, SGLang 0.5.9, 0.5.14 and 0.5.23,
//! where they differ (docs/plan.md, "Engine versions"). Another version
//! gets the nearest kept rules, and says so; none found, the default
//! (`Rules::default_for`), the rules the corpus of real starts pins.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::launch::{Engine, UvRun, is_python};
use crate::file::executable;

/// The rule sets kept, one per engine release whose arithmetic differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rules {
    Vllm0_26,
    Vllm0_33,
    Sglang0_5_9,
    Sglang0_5_14,
    Sglang0_5_23,
}

impl Rules {
    /// The version whose rules these are, as the engine names it.
    pub fn version(self) -> &'static str {
        match self {
            Rules::Vllm0_26 => "0.26.0",
            Rules::Vllm0_33 => "0.33.0",
            Rules::Sglang0_5_9 => "0.5.9",
            Rules::Sglang0_5_14 => "0.5.14",
            Rules::Sglang0_5_23 => "0.5.23",
        }
    }

    fn release(self) -> Release {
        Release::parse(self.version()).unwrap_or_default()
    }

    fn kept(engine: Engine) -> &'static [Rules] {
        match engine {
            Engine::Vllm => &[Rules::Vllm0_26, Rules::Vllm0_33],
            Engine::Sglang => &[Rules::Sglang0_5_9, Rules::Sglang0_5_14, Rules::Sglang0_5_23],
        }
    }

    /// No version found: the rules the real starts of the corpus
    /// (tests/fixtures/logs) were measured with.
    pub(crate) fn default_for(engine: Engine) -> Rules {
        match engine {
            Engine::Vllm => Rules::Vllm0_26,
            Engine::Sglang => Rules::Sglang0_5_9,
        }
    }

    /// The kept rules nearest to `release` (the older of two as near).
    fn nearest(engine: Engine, release: Release) -> Rules {
        let mut best = Rules::default_for(engine);
        let mut best_distance = u64::MAX;
        for &rules in Rules::kept(engine) {
            let distance = rules.release().scalar().abs_diff(release.scalar());
            if distance < best_distance {
                (best, best_distance) = (rules, distance);
            }
        }
        best
    }

    /// vLLM 0.33.0 `kv_connector/v1/offloading/config.py`
    /// (`replicated_layout`): a pure-MLA model at TP > 1, TP only, one
    /// node, stores each offloaded block once on the host, not once per
    /// worker (`kv_offload/cpu/spec.py`: `num_copies = 1`). 0.26.0 has no
    /// such layout.
    pub(crate) fn vllm_mla_offload_single_copy(self) -> bool {
        self == Rules::Vllm0_33
    }

    /// SGLang 0.5.23 `kv_cache_configurator.py` `resolve_max_num_reqs`: a
    /// given `--max-running-requests` becomes `max(1, n // attention-DP)`
    /// capped at `tokens // 2`; 0.5.9 `model_runner.py` takes `n // DP`
    /// as it is.
    pub(crate) fn sglang_given_requests_capped(self) -> bool {
        self == Rules::Sglang0_5_23
    }

    /// SGLang 0.5.23 `mem_cache/hicache_auto_size.py`: HiCache with
    /// neither `--hicache-ratio` nor `--hicache-size` lowers the ratio 2.0
    /// until the host pools fit `--hicache-host-memory-fraction` (0.8) of
    /// each rank's share of the host (`engine::host_tier`); 0.5.9 asks for
    /// 2.0 and refuses to start when the host lacks it.
    pub(crate) fn sglang_hicache_auto_size(self) -> bool {
        self == Rules::Sglang0_5_23
    }

    /// vLLM 0.33.0 `engine/arg_utils.py` turns prefix caching on by
    /// default for hybrid (attention + Mamba) models too, and
    /// `MambaModelConfig` then holds their state in mamba cache mode
    /// `align`; 0.26.0 keeps it off for them (mode `none`).
    pub(crate) fn vllm_hybrid_prefix_caching_default(self) -> bool {
        self == Rules::Vllm0_33
    }

    /// vLLM 0.33.0 `MambaStateDtypeCalculator.kda_state_dtype` takes
    /// `--mamba-ssm-cache-dtype` for KDA's recurrent state (float32 under
    /// `auto`); 0.26.0 keeps it float32 whatever is given.
    pub(crate) fn vllm_kda_reads_ssm_cache_dtype(self) -> bool {
        self == Rules::Vllm0_33
    }

    /// SGLang 0.5.23 `kv_cache_configurator.py` `_handle_max_mamba_cache`:
    /// the state pool keeps one padding slot (`(budget − per_req) //
    /// per_req` slots, `slots + 1` allocated), and the radix cache's
    /// `extra_buffer` strategy (the default for these models with the
    /// overlap scheduler) holds 2 more slots a running request
    /// (`_calculate_mamba_ratio`); 0.5.9 `handle_max_mamba_cache`: `budget
    /// // per_req` slots, 3 a request.
    pub(crate) fn sglang_mamba_padding_slot_and_extra_buffer(self) -> bool {
        self == Rules::Sglang0_5_23
    }

    /// SGLang 0.5.23 `pool_configurator.py` `_compute_cell_size` counts a
    /// sparse-attention (DSA) model's FP8 cell as the layout its pool
    /// stores (`kv_cache_configurator.py` `calculate_mla_kv_cache_dim`:
    /// `kv_lora_rank` FP8 bytes, a float32 scale per 128 of them, the RoPE
    /// in bf16; the Hopper FP8 backend `flashmla_kv`); 0.5.9
    /// `get_cell_size_per_token` counts `kv_lora_rank + qk_rope_head_dim`
    /// bytes.
    pub(crate) fn sglang_dsa_fp8_cell_is_stored_layout(self) -> bool {
        self == Rules::Sglang0_5_23
    }

    /// SGLang 0.5.9 `memory_pool_host.py` (0.5.14 `pool_host/base.py`)
    /// asserts the host pool is larger than the device pool (the start
    /// fails); 0.5.23 `pool_host/base.py` `_allocate_host_buffer` only warns.
    pub(crate) fn sglang_host_smaller_than_device_refused(self) -> bool {
        matches!(self, Rules::Sglang0_5_9 | Rules::Sglang0_5_14)
    }

    /// SGLang 0.5.14 `server_args.py` `_handle_gpu_memory_settings`: with
    /// prefill CUDA graphs on (`tc_piecewise`, its default), the default
    /// `--mem-fraction-static` reserves 8 MiB more per prefill graph size
    /// (1.5 GiB for an MLA model); 0.5.9 captures no prefill graphs by
    /// default and reserves nothing for them. 0.5.23
    /// (`arg_groups/memory_hook.py` `reserve_for_graph_mb`) has the same
    /// term among others not modelled (docs/plan.md, "Engine versions") and
    /// keeps 0.5.9's fraction here.
    pub(crate) fn sglang_prefill_graph_reserve(self) -> bool {
        self == Rules::Sglang0_5_14
    }

    /// What SGLang 0.5.14 allocated besides the weights while loading, on
    /// one GPU, measured by the corpus of real starts
    /// (`engine::SGLANG_LOAD_OVERHEAD_TP1_BYTES`); the other versions keep
    /// the 1 GiB estimate, measured at TP8 only.
    pub(crate) fn sglang_load_overhead_measured_at_tp1(self) -> bool {
        self == Rules::Sglang0_5_14
    }
}

/// A version's release numbers (`0.33.0+cu129` → 0, 33, 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Release([u32; 3]);

impl Release {
    /// The leading `N.N[.N]` of a PEP 440 version (an optional `v` before
    /// it); what follows (`rc1`, `.post1`, `+cu129`) is not compared.
    fn parse(text: &str) -> Option<Release> {
        let text = text.trim();
        let text = text.strip_prefix('v').unwrap_or(text);
        let mut parts = [0u32; 3];
        let mut count = 0;
        for part in text.split('.') {
            let digits: &str = &part[..part
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(part.len())];
            if digits.is_empty() || digits.len() > 6 || count == 3 {
                break;
            }
            parts[count] = digits.parse().ok()?;
            count += 1;
            if digits.len() != part.len() {
                break;
            }
        }
        (count >= 2).then_some(Release(parts))
    }

    /// One number that keeps the order and the distance of near releases.
    fn scalar(self) -> u64 {
        let [major, minor, patch] = self.0.map(u64::from);
        major * 1_000_000_000_000 + minor * 1_000_000 + patch
    }
}

/// Where the version came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The installed distribution's `METADATA`.
    Metadata {
        version: String,
        interpreter: PathBuf,
        metadata: PathBuf,
    },
    /// `--engine-version`.
    Flag { version: String },
    /// No version: why not.
    None { why: String },
}

/// The version the command would run, and the rules plan applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineVersion {
    pub found: Found,
    pub rules: Rules,
}

impl EngineVersion {
    /// The version found or given, if any.
    pub fn version(&self) -> Option<&str> {
        match &self.found {
            Found::Metadata { version, .. } | Found::Flag { version } => Some(version),
            Found::None { .. } => None,
        }
    }

    /// Whether the rules are another version's (the nearest kept, or the
    /// default).
    pub fn other_rules(&self) -> bool {
        self.version()
            .and_then(Release::parse)
            .is_none_or(|release| release != self.rules.release())
    }

    /// The rules for a version given by `--engine-version` (already
    /// checked by `parse_flag`).
    pub fn given(engine: Engine, version: &str) -> EngineVersion {
        let release = Release::parse(version).unwrap_or_default();
        EngineVersion {
            found: Found::Flag {
                version: version.to_string(),
            },
            rules: Rules::nearest(engine, release),
        }
    }

    /// The default rules, no version known.
    pub fn unknown(engine: Engine, why: String) -> EngineVersion {
        EngineVersion {
            found: Found::None { why },
            rules: Rules::default_for(engine),
        }
    }
}

/// `--engine-version X`: a version as the engines number them (`0.33.0`,
/// `0.5.23.post1`); anything else is bad input.
pub fn parse_flag(text: &str) -> Result<String, String> {
    match Release::parse(text) {
        Some(_) if text.len() <= 64 && !text.chars().any(char::is_control) => {
            Ok(text.trim().to_string())
        }
        _ => Err(format!(
            "invalid --engine-version '{}': expected a version like 0.33.0 or 0.5.23",
            crate::units::short(text, 40)
        )),
    }
}

/// The most bytes read of a `METADATA`, a `pyvenv.cfg` or a console
/// script: real ones are tens of KB.
const FILE_MAX: u64 = 1 << 20;
/// The most entries looked at in one site-packages directory, and the
/// most `PATH` and `PYTHONPATH` entries.
const ENTRIES_MAX: usize = 100_000;
const PATH_ENTRIES_MAX: usize = 1024;
/// The longest version string kept from a `METADATA`.
const VERSION_MAX: usize = 64;

/// Where the engine would start: its working directory (`None`: not
/// known), and `uv run`'s options when it launches the command.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StartsIn<'a> {
    pub cwd: Option<&'a Path>,
    pub uv_run: Option<&'a UvRun>,
}

/// The version `program` (the command's first word after its environment
/// and launcher: an interpreter or a console script) would run, in `env`,
/// started as `start` says.
pub(crate) fn detect(
    engine: Engine,
    program: &str,
    env: &BTreeMap<String, String>,
    start: StartsIn<'_>,
) -> EngineVersion {
    let mut env = env.clone();
    let found = match start.uv_run {
        Some(uv) => uv_environment(engine, uv, &env, start.cwd).and_then(|uv_env| {
            let venv = &uv_env.venv;
            // `uv run` puts the environment's bin first on PATH.
            prepend_path(&mut env, &venv.join("bin"));
            env.insert("VIRTUAL_ENV".to_string(), venv.display().to_string());
            let found = find(engine, program, &mut env, start.cwd)
                .map_err(|why| format!("uv run in {}: {why}", venv.display()))?;
            match uv_env.locked {
                Some((lock, locked)) if locked != [found.0.as_str()] => Err(format!(
                    "{} has {} {} but {} pins {}: `uv run` syncs the environment to it before starting",
                    venv.display(),
                    engine.name(),
                    crate::units::short(&found.0, VERSION_MAX),
                    lock.display(),
                    crate::units::short(&locked.join(", "), 200)
                )),
                _ => Ok(found),
            }
        }),
        None => find(engine, program, &mut env, start.cwd),
    };
    match found {
        Ok((version, interpreter, metadata)) => {
            let rules = match Release::parse(&version) {
                Some(release) => Rules::nearest(engine, release),
                None => {
                    return EngineVersion::unknown(
                        engine,
                        format!(
                            "{}: Version \"{}\" is not a version",
                            metadata.display(),
                            crate::units::short(&version, VERSION_MAX)
                        ),
                    );
                }
            };
            EngineVersion {
                found: Found::Metadata {
                    version,
                    interpreter,
                    metadata,
                },
                rules,
            }
        }
        Err(why) => EngineVersion::unknown(engine, why),
    }
}

type Detected = (String, PathBuf, PathBuf);

fn find(
    engine: Engine,
    program: &str,
    env: &mut BTreeMap<String, String>,
    cwd: Option<&Path>,
) -> Result<Detected, String> {
    let located = follow_shim(locate(program, env)?, env, cwd)?;
    let interpreter = if is_python(&located.to_string_lossy()) {
        located
    } else {
        let interpreter = interpreter_of_script(&located, env)?;
        follow_shim(interpreter, env, cwd)?
    };
    let dirs = search_path(&interpreter, env);
    let package = engine.name();
    for dir in &dirs {
        if let Some(dist_info) = dist_info(dir, package) {
            let metadata = dist_info.join("METADATA");
            let version = read_version(&metadata, package)?;
            return Ok((version, interpreter, metadata));
        }
    }
    Err(format!(
        "{} has no {package}-*.dist-info in {}",
        interpreter.display(),
        if dirs.is_empty() {
            "any site-packages (none found)".to_string()
        } else {
            dirs.iter()
                .map(|dir| dir.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    ))
}

/// The engine's `PATH`: `/bin:/usr/bin` when unset, as `execvp` takes it.
fn exec_path(env: &BTreeMap<String, String>) -> &str {
    env.get("PATH").map_or("/bin:/usr/bin", String::as_str)
}

/// `dir` first on the engine's `PATH`, as a launcher puts it.
fn prepend_path(env: &mut BTreeMap<String, String>, dir: &Path) {
    let path = format!("{}:{}", dir.display(), exec_path(env));
    env.insert("PATH".to_string(), path);
}

/// `program` as `execvp` finds it: a path when it has a `/`, else the
/// first executable regular file of that name in `PATH` (`/bin:/usr/bin`
/// when unset).
fn locate(program: &str, env: &BTreeMap<String, String>) -> Result<PathBuf, String> {
    if program.contains('/') {
        let path = PathBuf::from(program);
        return if executable(&path) {
            Ok(path)
        } else {
            Err(format!("{program} is not an executable file"))
        };
    }
    exec_path(env)
        .split(':')
        .take(PATH_ENTRIES_MAX)
        .map(|dir| Path::new(if dir.is_empty() { "." } else { dir }).join(program))
        .find(|candidate| executable(candidate))
        .ok_or_else(|| format!("{program} is not on the engine's PATH"))
}

/// The interpreter a console script (`vllm`, `sglang`) runs: its `#!`
/// line (`#!/venv/bin/python3`, `#!/usr/bin/env python3`), or pip's
/// `#!/bin/sh` form for long paths (`'''exec' "/venv/bin/python" "$0" "$@"`).
fn interpreter_of_script(script: &Path, env: &BTreeMap<String, String>) -> Result<PathBuf, String> {
    let not_script = |why: &str| format!("{}: {why}", script.display());
    let (_, bytes) = crate::file::read_regular(script, FILE_MAX).map_err(|why| not_script(&why))?;
    let text = String::from_utf8_lossy(&bytes);
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("");
    let shebang = first
        .strip_prefix("#!")
        .ok_or_else(|| not_script("not a script with a #! line"))?;
    let mut words = shebang.split_whitespace();
    let command = words.next().unwrap_or("");
    let interpreter = if Path::new(command)
        .file_name()
        .is_some_and(|name| name == "env")
    {
        let name = words
            .find(|word| !word.starts_with('-'))
            .ok_or_else(|| not_script("#!/usr/bin/env names no interpreter"))?;
        locate(name, env)?
    } else if command == "/bin/sh" {
        let exec = lines
            .next()
            .and_then(|line| line.strip_prefix("'''exec' "))
            .ok_or_else(|| not_script("a shell script, not a Python console script"))?;
        let path = exec.trim_start_matches('"');
        PathBuf::from(&path[..path.find('"').unwrap_or(path.len())])
    } else {
        PathBuf::from(command)
    };
    if is_python(&interpreter.to_string_lossy()) {
        Ok(interpreter)
    } else {
        Err(not_script(&format!(
            "its #! names {}, not a Python interpreter",
            crate::units::short(&interpreter.display().to_string(), 200)
        )))
    }
}

/// The directories of the interpreter's `sys.path` a distribution may be
/// installed in, in its order.
fn search_path(interpreter: &Path, env: &BTreeMap<String, String>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = env
        .get("PYTHONPATH")
        .map(|path| {
            path.split(':')
                .filter(|dir| !dir.is_empty())
                .take(PATH_ENTRIES_MAX)
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default();
    let bin = interpreter.parent().unwrap_or(Path::new("."));
    let venv = [Some(bin), bin.parent()]
        .into_iter()
        .flatten()
        .map(|dir| dir.join("pyvenv.cfg"))
        .find_map(|cfg| {
            crate::file::read_regular(&cfg, FILE_MAX)
                .ok()
                .map(|(_, b)| (cfg, b))
        });
    match venv {
        Some((cfg, bytes)) => {
            let prefix = cfg.parent().unwrap_or(Path::new(".")).to_path_buf();
            let cfg = String::from_utf8_lossy(&bytes);
            let value = |key: &str| {
                cfg.lines().find_map(|line| {
                    let (name, value) = line.split_once('=')?;
                    (name.trim() == key).then(|| value.trim().to_string())
                })
            };
            let minor = value("version")
                .or_else(|| value("version_info"))
                .and_then(|version| python_minor(&version));
            dirs.extend(prefix_dirs(&prefix, minor.as_deref(), false));
            if value("include-system-site-packages").is_some_and(|v| v.eq_ignore_ascii_case("true"))
                && let Some(home) = value("home")
            {
                let base = Path::new(&home).parent().unwrap_or(Path::new("/"));
                dirs.extend(prefix_dirs(base, minor.as_deref(), true));
            }
        }
        None => {
            let real = std::fs::canonicalize(interpreter).unwrap_or(interpreter.to_path_buf());
            let minor = real
                .file_name()
                .and_then(|name| name.to_str())
                .and_then(|name| name.strip_prefix("python"))
                .and_then(python_minor);
            let prefix = real
                .parent()
                .and_then(Path::parent)
                .unwrap_or(Path::new("/"));
            if let Some(home) = env.get("HOME")
                && let Some(minor) = &minor
            {
                dirs.push(Path::new(home).join(format!(".local/lib/python{minor}/site-packages")));
            }
            dirs.extend(prefix_dirs(prefix, minor.as_deref(), true));
        }
    }
    dirs.into_iter().filter(|dir| dir.is_dir()).collect()
}

/// `3.11.4` → `3.11`.
fn python_minor(version: &str) -> Option<String> {
    let release = Release::parse(version)?;
    Some(format!("{}.{}", release.0[0], release.0[1]))
}

/// A prefix's site-packages: `lib/pythonX.Y/site-packages` (each
/// `lib/python3.*` when the version is not known), and with `system` on a
/// prefix of `/usr`, Debian's dist-packages.
fn prefix_dirs(prefix: &Path, minor: Option<&str>, system: bool) -> Vec<PathBuf> {
    let minors: Vec<String> = match minor {
        Some(minor) => vec![minor.to_string()],
        None => {
            let mut found: Vec<String> = std::fs::read_dir(prefix.join("lib"))
                .into_iter()
                .flatten()
                .take(ENTRIES_MAX)
                .filter_map(|entry| {
                    let name = entry.ok()?.file_name().into_string().ok()?;
                    let minor = name.strip_prefix("python")?;
                    python_minor(minor).filter(|m| m == minor)
                })
                .collect();
            found.sort();
            found.reverse();
            found
        }
    };
    let mut dirs = Vec::new();
    let usr = system && prefix == Path::new("/usr");
    for minor in &minors {
        if usr {
            dirs.push(PathBuf::from(format!(
                "/usr/local/lib/python{minor}/dist-packages"
            )));
        }
        dirs.push(prefix.join(format!("lib/python{minor}/site-packages")));
    }
    if usr {
        dirs.push(PathBuf::from("/usr/lib/python3/dist-packages"));
        for minor in &minors {
            dirs.push(PathBuf::from(format!(
                "/usr/lib/python{minor}/dist-packages"
            )));
        }
    }
    dirs
}

/// `dir`'s `PACKAGE-VERSION.dist-info` directory (the name compared as
/// pip normalizes it); the newest when there are several.
fn dist_info(dir: &Path, package: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries
        .take(ENTRIES_MAX)
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let stem = name.strip_suffix(".dist-info")?;
            let (distribution, version) = stem.split_once('-')?;
            let release = Release::parse(version).unwrap_or_default();
            distribution
                .eq_ignore_ascii_case(package)
                .then_some((release, name.clone()))
        })
        .max()
        .map(|(_, name)| dir.join(name))
}

/// `Version:` of a `METADATA` whose `Name:` is `package`.
fn read_version(metadata: &Path, package: &str) -> Result<String, String> {
    let unreadable = |why: String| format!("{}: {why}", metadata.display());
    let (_, bytes) = crate::file::read_regular(metadata, FILE_MAX).map_err(unreadable)?;
    let text = String::from_utf8_lossy(&bytes);
    let header = |key: &str| {
        text.lines()
            .take_while(|line| !line.is_empty())
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case(key)
                    .then(|| value.trim().to_string())
            })
    };
    if !header("Name").is_some_and(|name| name.eq_ignore_ascii_case(package)) {
        return Err(unreadable(format!(
            "not the metadata of {package} (no Name: {package})"
        )));
    }
    match header("Version") {
        Some(version) if !version.is_empty() => Ok(version.chars().take(VERSION_MAX).collect()),
        _ => Err(unreadable("no Version:".to_string())),
    }
}

/// The environment `uv run` runs its command in, and, unless it runs it
/// unsynced, the engine's versions the project's `uv.lock` pins (uv syncs
/// the environment to them first).
struct UvEnvironment {
    venv: PathBuf,
    locked: Option<(PathBuf, Vec<String>)>,
}

/// The environment `uv run` runs its command in: the project's, found from
/// the working directory (after `--directory`, `--project`) upwards as the
/// first directory holding a `pyproject.toml`, at its `.venv` or
/// `UV_PROJECT_ENVIRONMENT` (relative to the project); with `--active`,
/// `VIRTUAL_ENV` first. An environment uv builds at the start (`--with`,
/// `--isolated`, `--no-project`, a script), a project inside a uv
/// workspace, or a project environment not yet made: why not.
fn uv_environment(
    engine: Engine,
    uv: &UvRun,
    env: &BTreeMap<String, String>,
    cwd: Option<&Path>,
) -> Result<UvEnvironment, String> {
    if let Some(option) = &uv.ephemeral {
        return Err(format!(
            "`uv run {}` runs it in an environment uv builds at the start: which packages it gets, no file tells beforehand",
            crate::units::short(option, 100)
        ));
    }
    let cwd = cwd.ok_or("the working directory `uv run` starts in is not known")?;
    let mut start = cwd.to_path_buf();
    for dir in [&uv.directory, &uv.project].into_iter().flatten() {
        start = start.join(dir);
    }
    let set = |name: &str| env.get(name).filter(|value| !value.is_empty());
    if uv.active
        && let Some(active) = set("VIRTUAL_ENV")
    {
        return Ok(UvEnvironment {
            venv: cwd.join(active),
            locked: None,
        });
    }
    let start = std::fs::canonicalize(&start)
        .map_err(|error| format!("uv run: {}: {error}", start.display()))?;
    let project = start
        .ancestors()
        .find(|dir| dir.join("pyproject.toml").is_file())
        .ok_or_else(|| {
            format!(
                "no pyproject.toml in {} or above: `uv run` runs it outside a project, which plan does not follow",
                start.display()
            )
        })?;
    if let Some(root) = project.ancestors().skip(1).find(|dir| {
        crate::file::read_regular(&dir.join("pyproject.toml"), FILE_MAX).is_ok_and(|(_, bytes)| {
            String::from_utf8_lossy(&bytes)
                .lines()
                .any(|line| line.trim() == "[tool.uv.workspace]")
        })
    }) {
        return Err(format!(
            "{} is inside the uv workspace of {}: whether its environment is the workspace's, plan does not read",
            project.display(),
            root.join("pyproject.toml").display()
        ));
    }
    let venv = project.join(set("UV_PROJECT_ENVIRONMENT").map_or(".venv", String::as_str));
    let unsynced = uv.no_sync
        || set("UV_NO_SYNC").is_some_and(|value| {
            ["1", "true", "yes", "on"].contains(&value.to_ascii_lowercase().as_str())
        });
    let lock = project.join("uv.lock");
    let locked = if unsynced {
        None
    } else {
        locked_versions(&lock, engine.name())?.map(|versions| (lock, versions))
    };
    if !venv.is_dir() {
        return Err(format!(
            "{} does not exist: `uv run` would make it and install the project's packages at the start{}",
            venv.display(),
            match &locked {
                Some((lock, versions)) => format!(
                    " ({} pins {} {})",
                    lock.display(),
                    engine.name(),
                    crate::units::short(&versions.join(", "), 200)
                ),
                None => String::new(),
            }
        ));
    }
    Ok(UvEnvironment { venv, locked })
}

/// The versions of `package` a `uv.lock` pins (its `[[package]]` tables'
/// `name` and `version`; several where the resolution forks), `None` when
/// there is no lock or it does not name the package.
fn locked_versions(lock: &Path, package: &str) -> Result<Option<Vec<String>>, String> {
    if !lock.exists() {
        return Ok(None);
    }
    let (_, bytes) = crate::file::read_regular(lock, FILE_MAX)
        .map_err(|why| format!("{}: {why}", lock.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    let value = |line: &str, key: &str| {
        let (name, value) = line.split_once('=')?;
        (name.trim() == key).then(|| value.trim().trim_matches('"').to_string())
    };
    let mut versions: Vec<String> = Vec::new();
    let mut name: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            name = None;
            continue;
        }
        if let Some(found) = value(line, "name") {
            name = Some(found);
        } else if let Some(version) = value(line, "version")
            && name
                .as_deref()
                .is_some_and(|name| name.eq_ignore_ascii_case(package))
            && !versions.contains(&version)
            && versions.len() < VERSIONS_MAX
        {
            versions.push(version.chars().take(VERSION_MAX).collect());
        }
    }
    Ok((!versions.is_empty()).then_some(versions))
}

/// The most versions taken from `PYENV_VERSION` or a version file.
const VERSIONS_MAX: usize = 64;

/// What a pyenv shim runs: `path` itself unless it is in the `shims`
/// directory of the pyenv root (`PYENV_ROOT`, else `~/.pyenv`); then the
/// command of the version pyenv picks (`PYENV_VERSION`, else the first
/// `.python-version` from the working directory upwards, else
/// `ROOT/version`, else `system`; of several, the first that has the
/// command): `ROOT/versions/V/bin/NAME`, whose `bin` then comes first on
/// `PATH` as `pyenv exec` puts it; `system`, the command on `PATH` without
/// the shims.
fn follow_shim(
    path: PathBuf,
    env: &mut BTreeMap<String, String>,
    cwd: Option<&Path>,
) -> Result<PathBuf, String> {
    let (Some(shims), Some(name)) = (path.parent(), path.file_name()) else {
        return Ok(path);
    };
    let root = match env.get("PYENV_ROOT").filter(|root| !root.is_empty()) {
        Some(root) => PathBuf::from(root),
        None => match env.get("HOME") {
            Some(home) => Path::new(home).join(".pyenv"),
            None => return Ok(path),
        },
    };
    if shims.file_name().is_none_or(|dir| dir != "shims")
        || shims.parent().is_none_or(|dir| !same_dir(dir, &root))
    {
        return Ok(path);
    }
    let shim = |why: String| format!("pyenv shim {}: {why}", path.display());
    let (versions, source) = pyenv_versions(&root, env, cwd).map_err(shim)?;
    for version in &versions {
        if version == "system" {
            let without: Vec<&str> = exec_path(env)
                .split(':')
                .filter(|dir| !same_dir(Path::new(if dir.is_empty() { "." } else { dir }), shims))
                .collect();
            let mut system = env.clone();
            system.insert("PATH".to_string(), without.join(":"));
            if let Ok(found) = locate(&name.to_string_lossy(), &system) {
                return Ok(found);
            }
            continue;
        }
        if let Some(prefix) = pyenv_installed(&root, version) {
            let command = prefix.join("bin").join(name);
            if executable(&command) {
                prepend_path(env, &prefix.join("bin"));
                return Ok(command);
            }
        }
    }
    Err(shim(format!(
        "no version of {} ({source}) has {} installed in {}",
        if versions.is_empty() {
            "none".to_string()
        } else {
            crate::units::short(&versions.join(":"), 200)
        },
        name.to_string_lossy(),
        root.join("versions").display()
    )))
}

/// Whether two paths name one directory (the same path, or the same
/// inode once their links are followed).
fn same_dir(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    a == b
        || match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(a), Ok(b)) => a.is_dir() && a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
}

/// The versions pyenv would pick, in its order, and where they were read
/// (`PYENV_VERSION`, or the version file): a name with `/` or `..`, an
/// empty line or a `#` comment is skipped, as pyenv skips it; nothing left
/// is `system`.
fn pyenv_versions(
    root: &Path,
    env: &BTreeMap<String, String>,
    cwd: Option<&Path>,
) -> Result<(Vec<String>, String), String> {
    let (words, source): (Vec<String>, String) =
        match env.get("PYENV_VERSION").filter(|v| !v.is_empty()) {
            Some(value) => (
                value.split(':').map(str::to_string).collect(),
                "PYENV_VERSION".to_string(),
            ),
            None => {
                let cwd = cwd.ok_or(
                    "the working directory, where pyenv looks for .python-version, is not known",
                )?;
                // pyenv's `[ -f ]`: what is not a regular file (a FIFO) is passed by.
                let file = cwd
                    .ancestors()
                    .map(|dir| dir.join(".python-version"))
                    .chain([root.join("version")])
                    .find(|file| file.is_file());
                match file {
                    None => (Vec::new(), "no version file".to_string()),
                    Some(file) => {
                        let (_, bytes) = crate::file::read_regular(&file, FILE_MAX)
                            .map_err(|why| format!("{}: {why}", file.display()))?;
                        let words = String::from_utf8_lossy(&bytes)
                            .lines()
                            .take(ENTRIES_MAX)
                            .filter_map(|line| line.split_whitespace().next())
                            .map(str::to_string)
                            .collect();
                        (words, file.display().to_string())
                    }
                }
            }
        };
    let mut versions: Vec<String> = words
        .into_iter()
        .filter(|word| {
            !word.is_empty() && !word.starts_with('#') && word != ".." && !word.contains('/')
        })
        .take(VERSIONS_MAX)
        .collect();
    if versions.is_empty() {
        versions.push("system".to_string());
    }
    Ok((versions, source))
}

/// `ROOT/versions/VERSION`, as pyenv finds it: the directory of that name,
/// else without a `python-` prefix, else the newest installed release
/// `VERSION.N…` (`3.12` → `3.12.3`).
fn pyenv_installed(root: &Path, version: &str) -> Option<PathBuf> {
    let versions = root.join("versions");
    let exact = [Some(version), version.strip_prefix("python-")]
        .into_iter()
        .flatten()
        .map(|name| versions.join(name))
        .find(|dir| dir.is_dir());
    if exact.is_some() {
        return exact;
    }
    let prefix = format!("{version}.");
    std::fs::read_dir(&versions)
        .ok()?
        .take(ENTRIES_MAX)
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let rest = name.strip_prefix(&prefix)?;
            let release = rest.chars().all(|c| c.is_ascii_digit() || c == '.')
                && !rest.is_empty()
                && !rest.ends_with('.');
            release.then(|| (Release::parse(&name).unwrap_or_default(), name.clone()))
        })
        .max()
        .map(|(_, name)| versions.join(name))
}
