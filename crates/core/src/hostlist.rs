//! Host lists as cluster people type them: `gpu[01-16,20]`, `node[1-3]-ib`,
//! `a,b,c`, or `@FILE`; and back, so that a summary line reads
//! `gpu[03-08,11]` rather than a wall of names.
//!
//! The syntax is Slurm's and pdsh's: a bracket holds numbers and ranges,
//! a range's width is its first number's (`01-16` pads to two digits), and
//! several brackets in one name multiply out. Names are checked here, before
//! anything is run: one that starts with `-` would be an option to ssh.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The hosts `-H` named, expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostList(pub Vec<String>);

/// More names than this is a typo (`node[1-9999999]`), not a fleet: for
/// one list, and for all the `-H` of one command line together.
pub const MAX_HOSTS: usize = 100_000;
/// One name as typed, brackets included: a host name is at most 255
/// characters (RFC 1035), a user 32; more is not a name.
pub(crate) const MAX_ITEM: usize = 512;
/// Bracket groups in one name: `rack[1-4]node[01-16]` is two; a real
/// naming scheme has a few.
pub(crate) const MAX_GROUPS: usize = 8;
/// A host file's size: one name a line, 1 MiB is some ten thousand hosts.
pub(crate) const MAX_FILE: u64 = 1 << 20;

/// Hosts named so far by all the lists of this process's command line.
static NAMED: AtomicUsize = AtomicUsize::new(0);

/// A list is refused for a reason that holds none of its text: a host
/// file's line may hold anything (a secret), and a line is echoed nowhere.
type Reason = String;

/// A comma-separated list, with ranges, or `@FILE`; duplicates dropped,
/// order kept. Everything is bounded before it is expanded: the name's
/// length, its bracket groups, the product of their ranges, the hosts
/// of all the lists of the command line together.
pub fn parse(text: &str) -> Result<Vec<String>, String> {
    let hosts = parse_list(text)?;
    let before = NAMED.fetch_add(hosts.len(), Ordering::Relaxed);
    if before + hosts.len() > MAX_HOSTS {
        return Err(too_many());
    }
    Ok(hosts)
}

fn parse_list(text: &str) -> Result<Vec<String>, String> {
    let text = text.trim();
    if let Some(path) = text.strip_prefix('@') {
        return parse_file(path);
    }
    let mut hosts = Vec::new();
    add_line(text, &mut hosts).map_err(|reason| {
        format!(
            "invalid host list '{}': {reason}",
            crate::units::short(text, 80)
        )
    })?;
    finish(hosts, text)
}

fn parse_file(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Err("invalid host list '@': name a file after the @, like @hosts.txt".to_string());
    }
    let shown = crate::units::short(path, 200);
    let text =
        read_file(path).map_err(|reason| format!("cannot read host file {shown}: {reason}"))?;
    let mut hosts = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        add_line(line, &mut hosts).map_err(|reason| {
            format!(
                "host file {shown}, line {}: {reason} (the line is not shown)",
                number + 1
            )
        })?;
    }
    finish(hosts, &format!("@{shown}"))
}

/// A host file's text: a regular file, at most `MAX_FILE` bytes, read
/// without waiting (`crate::file::read_regular`).
fn read_file(path: &str) -> Result<String, Reason> {
    let (_, bytes) = crate::file::read_regular(std::path::Path::new(path), MAX_FILE)?;
    String::from_utf8(bytes).map_err(|_| "not text (UTF-8)".to_string())
}

fn finish(hosts: Vec<String>, text: &str) -> Result<Vec<String>, String> {
    one_user_each(&hosts)?;
    let hosts = unique(hosts);
    if hosts.is_empty() {
        return Err(format!(
            "invalid host list '{}': no hosts in it",
            crate::units::short(text, 80)
        ));
    }
    Ok(hosts)
}

/// Each host once, in the order first named. A host is what ssh connects
/// to: `h1` and `root@h1` are one host (the first spelling is kept).
pub fn unique(hosts: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut seen = HashSet::new();
    hosts
        .into_iter()
        .filter(|host| seen.insert(destination(host).to_ascii_lowercase()))
        .collect()
}

/// The host part of `[user@]host`.
pub fn destination(name: &str) -> &str {
    name.rsplit_once('@').map_or(name, |(_, host)| host)
}

/// One line of names: its items, each bounded then expanded into `hosts`.
fn add_line(line: &str, hosts: &mut Vec<String>) -> Result<(), Reason> {
    for item in split_top_level(line)? {
        expand_item(item, hosts)?;
    }
    Ok(())
}

/// Splits on commas outside brackets: `gpu[1,3],cpu1` is two items.
fn split_top_level(text: &str) -> Result<Vec<&str>, Reason> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (at, c) in text.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err("nested '['".to_string()),
            ']' if depth == 1 => depth = 0,
            ']' => return Err("']' without '['".to_string()),
            ',' if depth == 0 => {
                items.push(text[start..at].trim());
                start = at + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("'[' without ']'".to_string());
    }
    items.push(text[start..].trim());
    Ok(items.into_iter().filter(|item| !item.is_empty()).collect())
}

/// One bracket's numbers: (first, last, width) for each range.
type Group = Vec<(u64, u64, usize)>;

/// Checks one item's length, its groups and the number of names they make,
/// then expands it into `hosts`: nothing is built that the bounds refuse.
fn expand_item(item: &str, hosts: &mut Vec<String>) -> Result<(), Reason> {
    if item.len() > MAX_ITEM {
        return Err(format!(
            "a name of {} characters (at most {MAX_ITEM}, brackets included)",
            item.len()
        ));
    }
    // Literal text and groups, alternating: text, group, text, …, text.
    let mut texts = Vec::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut rest = item;
    while let Some(open) = rest.find('[') {
        if groups.len() == MAX_GROUPS {
            return Err(format!("more than {MAX_GROUPS} bracket groups in one name"));
        }
        let close = rest[open..]
            .find(']')
            .map(|at| open + at)
            .ok_or_else(|| "'[' without ']'".to_string())?;
        texts.push(&rest[..open]);
        groups.push(group(&rest[open + 1..close])?);
        rest = &rest[close + 1..];
    }
    texts.push(rest);
    let mut names: usize = 1;
    for group in &groups {
        let count = group.iter().fold(0usize, |sum, (first, last, _)| {
            sum.saturating_add(
                usize::try_from(last - first)
                    .unwrap_or(usize::MAX)
                    .saturating_add(1),
            )
        });
        names = names.saturating_mul(count);
    }
    if hosts.len().saturating_add(names) > MAX_HOSTS {
        return Err(too_many());
    }
    let mut name = String::new();
    build(&texts, &groups, &mut name, hosts)
}

/// `[01-16,20]`'s ranges, each with its width.
fn group(body: &str) -> Result<Group, Reason> {
    let mut ranges = Vec::new();
    for part in body.split(',') {
        let part = part.trim();
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let bad = || "a bracket holds numbers and ranges, like [01-16,20]".to_string();
        let (first_number, last_number) = (
            digits(first).ok_or_else(bad)?,
            digits(last).ok_or_else(bad)?,
        );
        if first_number > last_number {
            return Err(format!("a range from {first} down to {last}"));
        }
        ranges.push((first_number, last_number, first.len()));
    }
    Ok(ranges)
}

/// The names `texts` and `groups` make, in order; the depth is at most
/// `MAX_GROUPS`, the count checked by the caller.
fn build(
    texts: &[&str],
    groups: &[Group],
    name: &mut String,
    hosts: &mut Vec<String>,
) -> Result<(), Reason> {
    let at = name.len();
    name.push_str(texts[0]);
    let Some((group, groups)) = groups.split_first() else {
        check_name(name)?;
        hosts.push(name.clone());
        name.truncate(at);
        return Ok(());
    };
    let mark = name.len();
    for &(first, last, width) in group {
        for number in first..=last {
            let _ = write!(name, "{number:0width$}");
            build(&texts[1..], groups, name, hosts)?;
            name.truncate(mark);
        }
    }
    name.truncate(at);
    Ok(())
}

fn digits(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 18 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn too_many() -> String {
    format!("the host lists name more than {MAX_HOSTS} hosts: check their ranges")
}

/// What ssh takes as a destination, and nothing a shell or ssh would read
/// as something else: `[user@]name`, with letters, digits, `.`, `-`, `_`
/// and `:` (IPv6); a `user@` is not empty.
fn check_name(name: &str) -> Result<(), Reason> {
    let (user, host) = match name.rsplit_once('@') {
        Some((user, host)) => (Some(user), host),
        None => (None, name),
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':');
    let user_fine = user.is_none_or(|user| {
        !user.is_empty()
            && user.len() <= 32
            && !user.starts_with('-')
            && user.chars().all(|c| allowed(c) && c != ':')
    });
    let fine = user_fine
        && !host.is_empty()
        && host.len() <= 255
        && !host.starts_with('-')
        && host.chars().all(allowed);
    if fine {
        Ok(())
    } else {
        Err(
            "a name that is not [user@]host with letters, digits, '.', '-', '_' (not starting with '-', the user not empty)"
                .to_string(),
        )
    }
}

/// Refuses a host named twice with two different users: one run per host.
pub fn one_user_each(hosts: &[String]) -> Result<(), String> {
    let mut users: HashMap<String, &str> = HashMap::new();
    for name in hosts {
        let Some((user, host)) = name.rsplit_once('@') else {
            continue;
        };
        if let Some(other) = users.insert(host.to_ascii_lowercase(), user)
            && other != user
        {
            return Err(format!(
                "host {} is named with two users ({other}@ and {user}@): gpureap runs once per host",
                crate::units::short(host, 80)
            ));
        }
    }
    Ok(())
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
        assert_eq!(parse("h1,root@h1,H1").unwrap(), ["h1"]);
        assert_eq!(parse("r[1-2]n[1-2]").unwrap().len(), 4);
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
            "@h1",
            "a,@h1",
            "alice@h1,bob@h1",
            "n[1-9][1-9][1-9][1-9][1-9][1-9][1-9]",
            "x[1][1][1][1][1][1][1][1][1]",
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
