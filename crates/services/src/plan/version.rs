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
//! Rules kept (`Rules`): vLLM 0.26.0 and 0.33.0, SGLang 0.5.9 and 0.5.23,
//! where they differ (docs/plan.md, "Engine versions"). Another version
//! gets the nearest kept rules, and says so; none found, the default
//! (`Rules::default_for`), the rules the corpus of real starts pins.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::launch::{Engine, is_python};
use crate::file::executable;

/// The rule sets kept, one per engine release whose arithmetic differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rules {
    Vllm0_26,
    Vllm0_33,
    Sglang0_5_9,
    Sglang0_5_23,
}

impl Rules {
    /// The version whose rules these are, as the engine names it.
    pub fn version(self) -> &'static str {
        match self {
            Rules::Vllm0_26 => "0.26.0",
            Rules::Vllm0_33 => "0.33.0",
            Rules::Sglang0_5_9 => "0.5.9",
            Rules::Sglang0_5_23 => "0.5.23",
        }
    }

    fn release(self) -> Release {
        Release::parse(self.version()).unwrap_or_default()
    }

    fn kept(engine: Engine) -> &'static [Rules] {
        match engine {
            Engine::Vllm => &[Rules::Vllm0_26, Rules::Vllm0_33],
            Engine::Sglang => &[Rules::Sglang0_5_9, Rules::Sglang0_5_23],
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

    /// SGLang 0.5.9 `memory_pool_host.py` asserts the host pool is larger
    /// than the device pool (the start fails); 0.5.23
    /// `pool_host/base.py` `_allocate_host_buffer` only warns.
    pub(crate) fn sglang_host_smaller_than_device_refused(self) -> bool {
        self == Rules::Sglang0_5_9
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

/// The version `program` (the command's first word after its environment:
/// an interpreter or a console script) would run, in `env`.
pub(crate) fn detect(
    engine: Engine,
    program: &str,
    env: &BTreeMap<String, String>,
) -> EngineVersion {
    match find(engine, program, env) {
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

fn find(engine: Engine, program: &str, env: &BTreeMap<String, String>) -> Result<Detected, String> {
    let located = locate(program, env)?;
    let interpreter = if is_python(&located.to_string_lossy()) {
        located
    } else {
        interpreter_of_script(&located, env)?
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
    let path = env.get("PATH").map_or("/bin:/usr/bin", String::as_str);
    path.split(':')
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
