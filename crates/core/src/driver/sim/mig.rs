//! MIG on the simulated driver (docs/simulated-driver.md, docs/mig.md).
//!
//! `DIR/mig.N` puts GPU N in MIG mode: one instance a line, line `I` is MIG
//! device `I`, `GI CI PROFILE TOTAL_BYTES [UUID]`; an empty file is MIG mode
//! with no instances. It is read once, when the driver opens (changing MIG
//! instances needs an idle GPU on a real host too). On such a GPU a holder's
//! claim names its instance (`I:BYTES`, `I:unknown`, or `none`), and
//! `DIR/leak.N.I` is memory held on instance `I` by no process.

use std::os::fd::OwnedFd;
use std::path::Path;

use super::{DriverError, describe, parse_bytes, read_bounded};
use crate::driver::MigInstance;

/// Largest `DIR/mig.N`: a line per instance, at most a few dozen.
const MIG_FILE_LIMIT: usize = 8 << 10;
/// More instances than any GPU has (an A100/H100/H200 has at most 7).
const MOST_INSTANCES: usize = 64;

/// One staged MIG instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Staged {
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub profile: String,
    pub total: u64,
    pub uuid: String,
}

/// A simulated MIG device's UUID, fixed by its GPU and index unless staged.
pub(crate) fn sim_mig_uuid(gpu: u32, index: u32) -> String {
    format!("MIG-sim-{gpu:08}-{index:04}")
}

/// Each GPU's staged instances: `None` for a GPU not in MIG mode.
pub(super) fn read_all(
    directory: &OwnedFd,
    dir: &Path,
    gpu_count: u32,
) -> Result<Vec<Option<Vec<Staged>>>, DriverError> {
    (0..gpu_count)
        .map(|gpu| {
            let name = format!("mig.{gpu}");
            let shown_as = dir.join(&name);
            read_bounded(directory, &name, &shown_as, MIG_FILE_LIMIT)?
                .map(|content| parse(&content, &shown_as, gpu))
                .transpose()
        })
        .collect()
}

/// Parses `DIR/mig.N`.
pub(super) fn parse(content: &[u8], shown_as: &Path, gpu: u32) -> Result<Vec<Staged>, DriverError> {
    let bad = |line: usize, what: String| {
        DriverError::Sim(format!(
            "{} line {line}: expected GI CI PROFILE TOTAL_BYTES [UUID]; {what}",
            shown_as.display()
        ))
    };
    let text =
        std::str::from_utf8(content).map_err(|_| bad(1, format!("found {}", describe(content))))?;
    let mut staged = Vec::new();
    for (number, line) in text.lines().enumerate().map(|(at, line)| (at + 1, line)) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.is_empty() {
            continue;
        }
        let found = || format!("found {}", describe(line.as_bytes()));
        let [gi, ci, profile, total, rest @ ..] = fields.as_slice() else {
            return Err(bad(number, found()));
        };
        let id = |text: &str| text.parse::<u32>().map_err(|_| bad(number, found()));
        let total = parse_bytes(total.as_bytes(), shown_as).map_err(|_| bad(number, found()))?;
        let printable = |text: &str| text.len() <= 64 && text.bytes().all(|b| b.is_ascii_graphic());
        let uuid = match rest {
            [] => sim_mig_uuid(gpu, staged.len() as u32),
            [uuid] if uuid.starts_with("MIG-") && printable(uuid) => (*uuid).to_string(),
            _ => return Err(bad(number, found())),
        };
        if !printable(profile) {
            return Err(bad(number, found()));
        }
        staged.push(Staged {
            gpu_instance_id: id(gi)?,
            compute_instance_id: id(ci)?,
            profile: (*profile).to_string(),
            total,
            uuid,
        });
        if staged.len() > MOST_INSTANCES {
            return Err(bad(number, format!("more than {MOST_INSTANCES} instances")));
        }
    }
    Ok(staged)
}

/// The staged instances as the driver gives them, before their holders
/// and figures are filled in.
pub(super) fn instances(staged: &[Staged]) -> Vec<MigInstance> {
    staged
        .iter()
        .enumerate()
        .map(|(at, staged)| MigInstance {
            index: at as u32,
            gpu_instance_id: Some(staged.gpu_instance_id),
            compute_instance_id: Some(staged.compute_instance_id),
            profile: Some(staged.profile.clone()),
            uuid: Some(staged.uuid.clone()),
            memory_total: Some(staged.total),
            memory_used: None,
            processes: Vec::new(),
        })
        .collect()
}

/// Splits a claim on a MIG GPU into its instance and the rest: `2:4096`
/// gives `(2, "4096")`; `None` where it names no instance.
pub(super) fn split_claim(content: &[u8]) -> Option<(u32, &[u8])> {
    let at = content.iter().position(|&b| b == b':')?;
    let (index, rest) = content.split_at(at);
    let index = std::str::from_utf8(index).ok()?.trim();
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((index.parse().ok()?, &rest[1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_files() {
        let path = Path::new("/d/mig.0");
        let staged = parse(
            b"1 0 1g.18gb 19327352832\n2 0 3g.71gb 76235669504 MIG-abc\n",
            path,
            0,
        )
        .expect("valid");
        assert_eq!(staged.len(), 2);
        assert_eq!(staged[0].uuid, "MIG-sim-00000000-0000");
        assert_eq!(staged[1].uuid, "MIG-abc");
        assert_eq!(staged[1].gpu_instance_id, 2);
        assert_eq!(parse(b"", path, 0), Ok(Vec::new()));
        for bad in [
            &b"1 0 1g"[..],
            b"x 0 1g.18gb 5",
            b"1 0 1g.18gb 5 GPU-x",
            b"\xff",
        ] {
            assert!(parse(bad, path, 0).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn claims_name_instances() {
        assert_eq!(split_claim(b"2:4096\n"), Some((2, &b"4096\n"[..])));
        assert_eq!(split_claim(b"0:unknown"), Some((0, &b"unknown"[..])));
        assert_eq!(split_claim(b"4096"), None);
        assert_eq!(split_claim(b"x:4096"), None);
    }
}
