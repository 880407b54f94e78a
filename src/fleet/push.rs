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
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::exit::Exit;
use crate::file::NotRead;
use crate::remote::ssh::Answer;
use crate::remote::{Fleet, HostResult, fleet_json, worst};
use crate::report::new_table;
use crate::request::UsageError;
use crate::units::short;

/// Reports where the destination is and what is there. Arguments: the
/// destination (empty: the default for the remote user) and the checksum
/// of the binary being pushed. It runs nothing it did not checksum: only a
/// file with that very checksum (this build), read once on one descriptor
/// and run through it, owned by root or the remote user and writable by no
/// one else; whatever else is there is only looked at.
const LOOK: &str = r#"
dest=$1 want=$2
if [ -z "$dest" ]; then
  if [ "$(id -u)" = 0 ]; then dest=/usr/local/bin/gpureap; else dest=$HOME/.local/bin/gpureap; fi
fi
case $dest in "~/"*) dest=$HOME/${dest#"~/"} ;; esac
if [ "$(id -u)" = 0 ]; then state=/var/lib/gpureap; else state=${XDG_STATE_HOME:-$HOME/.local/state}/gpureap; fi
echo "dest=$dest"
if [ -L "$dest" ]; then echo "exists=symlink"
elif [ -d "$dest" ]; then echo "exists=directory"
elif [ -f "$dest" ]; then
  exec 3< "$dest" || exit 70
  fd=/proc/$$/fd/3
  [ -f "$fd" ] || { echo "exists=special"; exit 0; }
  echo "exists=file"
  sum=$(sha256sum <&3 | cut -d' ' -f1) || exit 70
  echo "sha256=$sum"
  if grep -qxF "$sum $dest" "$state/pushed" 2>/dev/null; then echo "ours=yes"; else echo "ours=no"; fi
  owner=$(stat -L -c %u "$fd") mode=$(stat -L -c %a "$fd") || exit 70
  if { [ "$owner" = 0 ] || [ "$owner" = "$(id -u)" ]; } && [ $((0$mode & 022)) -eq 0 ]; then
    echo "safe=yes"
    if [ "$sum" = "$want" ] && [ -x "$fd" ]; then echo "version=$("$fd" --version 2>/dev/null | head -n 1)"; fi
  else echo "safe=no"
  fi
elif [ -e "$dest" ]; then echo "exists=special"
else echo "exists=no"
fi
"#;

/// Copies stdin to the destination atomically. Arguments: destination,
/// expected checksum, the checksum of what may be replaced (`none` for
/// nothing, `any` with --force). Run after `file::TRUSTED_SH`, and only
/// into a directory that the one rule of a path root may trust: every
/// directory from `/` down no one's but root's and the remote user's to
/// change (or a sticky one, as /tmp), no link of anyone else's on the way.
/// There, the temporary file is ours alone; it is checksummed and run
/// through one descriptor. The ledger is updated under a lock, through a temporary
/// name of its own, so that concurrent pushes lose no record.
const COPY: &str = r#"
set -eu
dest=$1 sum=$2 replaces=$3
me=$(id -u)
if [ "$me" = 0 ]; then state=/var/lib/gpureap; else state=${XDG_STATE_HOME:-$HOME/.local/state}/gpureap; fi
dir=$(dirname -- "$dest")
mkdir -p -- "$dir"
case $dir in /*) ;; *) dir=$(pwd -P)/$dir ;; esac
if ! why=$(trusted_dir "$dir" 2>&1); then
  echo "$dir can be changed by another user ($why): not installing there" >&2; exit 69
fi
tmp=$(mktemp "$dir/.gpureap-push.XXXXXX")
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp"
chmod 755 "$tmp"
sync -- "$tmp" 2>/dev/null || sync
exec 3< "$tmp"
got=$(sha256sum <&3 | cut -d' ' -f1)
if [ "$got" != "$sum" ]; then echo "checksum mismatch after the copy: $got" >&2; exit 65; fi
if ! version=$("/proc/$$/fd/3" --version 2>&1 | head -n 1) || [ "${version#gpureap }" = "$version" ]; then
  echo "the copied binary does not run there: $version" >&2; exit 66
fi
exec 3<&-
# A link or a directory is never replaced (a link to a directory would take the file in).
if [ -L "$dest" ] || [ -d "$dest" ]; then
  echo "$dest is now a symbolic link or a directory; left alone" >&2; exit 67
fi
# What is there now must still be what was seen, unless --force.
if [ "$replaces" != any ] && [ -e "$dest" ]; then
  now=none
  if [ -f "$dest" ]; then now=$(sha256sum < "$dest" | cut -d' ' -f1); fi
  if [ "$replaces" = none ] || [ "$now" != "$replaces" ]; then
    echo "the file at $dest changed while pushing; left alone" >&2; exit 67
  fi
fi
mv -fT -- "$tmp" "$dest"
trap - EXIT
sync -- "$dir" 2>/dev/null || true
mkdir -p -- "$state"
record() {
  new=$(mktemp "$state/pushed.XXXXXX")
  { awk -v d="$dest" 'substr($0, 66) != d' "$state/pushed" 2>/dev/null || true; echo "$sum $dest"; } > "$new"
  mv -f -- "$new" "$state/pushed"
}
if command -v flock >/dev/null 2>&1; then
  ( flock -w 60 9 || { echo "cannot lock $state/pushed.lock" >&2; exit 68; }; record ) 9>>"$state/pushed.lock"
else
  record
fi
echo "version=$version"
"#;

/// How long the local `--bin FILE --version` may take, and what of its
/// output is read: it is a file the user named, not yet known to be gpureap.
const BIN_VERSION_LIMIT: Duration = Duration::from_secs(10);
const BIN_VERSION_OUTPUT: u64 = 64 << 10;

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
    // Run here and installed as root on every host: read by the one rule.
    let (file, bytes) =
        crate::file::read_trusted(path, 512 << 20).map_err(|error| match error {
            NotRead::Untrusted(why) => UsageError(format!(
                "refusing --bin {shown}: {why}; copy it where only you or root can write"
            )),
            NotRead::Unreadable(why) => UsageError(format!("cannot read --bin {shown}: {why}")),
        })?;
    if !bytes.starts_with(b"\x7fELF") {
        return Err(UsageError(format!(
            "--bin {shown} is not an ELF executable"
        )));
    }
    // The very bytes read (and checksummed below), through this descriptor.
    let argv = [
        format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            std::os::fd::AsRawFd::as_raw_fd(&file)
        )
        .into(),
        std::ffi::OsString::from("--version"),
    ];
    let (code, stdout) =
        crate::remote::ssh::run_local(&argv, BIN_VERSION_LIMIT, BIN_VERSION_OUTPUT)
            .map_err(|error| UsageError(format!("cannot run {shown} --version: {error}")))?;
    let version = String::from_utf8_lossy(&stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    if !Exit::succeeded(code) || !version.starts_with("gpureap ") {
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

/// What the text shows of a host's push.
#[derive(serde::Deserialize)]
struct PushView {
    action: String,
    path: String,
    version: Option<String>,
    reason: Option<String>,
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
        && (to.is_empty()
            || !(to.starts_with('/') || to.starts_with("~/"))
            || to.ends_with('/')
            || to.chars().any(char::is_control))
    {
        return Err(UsageError(format!(
            "invalid --to '{}': give the file to install, an absolute path or ~/… without control characters, like /usr/local/bin/gpureap",
            crate::units::printable(to)
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
    let push = Pushing {
        fleet,
        host,
        binary,
        limit,
        started: Instant::now(),
    };
    let look = match push.look(request) {
        Ok(look) => look,
        Err(error) => return push.failed(error),
    };
    match decide(&look, binary, request) {
        Decision::Refuse(reason) => push.refused(&look.path, reason),
        Decision::Fail(error) => push.failed(error),
        Decision::UpToDate(version) => Answer {
            exit_code: Exit::Success,
            report: push.report(&look.path, "up_to_date", version, None),
            error: None,
            elapsed: push.started.elapsed(),
        },
        Decision::Copy { replaces } => push.copy(&look, &replaces),
    }
}

/// One host's push under way.
struct Pushing<'a> {
    fleet: &'a Fleet,
    host: &'a str,
    binary: &'a Binary,
    limit: Duration,
    started: Instant,
}

/// What the host says is at the destination.
struct Look {
    path: String,
    /// `no`, `file`, `directory`, `symlink` or `special`.
    exists: String,
    /// The file's checksum there, if it is a file.
    sha256: Option<String>,
    /// Put there by gpureap push (its record says so).
    ours: bool,
    /// Only its owner, root, can change it.
    safe: bool,
    /// What `--version` says there.
    version: Option<String>,
}

/// What to do at a host, from what is there.
enum Decision {
    Refuse(String),
    Fail(String),
    UpToDate(Option<String>),
    /// Copy, replacing `none`, `any`, or the file with this checksum.
    Copy {
        replaces: String,
    },
}

/// Whether to copy, from what is at the destination: never over a
/// directory, a link or a special file, nor over a file gpureap push did
/// not put there (without --force), and not at all when this build is there.
fn decide(look: &Look, binary: &Binary, request: &PushRequest) -> Decision {
    let path = &look.path;
    match look.exists.as_str() {
        "directory" => {
            return Decision::Refuse(format!("{path} is a directory: give --to the file's path"));
        }
        "symlink" => {
            return Decision::Refuse(format!(
                "{path} is a symbolic link: give --to the file it should be (a link is never replaced)"
            ));
        }
        "special" => return Decision::Refuse(format!("{path} is not a regular file: left alone")),
        _ => {}
    }
    if look.sha256.as_deref() == Some(binary.sha256.as_str()) && (look.safe || !request.force) {
        if !look.safe {
            return Decision::Refuse(format!(
                "{path} has this build's checksum but another user can change it (its owner or mode); pass --force to replace it"
            ));
        }
        if look.version.as_deref() != Some(binary.version.as_str()) {
            return Decision::Fail(format!(
                "{path} has this build's checksum but --version says \"{}\" there",
                crate::units::Field(look.version.as_deref().unwrap_or_default())
            ));
        }
        return Decision::UpToDate(look.version.clone());
    }
    let replaces = match (look.exists.as_str(), &look.sha256) {
        ("no", _) => "none".to_string(),
        _ if request.force => "any".to_string(),
        ("file", Some(sum)) if look.ours => sum.clone(),
        _ => {
            return Decision::Refuse(format!(
                "a different file is at {path}, not put there by gpureap push; pass --force to replace it"
            ));
        }
    };
    Decision::Copy { replaces }
}

impl Pushing<'_> {
    fn script(body: &str, args: &[&str]) -> Vec<String> {
        ["sh", "-c", body, "gpureap-push"]
            .iter()
            .chain(args)
            .map(|word| word.to_string())
            .collect()
    }

    fn failed(&self, error: String) -> Answer {
        Answer {
            exit_code: Exit::Incomplete,
            report: None,
            error: Some(error),
            elapsed: self.started.elapsed(),
        }
    }

    fn refused(&self, path: &str, reason: String) -> Answer {
        Answer {
            exit_code: Exit::StillHeld,
            report: self.report(path, "refused", None, Some(reason)),
            error: None,
            elapsed: self.started.elapsed(),
        }
    }

    fn report(
        &self,
        path: &str,
        action: &'static str,
        version: Option<String>,
        reason: Option<String>,
    ) -> Option<Box<serde_json::value::RawValue>> {
        serde_json::to_string_pretty(&PushJson {
            schema_version: crate::report::SCHEMA_VERSION,
            kind: "push",
            action,
            path: path.to_string(),
            sha256: &self.binary.sha256,
            version,
            reason,
        })
        .ok()
        .and_then(|text| crate::remote::nested_json(&text))
    }

    /// What is at the destination, as the host's LOOK script says.
    fn look(&self, request: &PushRequest) -> Result<Look, String> {
        let look = self.fleet.transport.exec(
            self.host,
            &Self::script(LOOK, &[request.to.unwrap_or(""), &self.binary.sha256]),
            None,
            self.limit,
        )?;
        if !Exit::succeeded(look.code) {
            return Err(format!(
                "cannot look at the destination: {}",
                look.last_error.unwrap_or_else(|| "no reason given".into())
            ));
        }
        let mut fields = fields(&look.stdout);
        Ok(Look {
            path: fields.remove("dest").unwrap_or_default(),
            exists: fields.remove("exists").unwrap_or_else(|| "no".to_string()),
            sha256: fields.remove("sha256"),
            ours: fields.get("ours").map(String::as_str) == Some("yes"),
            safe: fields.get("safe").map(String::as_str) == Some("yes"),
            version: fields.remove("version"),
        })
    }

    /// Copies the binary over what `replaces` names, and checks its --version there.
    fn copy(&self, look: &Look, replaces: &str) -> Answer {
        let path = &look.path;
        let copy = self.fleet.transport.exec(
            self.host,
            &Self::script(
                &format!("{}{COPY}", crate::file::TRUSTED_SH),
                &[path, &self.binary.sha256, replaces],
            ),
            Some(self.binary.bytes.clone()),
            self.limit,
        );
        match copy {
            Ok(copied) if Exit::succeeded(copied.code) => {
                let version = fields(&copied.stdout).get("version").cloned();
                if version.as_deref() != Some(self.binary.version.as_str()) {
                    return self.failed(format!(
                        "copied to {path}, but --version there says \"{}\", not \"{}\"",
                        crate::units::Field(version.as_deref().unwrap_or_default()),
                        self.binary.version
                    ));
                }
                let action = if look.exists == "no" {
                    "installed"
                } else {
                    "updated"
                };
                Answer {
                    exit_code: Exit::Success,
                    report: self.report(path, action, version, None),
                    error: None,
                    elapsed: self.started.elapsed(),
                }
            }
            Ok(copied) if crate::exit::push_refused(copied.code) => self.refused(
                path,
                copied
                    .last_error
                    .unwrap_or_else(|| format!("{path} changed while pushing")),
            ),
            Ok(copied) => self.failed(format!(
                "copy to {path} failed: {}",
                copied
                    .last_error
                    .unwrap_or_else(|| format!("exit {:?}", copied.code))
            )),
            Err(error) => self.failed(error),
        }
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
        let Ok(view) = serde_json::from_str::<PushView>(report.get()) else {
            continue;
        };
        let text = |field: &Option<String>| field.clone().unwrap_or_default();
        match view.action.as_str() {
            "up_to_date" => current.push(result.host.as_str()),
            action => rows.push(vec![
                result.host.clone(),
                action.replace('_', " "),
                short(&view.path, 40),
                short(
                    &if action == "refused" {
                        text(&view.reason)
                    } else {
                        text(&view.version)
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
    crate::remote::render::fold(&mut out, "Up to date on", &current, "");
    crate::remote::render::failures(results, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host's `--version` answer in the refusal is its text written out
    /// once, by the one rule (`units::one_line`): not `{:?}`, which doubled
    /// its backslashes and quotes.
    #[test]
    fn a_hosts_version_is_quoted_by_the_one_rule() {
        let binary = Binary {
            bytes: Arc::new(Vec::new()),
            sha256: "ab".to_string(),
            version: "gpureap 0.2.0".to_string(),
        };
        let look = Look {
            path: "/usr/local/bin/gpureap".to_string(),
            exists: "file".to_string(),
            sha256: Some("ab".to_string()),
            ours: true,
            safe: true,
            version: Some("gpureap \"0.2\\\u{1b}[2K\u{200d}".to_string()),
        };
        let request = PushRequest {
            bin: Path::new("gpureap"),
            to: None,
            force: false,
            json: false,
        };
        let Decision::Fail(why) = decide(&look, &binary, &request) else {
            panic!("another version with this build's checksum is a failure");
        };
        assert_eq!(
            why,
            "/usr/local/bin/gpureap has this build's checksum but --version says \"gpureap \"0.2\\\\u{1b}[2K\\u{200d}\" there"
        );
    }
}
