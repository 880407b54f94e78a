//! `gpureap push -H LIST`: puts this gpureap (or `--bin FILE`) on every
//! host through the same ssh the fleet uses, so that `status -H` works on
//! hosts that have no Rust toolchain.
//!
//! Per host, two ssh calls: a look (what is at the destination, its
//! checksum, whether gpureap put it there), then, if needed, the copy:
//! into a temporary name in the destination's directory, checked against
//! the checksum, fsynced, run once (`--version`), and renamed over the
//! destination, so that the destination is at every moment either the old
//! file or the whole new one. What push installs is recorded on the host
//! (`/var/lib/gpureap/pushed` for root, `~/.local/state/gpureap/pushed`
//! otherwise); a file at the destination that push did not put there, or
//! that was changed since, is left alone unless `--force`.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{Answer, Fleet, HostResult, fleet_json, worst};
use crate::config::UsageError;
use crate::exit::Exit;
use crate::report::{new_table, short};

/// Reports where the destination is and what is there. Arguments: the
/// destination (empty: the default for the remote user).
const LOOK: &str = r#"
dest=$1
if [ -z "$dest" ]; then
  if [ "$(id -u)" = 0 ]; then dest=/usr/local/bin/gpureap; else dest=$HOME/.local/bin/gpureap; fi
fi
case $dest in "~/"*) dest=$HOME/${dest#"~/"} ;; esac
if [ "$(id -u)" = 0 ]; then state=/var/lib/gpureap; else state=${XDG_STATE_HOME:-$HOME/.local/state}/gpureap; fi
echo "dest=$dest"
if [ -L "$dest" ]; then echo "exists=symlink"
elif [ -d "$dest" ]; then echo "exists=directory"
elif [ -e "$dest" ]; then
  echo "exists=file"
  sum=$(sha256sum < "$dest" | cut -d' ' -f1) || exit 70
  echo "sha256=$sum"
  if grep -qxF "$sum $dest" "$state/pushed" 2>/dev/null; then echo "ours=yes"; else echo "ours=no"; fi
  if [ -x "$dest" ]; then echo "version=$("$dest" --version 2>/dev/null | head -n 1)"; fi
else echo "exists=no"
fi
"#;

/// Copies stdin to the destination atomically. Arguments: destination,
/// expected checksum, the checksum of what may be replaced (`none` for
/// nothing, `any` with --force).
const COPY: &str = r#"
set -eu
dest=$1 sum=$2 replaces=$3
if [ "$(id -u)" = 0 ]; then state=/var/lib/gpureap; else state=${XDG_STATE_HOME:-$HOME/.local/state}/gpureap; fi
dir=$(dirname -- "$dest")
mkdir -p -- "$dir"
tmp=$(mktemp "$dir/.gpureap-push.XXXXXX")
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp"
got=$(sha256sum < "$tmp" | cut -d' ' -f1)
if [ "$got" != "$sum" ]; then echo "checksum mismatch after the copy: $got" >&2; exit 65; fi
chmod 755 "$tmp"
sync -- "$tmp" 2>/dev/null || sync
if ! version=$("$tmp" --version 2>&1 | head -n 1) || [ "${version#gpureap }" = "$version" ]; then
  echo "the copied binary does not run there: $version" >&2; exit 66
fi
# What is there now must still be what was seen, unless --force.
if [ "$replaces" != any ]; then
  if [ -e "$dest" ] || [ -L "$dest" ]; then
    now=$(sha256sum < "$dest" | cut -d' ' -f1)
    if [ "$replaces" = none ] || [ "$now" != "$replaces" ]; then
      echo "the file at $dest changed while pushing; left alone" >&2; exit 67
    fi
  fi
fi
mv -f -- "$tmp" "$dest"
trap - EXIT
sync -- "$dir" 2>/dev/null || true
mkdir -p -- "$state"
{ awk -v d="$dest" 'substr($0, 66) != d' "$state/pushed" 2>/dev/null || true; echo "$sum $dest"; } > "$state/pushed.new"
mv -f -- "$state/pushed.new" "$state/pushed"
echo "version=$version"
"#;

/// What `push` does with the binary.
pub struct PushRequest<'a> {
    pub bin: &'a Path,
    pub to: Option<&'a str>,
    pub force: bool,
    pub json: bool,
}

/// The binary to push, read and checked here.
struct Binary {
    bytes: Arc<Vec<u8>>,
    sha256: String,
    version: String,
}

fn load(path: &Path) -> Result<Binary, UsageError> {
    let shown = path.display();
    let metadata = fs::metadata(path)
        .map_err(|error| UsageError(format!("cannot read --bin {shown}: {error}")))?;
    if !metadata.is_file() {
        return Err(UsageError(format!("--bin {shown} is not a regular file")));
    }
    if metadata.len() > 512 << 20 {
        return Err(UsageError(format!(
            "--bin {shown} is larger than 512 MiB: not a gpureap binary"
        )));
    }
    let bytes =
        fs::read(path).map_err(|error| UsageError(format!("cannot read {shown}: {error}")))?;
    if !bytes.starts_with(b"\x7fELF") {
        return Err(UsageError(format!(
            "--bin {shown} is not an ELF executable"
        )));
    }
    let output = std::process::Command::new(path)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|error| UsageError(format!("cannot run {shown} --version: {error}")))?;
    let version = String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    if !output.status.success() || !version.starts_with("gpureap ") {
        return Err(UsageError(format!(
            "{shown} --version does not say gpureap: is it a gpureap binary?"
        )));
    }
    let sha256 = Sha256::digest(&bytes)
        .iter()
        .fold(String::new(), |mut hex, byte| {
            let _ = write!(hex, "{byte:02x}");
            hex
        });
    Ok(Binary {
        bytes: Arc::new(bytes),
        sha256,
        version,
    })
}

/// One host's push, as its report in the fleet document.
#[derive(Serialize)]
struct PushJson<'a> {
    schema_version: u32,
    kind: &'static str,
    /// `installed`, `updated`, `up_to_date`, `refused`.
    action: &'static str,
    path: String,
    sha256: &'a str,
    version: Option<String>,
    /// Why it was refused.
    reason: Option<String>,
}

pub struct Output {
    pub text: String,
    pub exit: Exit,
}

pub fn push(fleet: &Fleet, request: &PushRequest) -> Result<Output, UsageError> {
    if let Some(to) = request.to
        && (to.is_empty() || !(to.starts_with('/') || to.starts_with("~/")) || to.ends_with('/'))
    {
        return Err(UsageError(format!(
            "invalid --to '{to}': give the file to install, an absolute path or ~/…, like /usr/local/bin/gpureap"
        )));
    }
    let binary = load(request.bin)?;
    let limit = fleet.limit(Duration::from_secs(60));
    let results = fleet.fan_out_with(&fleet.hosts, |host| {
        push_one(fleet, host, &binary, request, limit)
    });
    let exit = worst(&results);
    let text = if request.json {
        fleet_json("push", &results, exit)
    } else {
        render(&results, &binary)
    };
    Ok(Output { text, exit })
}

fn push_one(
    fleet: &Fleet,
    host: &str,
    binary: &Binary,
    request: &PushRequest,
    limit: Duration,
) -> Answer {
    let started = Instant::now();
    let failed = |error: String| Answer {
        exit_code: 3,
        report: None,
        error: Some(error),
        elapsed: started.elapsed(),
    };
    let script = |body: &str, args: &[&str]| -> Vec<String> {
        ["sh", "-c", body, "gpureap-push"]
            .iter()
            .chain(args)
            .map(|word| word.to_string())
            .collect()
    };
    let look = match fleet.transport.exec(
        host,
        &script(LOOK, &[request.to.unwrap_or("")]),
        None,
        limit,
    ) {
        Ok(look) if look.code == Some(0) => fields(&look.stdout),
        Ok(look) => {
            return failed(format!(
                "cannot look at the destination: {}",
                look.last_error.unwrap_or_else(|| "no reason given".into())
            ));
        }
        Err(error) => return failed(error),
    };
    let path = look.get("dest").cloned().unwrap_or_default();
    let exists = look.get("exists").map(String::as_str).unwrap_or("no");
    let there = look.get("sha256").map(String::as_str);
    let ours = look.get("ours").map(String::as_str) == Some("yes");
    let report = |action: &'static str, version: Option<String>, reason: Option<String>| {
        serde_json::to_value(PushJson {
            schema_version: crate::report::SCHEMA_VERSION,
            kind: "push",
            action,
            path: path.clone(),
            sha256: &binary.sha256,
            version,
            reason,
        })
        .ok()
    };
    let refused = |reason: String| Answer {
        exit_code: 1,
        report: report("refused", None, Some(reason)),
        error: None,
        elapsed: started.elapsed(),
    };
    if exists == "directory" {
        return refused(format!("{path} is a directory: give --to the file's path"));
    }
    if there == Some(binary.sha256.as_str()) {
        let version = look.get("version").cloned();
        if version.as_deref() != Some(binary.version.as_str()) {
            return failed(format!(
                "{path} has this build's checksum but --version says {:?} there",
                version.unwrap_or_default()
            ));
        }
        return Answer {
            exit_code: 0,
            report: report("up_to_date", version, None),
            error: None,
            elapsed: started.elapsed(),
        };
    }
    let replaces = match (exists, there) {
        ("no", _) => "none".to_string(),
        _ if request.force => "any".to_string(),
        ("file", Some(sum)) if ours => sum.to_string(),
        ("symlink", _) => {
            return refused(format!(
                "{path} is a symbolic link gpureap push did not make; pass --force to replace the link"
            ));
        }
        _ => {
            return refused(format!(
                "a different file is at {path}, not put there by gpureap push; pass --force to replace it"
            ));
        }
    };
    let copy = fleet.transport.exec(
        host,
        &script(COPY, &[&path, &binary.sha256, &replaces]),
        Some(binary.bytes.clone()),
        limit,
    );
    match copy {
        Ok(copied) if copied.code == Some(0) => {
            let version = fields(&copied.stdout).get("version").cloned();
            if version.as_deref() != Some(binary.version.as_str()) {
                return failed(format!(
                    "copied to {path}, but --version there says {:?}, not {:?}",
                    version.unwrap_or_default(),
                    binary.version
                ));
            }
            Answer {
                exit_code: 0,
                report: report(
                    if exists == "no" {
                        "installed"
                    } else {
                        "updated"
                    },
                    version,
                    None,
                ),
                error: None,
                elapsed: started.elapsed(),
            }
        }
        Ok(copied) if copied.code == Some(67) => refused(
            copied
                .last_error
                .unwrap_or_else(|| format!("{path} changed while pushing")),
        ),
        Ok(copied) => failed(format!(
            "copy to {path} failed: {}",
            copied
                .last_error
                .unwrap_or_else(|| format!("exit {:?}", copied.code))
        )),
        Err(error) => failed(error),
    }
}

/// `key=value` lines.
fn fields(text: &str) -> std::collections::HashMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

fn render(results: &[HostResult], binary: &Binary) -> String {
    let mut out = format!(
        "Pushing {} (sha256 {}…, {:.1} MiB)\n\n",
        binary.version,
        &binary.sha256[..12],
        binary.bytes.len() as f64 / f64::from(1 << 20)
    );
    let mut rows = Vec::new();
    let mut current = Vec::new();
    for result in results {
        let Some(report) = &result.answer.report else {
            continue;
        };
        let text = |key: &str| report.get(key).and_then(Value::as_str).unwrap_or("");
        match text("action") {
            "up_to_date" => current.push(result.host.as_str()),
            action => rows.push(vec![
                result.host.clone(),
                action.replace('_', " "),
                short(text("path"), 40),
                short(
                    if action == "refused" {
                        text("reason")
                    } else {
                        text("version")
                    },
                    70,
                ),
            ]),
        }
    }
    if !rows.is_empty() {
        let mut table = new_table(&["HOST", "RESULT", "PATH", "VERSION / REASON"]);
        for row in rows {
            table.add_row(row);
        }
        let _ = writeln!(out, "{}\n", table.trim_fmt());
    }
    super::render::fold(&mut out, "Up to date on", &current, "");
    super::render::failures(results, &mut out);
    out
}
