//! Host lists as cluster people type them: `gpu[01-16,20]`, `node[1-3]-ib`,
//! `a,b,c`, or `@FILE`; and back, so that a summary line reads
//! `gpu[03-08,11]` rather than a wall of names.
//!
//! The syntax is Slurm's and pdsh's: a bracket holds numbers and ranges,
//! a range's width is its first number's (`01-16` pads to two digits), and
//! several brackets in one name multiply out. Names are checked here, before
//! anything is run: one that starts with `-` would be an option to ssh.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::fs;

/// The hosts `-H` named, expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostList(pub Vec<String>);

/// More names than this is a typo (`node[1-9999999]`), not a fleet.
pub const MAX_HOSTS: usize = 100_000;

/// A comma-separated list, with ranges, or `@FILE`; duplicates dropped,
/// order kept.
pub fn parse(text: &str) -> Result<Vec<String>, String> {
    let text = text.trim();
    if let Some(path) = text.strip_prefix('@') {
        return parse_file(path);
    }
    let mut hosts = Vec::new();
    for item in split_top_level(text)? {
        expand(item, &mut hosts)?;
    }
    finish(hosts, text)
}

fn parse_file(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Err("invalid host list '@': name a file after the @, like @hosts.txt".to_string());
    }
    let metadata =
        fs::metadata(path).map_err(|error| format!("cannot read host file {path}: {error}"))?;
    if !metadata.is_file() {
        return Err(format!("cannot read host file {path}: not a regular file"));
    }
    // One name a line: 1 MiB is some ten thousand hosts, far beyond a fleet.
    if metadata.len() > 1 << 20 {
        return Err(format!(
            "host file {path} is larger than 1 MiB: is it the right file?"
        ));
    }
    let text = fs::read_to_string(path)
        .map_err(|error| format!("cannot read host file {path}: {error}"))?;
    let mut hosts = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        for item in split_top_level(line)? {
            expand(item, &mut hosts)
                .map_err(|error| format!("{path}, line {}: {error}", number + 1))?;
        }
    }
    finish(hosts, &format!("@{path}"))
}

fn finish(hosts: Vec<String>, text: &str) -> Result<Vec<String>, String> {
    let hosts = unique(hosts);
    if hosts.is_empty() {
        return Err(format!("invalid host list '{text}': no hosts in it"));
    }
    Ok(hosts)
}

/// Each host once, in the order first named.
pub fn unique(hosts: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut seen = HashSet::new();
    hosts
        .into_iter()
        .filter(|host| seen.insert(host.clone()))
        .collect()
}

/// Splits on commas outside brackets: `gpu[1,3],cpu1` is two items.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (at, c) in text.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(format!("invalid host list '{text}': nested '['")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(format!("invalid host list '{text}': ']' without '['")),
            ',' if depth == 0 => {
                items.push(text[start..at].trim());
                start = at + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("invalid host list '{text}': '[' without ']'"));
    }
    items.push(text[start..].trim());
    Ok(items.into_iter().filter(|item| !item.is_empty()).collect())
}

/// Expands one item's brackets, left to right, into `hosts`.
fn expand(item: &str, hosts: &mut Vec<String>) -> Result<(), String> {
    let Some(open) = item.find('[') else {
        check_name(item)?;
        hosts.push(item.to_string());
        return too_many(hosts.len());
    };
    let close = item[open..]
        .find(']')
        .map(|at| open + at)
        .ok_or_else(|| format!("invalid host range '{item}': '[' without ']'"))?;
    let (prefix, body, rest) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
    for part in body.split(',') {
        let part = part.trim();
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let bad = || {
            format!(
                "invalid host range '[{body}]' in '{item}': expected numbers and ranges like [01-16,20]"
            )
        };
        let (first_number, last_number): (u64, u64) = (
            digits(first).ok_or_else(bad)?,
            digits(last).ok_or_else(bad)?,
        );
        if first_number > last_number {
            return Err(format!(
                "invalid host range '{part}' in '{item}': {first} is above {last}"
            ));
        }
        if last_number - first_number >= MAX_HOSTS as u64 {
            return too_many(MAX_HOSTS + 1);
        }
        let width = first.len();
        for number in first_number..=last_number {
            expand(&format!("{prefix}{number:0width$}{rest}"), hosts)?;
        }
    }
    Ok(())
}

fn digits(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 18 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn too_many(count: usize) -> Result<(), String> {
    if count > MAX_HOSTS {
        Err(format!(
            "the host list names more than {MAX_HOSTS} hosts: check its ranges"
        ))
    } else {
        Ok(())
    }
}

/// What ssh takes as a destination, and nothing a shell or ssh would read
/// as something else: `[user@]name`, with letters, digits, `.`, `-`, `_`
/// and `:` (IPv6).
fn check_name(name: &str) -> Result<(), String> {
    let (user, host) = name.rsplit_once('@').unwrap_or(("", name));
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':');
    let fine = !host.is_empty()
        && host.len() <= 255
        && !host.starts_with('-')
        && !user.starts_with('-')
        && host.chars().all(allowed)
        && user.chars().all(|c| allowed(c) && c != ':');
    if fine {
        Ok(())
    } else {
        Err(format!(
            "invalid host name '{name}': expected [user@]host with letters, digits, '.', '-', '_' (not starting with '-')"
        ))
    }
}

/// The other way: `gpu03,gpu04,gpu05,gpu11` reads `gpu[03-05,11]`. Names
/// are grouped by what surrounds their last number; order within a group
/// is numeric, groups in order of first appearance.
pub fn compress(hosts: &[&str]) -> String {
    // (prefix, width, suffix) → numbers; names without a number stay as they are.
    let mut order: Vec<Result<(String, usize, String), String>> = Vec::new();
    let mut groups: BTreeMap<(String, usize, String), Vec<u64>> = BTreeMap::new();
    // `gpu11` belongs with `gpu03`: a zero-padded group of its own length.
    let padded: HashSet<(&str, usize, &str)> = hosts
        .iter()
        .filter_map(|host| last_number(host))
        .filter(|(_, _, width, _)| *width > 1)
        .map(|(prefix, _, width, suffix)| (prefix, width, suffix))
        .collect();
    for host in hosts {
        match last_number(host) {
            Some((prefix, number, width, suffix)) => {
                let digits = number.to_string().len();
                let width = if width == 1 && padded.contains(&(prefix, digits, suffix)) {
                    digits
                } else {
                    width
                };
                let key = (prefix.to_string(), width, suffix.to_string());
                if !groups.contains_key(&key) {
                    order.push(Ok(key.clone()));
                }
                groups.entry(key).or_default().push(number);
            }
            None => order.push(Err(host.to_string())),
        }
    }
    let mut out = Vec::new();
    for entry in order {
        match entry {
            Err(name) => out.push(name),
            Ok(key) => {
                let mut numbers = groups.remove(&key).unwrap_or_default();
                numbers.sort_unstable();
                numbers.dedup();
                let (prefix, width, suffix) = key;
                if numbers.len() == 1 {
                    out.push(format!("{prefix}{:0width$}{suffix}", numbers[0]));
                    continue;
                }
                let mut body = String::new();
                let mut at = 0;
                while at < numbers.len() {
                    let start = numbers[at];
                    let mut end = start;
                    while at + 1 < numbers.len() && numbers[at + 1] == end + 1 {
                        at += 1;
                        end += 1;
                    }
                    if !body.is_empty() {
                        body.push(',');
                    }
                    if start == end {
                        let _ = write!(body, "{start:0width$}");
                    } else {
                        let _ = write!(body, "{start:0width$}-{end:0width$}");
                    }
                    at += 1;
                }
                out.push(format!("{prefix}[{body}]{suffix}"));
            }
        }
    }
    out.join(",")
}

/// `node07-ib` → ("node", 7, 2, "-ib"). A number with a leading zero keeps
/// its width; one without is width 1, so `n9` and `n10` group together.
fn last_number(host: &str) -> Option<(&str, u64, usize, &str)> {
    let end = host.rfind(|c: char| c.is_ascii_digit())? + 1;
    let start = host[..end]
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |at| at + 1);
    let text = &host[start..end];
    if text.len() > 18 {
        return None;
    }
    let width = if text.len() > 1 && text.starts_with('0') {
        text.len()
    } else {
        1
    };
    Some((&host[..start], text.parse().ok()?, width, &host[end..]))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ranges_expand_as_slurm_does() {
        assert_eq!(
            parse("gpu[01-03,20]").unwrap(),
            ["gpu01", "gpu02", "gpu03", "gpu20"]
        );
        assert_eq!(
            parse("node[1-3]-ib").unwrap(),
            ["node1-ib", "node2-ib", "node3-ib"]
        );
        assert_eq!(
            parse("r[1-2]n[1-2],login").unwrap(),
            ["r1n1", "r1n2", "r2n1", "r2n2", "login"]
        );
        assert_eq!(parse("a,b,a").unwrap(), ["a", "b"]);
        assert_eq!(parse("root@10.1.230.174").unwrap(), ["root@10.1.230.174"]);
    }

    #[test]
    fn bad_lists_say_what_is_wrong() {
        for bad in [
            "",
            ",",
            "gpu[3-1]",
            "gpu[",
            "gpu]",
            "gpu[a-b]",
            "-oProxyCommand=x",
            "a b",
            "h;rm",
            "gpu[[1]]",
            "n[1-99999999]",
            "$(reboot)",
            "user@-x",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn compress_is_the_inverse_for_summary_lines() {
        let hosts = parse("gpu[03-05,11],login,node[1-2]-ib,n9,n10").unwrap();
        let names: Vec<&str> = hosts.iter().map(String::as_str).collect();
        assert_eq!(compress(&names), "gpu[03-05,11],login,node[1-2]-ib,n[9-10]");
        assert_eq!(parse(&compress(&names)).unwrap(), hosts);
        assert_eq!(compress(&["h1"]), "h1");
    }
}
