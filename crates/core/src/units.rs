//! Parsing and printing of the units users type: sizes, durations and GPU lists.
//!
//! Each parser returns an error message that names the bad input and shows a
//! valid example, because these strings come straight from a command line.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

/// A set of GPU indexes as typed by the user: `0,2,5`, `0-3`, or `all`;
/// or a list that also names GPUs by UUID (`GPU-…`) or MIG instances
/// (`0:1`, `MIG-…`), which only the driver can resolve (`Refs`: see
/// `driver::mig::resolve`, docs/mig.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuList {
    All,
    Some(BTreeSet<u32>),
    Refs(Vec<GpuRef>),
}

impl GpuList {
    /// Resolves the list against the GPUs the driver reports, refusing
    /// indexes that do not exist.
    pub fn resolve(&self, gpu_count: u32) -> Result<BTreeSet<u32>, String> {
        match self {
            GpuList::All => Ok((0..gpu_count).collect()),
            GpuList::Refs(refs) => {
                let indexes: Option<BTreeSet<u32>> = refs
                    .iter()
                    .map(|gpu| match gpu {
                        GpuRef::Index(index) => Some(*index),
                        _ => None,
                    })
                    .collect();
                match indexes {
                    Some(set) => GpuList::Some(set).resolve(gpu_count),
                    None => Err(format!(
                        "this command takes GPU indexes only, not {}",
                        GpuRefs(refs)
                    )),
                }
            }
            GpuList::Some(set) => {
                let missing: Vec<String> = set
                    .iter()
                    .filter(|&&index| index >= gpu_count)
                    .map(u32::to_string)
                    .collect();
                if missing.is_empty() {
                    Ok(set.clone())
                } else {
                    Err(format!(
                        "no GPU with index {} (this host has {} GPU{}: {})",
                        missing.join(", "),
                        gpu_count,
                        if gpu_count == 1 { "" } else { "s" },
                        if gpu_count == 0 {
                            "none".to_string()
                        } else {
                            format!("0-{}", gpu_count - 1)
                        }
                    ))
                }
            }
        }
    }
}

/// The highest GPU index a list may name. NVML numbers GPUs from 0 and no
/// host has a thousand of them; the bound keeps `0-4294967295` from
/// allocating gigabytes before the driver is even asked.
pub const MAX_GPU_INDEX: u32 = 1023;

/// Parses `all`, `3`, `0,2,5` or `0-3,6`.
pub fn parse_gpu_list(text: &str) -> Result<GpuList, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("all") {
        return Ok(GpuList::All);
    }
    let bad = || format!("invalid GPU list '{text}': expected indexes like 0,2,5 or 0-3, or 'all'");
    let index = |part: &str| -> Result<u32, String> {
        let index: u32 = part.trim().parse().map_err(|_| bad())?;
        if index > MAX_GPU_INDEX {
            return Err(format!(
                "invalid GPU list '{text}': GPU index {index} is out of range (at most {MAX_GPU_INDEX})"
            ));
        }
        Ok(index)
    };
    if text.split(',').any(|part| {
        part.contains(':') || part.trim().starts_with("GPU-") || part.trim().starts_with("MIG-")
    }) {
        return parse_gpu_refs(text)
            .map(GpuList::Refs)
            .map_err(|error| format!("invalid GPU list '{text}': {error}"));
    }
    let mut set = BTreeSet::new();
    for part in text.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (index(first)?, index(last)?);
                if first > last {
                    return Err(bad());
                }
                set.extend(first..=last);
            }
            None => {
                set.insert(index(part)?);
            }
        }
    }
    Ok(GpuList::Some(set))
}

impl GpuList {
    /// Several `--gpu` flags name the union of their GPUs.
    pub fn union(lists: &[GpuList]) -> Option<GpuList> {
        let mut set = BTreeSet::new();
        let mut refs = Vec::new();
        for list in lists {
            match list {
                GpuList::All => return Some(GpuList::All),
                GpuList::Some(some) => set.extend(some),
                GpuList::Refs(some) => refs.extend(some.iter().cloned()),
            }
        }
        if !refs.is_empty() {
            refs.extend(set.into_iter().map(GpuRef::Index));
            return Some(GpuList::Refs(refs));
        }
        (!lists.is_empty()).then_some(GpuList::Some(set))
    }
}

/// One GPU as `SLURM_JOB_GPUS` or `CUDA_VISIBLE_DEVICES` names it: the one
/// rule for naming a GPU by index or by UUID (the Slurm hooks, `plan`,
/// `--gpu`), or a MIG instance by `G:I` or its `MIG-` UUID (docs/mig.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuRef {
    Index(u32),
    Uuid(String),
    /// GPU `G`'s MIG device `I`, typed `G:I`.
    Instance(u32, u32),
    /// A MIG instance's UUID, `MIG-…`.
    MigUuid(String),
}

impl fmt::Display for GpuRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuRef::Index(index) => write!(f, "{index}"),
            GpuRef::Uuid(uuid) | GpuRef::MigUuid(uuid) => write!(f, "{uuid}"),
            GpuRef::Instance(gpu, index) => write!(f, "{gpu}:{index}"),
        }
    }
}

/// A list of `GpuRef`s as `--gpu` reads them back: `0:1,GPU-…,2`.
pub struct GpuRefs<'a>(pub &'a [GpuRef]);

impl fmt::Display for GpuRefs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (at, gpu) in self.0.iter().enumerate() {
            if at > 0 {
                f.write_str(",")?;
            }
            write!(f, "{gpu}")?;
        }
        Ok(())
    }
}

/// Whether a UUID as typed is one: its prefix, then at most 96 printable
/// characters, none of them a separator of the lists it comes in.
fn uuid_like(token: &str, prefix: &str) -> bool {
    token.len() > prefix.len()
        && token.len() <= 96
        && token.starts_with(prefix)
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A comma-separated list of GPU indexes (ranges allowed) or UUIDs, as
/// `SLURM_JOB_GPUS` and `CUDA_VISIBLE_DEVICES` write them;
/// `NoDevFiles` (what Slurm sets when the GPUs have no device files) is none.
pub fn parse_gpu_refs(list: &str) -> Result<Vec<GpuRef>, String> {
    if list == "NoDevFiles" {
        return Ok(Vec::new());
    }
    let mut gpus = Vec::new();
    for token in list.split(',').map(str::trim) {
        if uuid_like(token, "GPU-") {
            gpus.push(GpuRef::Uuid(token.to_string()));
            continue;
        }
        if uuid_like(token, "MIG-") {
            gpus.push(GpuRef::MigUuid(token.to_string()));
            continue;
        }
        let number = |text: &str| {
            text.parse::<u32>()
                .ok()
                .filter(|_| text.bytes().all(|b| b.is_ascii_digit()))
        };
        if let Some((gpu, index)) = token.split_once(':') {
            match number(gpu).zip(number(index)) {
                Some((gpu, index)) if gpu <= MAX_GPU_INDEX => {
                    gpus.push(GpuRef::Instance(gpu, index));
                    continue;
                }
                _ => {
                    let shown: String = token.chars().take(40).collect();
                    return Err(format!(
                        "'{shown}' is not a MIG instance (expected GPU:INSTANCE like 0:1)"
                    ));
                }
            }
        }
        let range = match token.split_once('-') {
            Some((first, last)) => number(first).zip(number(last)),
            None => number(token).map(|index| (index, index)),
        };
        match range {
            Some((first, last)) if first <= last && last - first < 1024 => {
                gpus.extend((first..=last).map(GpuRef::Index));
            }
            _ => {
                let shown: String = token.chars().take(40).collect();
                return Err(format!(
                    "'{shown}' is not a GPU index, range, GPU-UUID, MIG instance (0:1) or MIG-UUID (expected like 0,1,3)"
                ));
            }
        }
    }
    Ok(gpus)
}

/// Prints a set of GPU indexes the way `parse_gpu_list` reads them: `0-3,6`.
pub struct GpuRanges<'a>(pub &'a BTreeSet<u32>);

impl fmt::Display for GpuRanges<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut indexes = self.0.iter().copied().peekable();
        let mut first = true;
        while let Some(start) = indexes.next() {
            let mut end = start;
            while indexes
                .next_if(|&next| Some(next) == end.checked_add(1))
                .is_some()
            {
                end += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            match end - start {
                0 => write!(f, "{start}")?,
                1 => write!(f, "{start},{end}")?,
                _ => write!(f, "{start}-{end}")?,
            }
        }
        Ok(())
    }
}

/// Parses a byte size: `80G`, `1GiB`, `512MiB`, `1.5GB`, `4096`.
///
/// Both decimal-looking and binary suffixes mean powers of 1024, as
/// nvidia-smi's "MiB" and users' "80G" both do in practice.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let bad = || {
        format!("invalid size '{text}': expected a number with a unit, like 512MiB, 1GiB or 80G")
    };
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(bad()),
    };
    let bytes = number * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes.round() as u64)
}

/// The longest duration a flag accepts. Longer ones are typing mistakes,
/// and would overflow the clock arithmetic of deadlines.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Parses a duration: `500ms`, `10s`, `2m`, `1h`, or `0`; at most 30 days.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if trimmed == "0" {
        return Ok(Duration::ZERO);
    }
    if let Some(magnitude) = trimmed.strip_prefix('-') {
        return Err(if humantime::parse_duration(magnitude).is_ok() {
            format!("invalid duration '{text}': a duration cannot be negative (0 means no wait)")
        } else {
            // `--grace --yes`: the next flag was taken for the missing value.
            format!(
                "invalid duration '{text}': expected a number with a unit, like 500ms, 10s or 2m"
            )
        });
    }
    let duration = humantime::parse_duration(trimmed).map_err(|_| {
        format!("invalid duration '{text}': expected a number with a unit, like 500ms, 10s or 2m")
    })?;
    if duration > MAX_DURATION {
        return Err(format!(
            "invalid duration '{text}': longer than the 30 days a flag accepts"
        ));
    }
    Ok(duration)
}

/// Prints bytes the way nvidia-smi users read them: MiB below 1 GiB, GiB above.
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: f64 = (1u64 << 20) as f64;
        const GIB: f64 = (1u64 << 30) as f64;
        let bytes = self.0 as f64;
        if self.0 < 1 << 10 {
            write!(f, "{} B", self.0)
        } else if bytes < MIB {
            write!(f, "{:.0} KiB", bytes / 1024.0)
        } else if bytes < GIB {
            write!(f, "{:.0} MiB", (bytes / MIB).max(1.0))
        } else {
            write!(f, "{:.1} GiB", bytes / GIB)
        }
    }
}

/// Prints an optional byte count, where unknown is shown as such and never as 0.
pub struct MaybeBytes(pub Option<u64>);

impl fmt::Display for MaybeBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(bytes) => Bytes(bytes).fmt(f),
            None => write!(f, "unknown"),
        }
    }
}

/// Prints a duration compactly: `850ms`, `4.2s`, `3m10s`, `2h05m`.
pub struct Elapsed(pub Duration);

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0.as_millis();
        let secs = self.0.as_secs();
        if millis < 1000 {
            write!(f, "{millis}ms")
        } else if secs < 60 {
            write!(f, "{:.1}s", self.0.as_secs_f64())
        } else if secs < 3600 {
            write!(f, "{}m{:02}s", secs / 60, secs % 60)
        } else if secs < 86400 {
            write!(f, "{}h{:02}m", secs / 3600, (secs % 3600) / 60)
        } else {
            write!(f, "{}d{:02}h", secs / 86400, (secs % 86400) / 3600)
        }
    }
}

/// Prints a process's age: `0.4s` under a second (a clock tick is 10 ms, so
/// milliseconds would claim a precision ages do not have), then as `Elapsed`.
pub(crate) struct Age(pub Duration);

impl fmt::Display for Age {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 < Duration::from_secs(1) {
            write!(f, "{:.1}s", self.0.as_secs_f64())
        } else {
            Elapsed(self.0).fmt(f)
        }
    }
}

/// Text with its unsafe characters (`unsafe_char`: controls, zero-width and
/// other invisible ones) written out (`\u{1b}`, `\u{200b}`), newlines and
/// tabs kept: for a report's own layout, never for a field inside it. Every
/// output of text to a person goes through this or `one_line`, the one
/// escaping step (`escaped`): command lines, comms, a remote host's answers
/// and file contents are anyone's text, and an escape sequence in them must
/// not reach the terminal of the admin reading a report, nor a character
/// it shows nothing of hide what a name really is. JSON escapes them
/// already (`json_safe`).
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    escaped(text, |c| c != '\n' && c != '\t')
}

/// One line of text: every unsafe character written out, newlines too, so
/// that a comm, a command line, a path or a host's answer inside a report,
/// a prompt or a log line cannot start a line of its own.
pub fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    escaped(text, |_| true)
}

/// Anyone's text (a command line, a comm, a host's answer) as one line,
/// cut to `width` characters, marking the cut.
pub fn short(text: &str, width: usize) -> String {
    let text = &one_line(text);
    if text.chars().count() <= width {
        text.to_string()
    } else {
        let cut: String = text.chars().take(width.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

/// Anyone's text as a field of a line: `one_line`, for `format!`.
pub struct Field<'a>(pub &'a str);

impl fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&one_line(self.0))
    }
}

/// A JSON document as serde_json wrote it, with the characters it leaves
/// raw and a terminal acts on or shows nothing of (DEL, C1 controls, line
/// separators, bidirectional overrides, zero-width and tag characters: the
/// rest of `unsafe_char`) written as `\uXXXX` escapes, a pair of them for a
/// character beyond U+FFFF: the same document to a parser, nothing for a
/// terminal. serde_json escapes U+0000 to U+001F itself, and the others
/// occur only inside strings, so this never changes what the document says.
pub fn json_safe(json: String) -> String {
    // Below U+0020 only the layout's whitespace is left, outside strings.
    let unsafe_here = |c: char| c >= ' ' && unsafe_char(c);
    if !json.chars().any(unsafe_here) {
        return json;
    }
    let mut safe = String::with_capacity(json.len());
    for c in json.chars() {
        if unsafe_here(c) {
            for unit in c.encode_utf16(&mut [0; 2]) {
                let _ = fmt::Write::write_fmt(&mut safe, format_args!("\\u{unit:04x}"));
            }
        } else {
            safe.push(c);
        }
    }
    safe
}

/// Whether a character can move the cursor, start a line, reorder what a
/// terminal shows, or reach it unseen: every character of the general
/// categories Cc (C0, DEL, C1), Cf (format: the zero-width space, joiners
/// and word joiner, the bidirectional marks, overrides and isolates, the
/// invisible operators, U+FEFF, the tag characters), Zl and Zp (the line
/// and paragraph separators), Co (private use) and Cn (unassigned, which a
/// later Unicode may make anything); Cs (surrogates) is no `char`. The
/// categories are regex-syntax's Unicode tables (16.0, the regex crate's),
/// read once and only for text that is not ASCII.
fn unsafe_char(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_control();
    }
    // The class's ranges, sorted, searched by bisection: parsing the class
    // is a few tens of microseconds, where compiling it into a regex took
    // 0.65 ms, paid by every command whose report holds one non-ASCII
    // character (plan's `×`, `≈`).
    static UNSAFE: std::sync::OnceLock<Vec<(char, char)>> = std::sync::OnceLock::new();
    let ranges = UNSAFE.get_or_init(|| {
        let hir = regex_syntax::parse(r"[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Co}\p{Cn}]")
            .expect("a class of general categories");
        match hir.kind() {
            regex_syntax::hir::HirKind::Class(regex_syntax::hir::Class::Unicode(class)) => class
                .ranges()
                .iter()
                .map(|range| (range.start(), range.end()))
                .collect(),
            other => unreachable!("a class of general categories parses as a class: {other:?}"),
        }
    });
    // The first range that does not end before `c` holds it, or none does.
    let at = ranges.partition_point(|&(_, end)| end < c);
    ranges.get(at).is_some_and(|&(start, _)| start <= c)
}

/// The one escaping step: every unsafe character for which `escape` holds
/// written out as `\u{..}` (`\n`, `\r`, `\t` as such).
fn escaped(text: &str, escape: impl Fn(char) -> bool) -> std::borrow::Cow<'_, str> {
    let unsafe_here = |c: char| unsafe_char(c) && escape(c);
    if !text.chars().any(unsafe_here) {
        return std::borrow::Cow::Borrowed(text);
    }
    text.chars()
        .map(|c| {
            if unsafe_here(c) {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("80G"), Ok(80 << 30));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        for bad in ["", "GiB", "12 parsecs", "-1G", "1.2.3G"] {
            assert!(parse_size(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_duration("30days"), Ok(MAX_DURATION));
        let error = parse_duration("300000000000y").expect_err("overflows the clock");
        assert!(error.contains("30 days"), "{error}");
        let error = parse_duration("-5s").expect_err("negative");
        assert!(error.contains("cannot be negative"), "{error}");
        let error = parse_duration("--yes").expect_err("a flag, not a value");
        assert!(error.contains("expected a number with a unit"), "{error}");
    }

    #[test]
    fn gpu_lists_with_mig_instances_and_uuids() {
        assert_eq!(
            parse_gpu_list("0:1,MIG-3f0e2b1c-aaaa,GPU-0f3c,2"),
            Ok(GpuList::Refs(vec![
                GpuRef::Instance(0, 1),
                GpuRef::MigUuid("MIG-3f0e2b1c-aaaa".to_string()),
                GpuRef::Uuid("GPU-0f3c".to_string()),
                GpuRef::Index(2),
            ]))
        );
        for bad in [
            "0:",
            ":1",
            "0:1:2",
            "0:x",
            "MIG-",
            "MIG-GPU-1/2/3",
            "1024:0",
        ] {
            assert!(parse_gpu_list(bad).is_err(), "{bad} should be refused");
        }
        let union = GpuList::union(&[
            parse_gpu_list("3").expect("valid"),
            parse_gpu_list("0:1").expect("valid"),
        ]);
        assert_eq!(
            union,
            Some(GpuList::Refs(vec![
                GpuRef::Instance(0, 1),
                GpuRef::Index(3)
            ]))
        );
        let refs = [GpuRef::Instance(0, 1), GpuRef::Index(2)];
        assert_eq!(GpuRefs(&refs).to_string(), "0:1,2");
        // A command that takes indexes only says so, never drops a name.
        assert!(
            GpuList::Refs(vec![GpuRef::Instance(0, 1)])
                .resolve(2)
                .is_err()
        );
        assert_eq!(
            GpuList::Refs(vec![GpuRef::Index(1)]).resolve(2),
            Ok(BTreeSet::from([1]))
        );
    }

    #[test]
    fn gpu_lists() {
        assert_eq!(parse_gpu_list("all"), Ok(GpuList::All));
        assert_eq!(
            parse_gpu_list("0,2,5"),
            Ok(GpuList::Some([0, 2, 5].into_iter().collect()))
        );
        assert_eq!(
            parse_gpu_list("0-2,6"),
            Ok(GpuList::Some([0, 1, 2, 6].into_iter().collect()))
        );
        for bad in ["", "a", "3-1", "1,,2", "-1", "0-4294967295", "1024"] {
            assert!(parse_gpu_list(bad).is_err(), "{bad} should be refused");
        }
        assert_eq!(
            GpuList::union(&[
                parse_gpu_list("0").expect("valid"),
                parse_gpu_list("2-3").expect("valid")
            ]),
            Some(GpuList::Some([0, 2, 3].into_iter().collect()))
        );
        assert_eq!(GpuList::union(&[]), None);
        for text in ["0-7", "0,1", "0-2,6", "3", "0,2-4,7"] {
            let GpuList::Some(set) = parse_gpu_list(text).expect("valid list") else {
                panic!("{text} is a list");
            };
            assert_eq!(GpuRanges(&set).to_string(), text);
        }
        let list = parse_gpu_list("1,9").expect("valid list");
        let error = list.resolve(8).expect_err("index 9 does not exist");
        assert!(error.contains("no GPU with index 9"), "{error}");
        assert_eq!(GpuList::All.resolve(2), Ok([0, 1].into_iter().collect()));
    }

    #[test]
    fn escaping() {
        let hostile = "a\u{1b}[2K\rb\nc\td\u{9b}e\u{202e}f";
        assert_eq!(
            one_line(hostile),
            "a\\u{1b}[2K\\rb\\nc\\td\\u{9b}e\\u{202e}f"
        );
        assert_eq!(
            printable(hostile),
            "a\\u{1b}[2K\\rb\nc\td\\u{9b}e\\u{202e}f"
        );
        assert_eq!(Field("x\ny").to_string(), "x\\ny");
        assert_eq!(format!("[{:<5}]", Field("\r")), "[\\r   ]");
        let json = serde_json::to_string_pretty(&[hostile]).expect("JSON");
        let safe = json_safe(json.clone());
        assert_eq!(
            serde_json::from_str::<Vec<String>>(&safe).expect("still JSON"),
            [hostile]
        );
        assert_eq!(printable(&safe), safe, "nothing left to escape");
        assert!(
            !safe.contains('\u{9b}') && safe.contains("\\u009b"),
            "{safe}"
        );
        assert!(matches!(one_line("plain é"), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn printing() {
        assert_eq!(Bytes(0).to_string(), "0 B");
        assert_eq!(Bytes(1).to_string(), "1 B");
        assert_eq!(Bytes(300 << 10).to_string(), "300 KiB");
        assert_eq!(Bytes(512 << 20).to_string(), "512 MiB");
        assert_eq!(Bytes(92 << 30).to_string(), "92.0 GiB");
        assert_eq!(MaybeBytes(None).to_string(), "unknown");
        assert_eq!(Elapsed(Duration::from_millis(206)).to_string(), "206ms");
        assert_eq!(Elapsed(Duration::from_secs(190)).to_string(), "3m10s");
        assert_eq!(Age(Duration::from_millis(400)).to_string(), "0.4s");
        assert_eq!(Age(Duration::from_millis(0)).to_string(), "0.0s");
        assert_eq!(Age(Duration::from_millis(4040)).to_string(), "4.0s");
        assert_eq!(Age(Duration::from_secs(3700)).to_string(), "1h01m");
    }
}
