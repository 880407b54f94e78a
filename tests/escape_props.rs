//! Property: the one escaping step (`units::one_line`, `units::printable`,
//! `units::json_safe`) over every Unicode general category. A character a
//! terminal acts on or shows nothing of (categories Cc, Cf, Zl, Zp, Co, Cn;
//! Cs is no `char`), the zero-width and invisible ones fd's sanitiser
//! covers among them, never reaches the output raw and is written out as
//! `\u{..}` (`\n`, `\r`, `\t`), so that the text reads back to what it was;
//! letters, marks, numbers, punctuation, symbols and spaces stay as they
//! are. The categories come from `unicode-general-category`, a table of
//! its own, not from the regex tables the rule reads.

use std::collections::BTreeMap;

use gpureap_core::units::{json_safe, one_line, printable};
use proptest::prelude::*;
use unicode_general_category::{GeneralCategory as G, get_general_category};

/// The ranges the issue names (fd's sanitiser): zero-width space and
/// joiners, bidirectional marks, overrides and isolates, the word joiner
/// and invisible operators, the byte order mark, the tag characters.
const NAMED: [(char, char); 5] = [
    ('\u{200b}', '\u{200f}'),
    ('\u{202a}', '\u{202e}'),
    ('\u{2060}', '\u{206f}'),
    ('\u{feff}', '\u{feff}'),
    ('\u{e0000}', '\u{e007f}'),
];

/// Whether the rule must write `c` out.
fn unseen(c: char) -> bool {
    NAMED
        .iter()
        .any(|&(first, last)| (first..=last).contains(&c))
        || matches!(
            get_general_category(c),
            G::Control
                | G::Format
                | G::LineSeparator
                | G::ParagraphSeparator
                | G::PrivateUse
                | G::Surrogate
                | G::Unassigned
        )
}

/// `c` as the output shows it; `layout`: newlines and tabs kept (`printable`).
fn shown(c: char, layout: bool) -> String {
    match c {
        _ if !unseen(c) => c.to_string(),
        '\n' | '\t' if layout => c.to_string(),
        '\n' => "\\n".to_string(),
        '\r' => "\\r".to_string(),
        '\t' => "\\t".to_string(),
        _ => format!("\\u{{{:x}}}", u32::from(c)),
    }
}

/// The text an output of `one_line` stands for: each `\u{..}`, `\n`, `\r`,
/// `\t` read back (for text that had no backslash of its own).
fn read_back(shown: &str) -> String {
    let mut text = String::new();
    let mut rest = shown;
    while let Some(at) = rest.find('\\') {
        text.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        let (c, len) = match rest.as_bytes().first() {
            Some(b'n') => ('\n', 1),
            Some(b'r') => ('\r', 1),
            Some(b't') => ('\t', 1),
            Some(b'u') => {
                let end = rest.find('}').expect("a closed \\u{..}");
                let code = u32::from_str_radix(&rest[2..end], 16).expect("hex");
                (char::from_u32(code).expect("a char"), end + 1)
            }
            other => panic!("a backslash before {other:?} in {shown:?}"),
        };
        text.push(c);
        rest = &rest[len..];
    }
    text.push_str(rest);
    text
}

fn every_char() -> impl Iterator<Item = char> {
    (0..=u32::from(char::MAX)).filter_map(char::from_u32)
}

/// Every character, one at a time: as `shown` says, and no other
/// category's character is touched. Every category but Cs (no `char`)
/// is met.
#[test]
fn every_character_of_every_category() {
    let mut met: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for c in every_char() {
        let text = c.to_string();
        let line = one_line(&text);
        assert_eq!(line, shown(c, false), "U+{:04X}", u32::from(c));
        assert_eq!(printable(&text), shown(c, true), "U+{:04X}", u32::from(c));
        let entry = met
            .entry(get_general_category(c).abbreviation())
            .or_default();
        entry.0 += 1;
        entry.1 += usize::from(line != text);
    }
    assert_eq!(met.len(), 29, "{met:?}");
    for (category, (count, written)) in &met {
        let expected = if ["Cc", "Cf", "Zl", "Zp", "Co", "Cn"].contains(category) {
            *count
        } else {
            0
        };
        assert_eq!(*written, expected, "{category}: {written} of {count}");
    }
}

/// Up to 24 characters of each category, and every character of the
/// named ranges: what the strings below are made of, besides any char.
fn samples() -> Vec<char> {
    let mut taken: BTreeMap<&str, usize> = BTreeMap::new();
    let mut samples: Vec<char> = every_char()
        .filter(|&c| {
            let count = taken
                .entry(get_general_category(c).abbreviation())
                .or_default();
            *count += 1;
            *count <= 24
        })
        .collect();
    for (first, last) in NAMED {
        samples.extend(first..=last);
    }
    samples.extend(['a', 'é', ' ', '\\', '"', '\n', '\t', '\r', '\u{1b}']);
    samples
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Strings mixing every category: each character as `shown` says, no
    /// unseen one left raw, read back to the text (without backslashes of
    /// its own); the JSON document of it the same string to a parser,
    /// with nothing unseen raw either.
    #[test]
    fn strings_of_every_category(
        chars in prop::collection::vec(
            prop_oneof![3 => prop::sample::select(samples()), 1 => any::<char>()],
            0..40,
        )
    ) {
        let text: String = chars.iter().collect();
        let line = one_line(&text);
        let expected: String = chars.iter().map(|&c| shown(c, false)).collect();
        prop_assert_eq!(&line, &expected);
        prop_assert!(!line.chars().any(unseen), "{:?}", line);
        let layout: String = chars.iter().map(|&c| shown(c, true)).collect();
        prop_assert_eq!(printable(&text), layout);
        if !text.contains('\\') {
            prop_assert_eq!(read_back(&line), text.clone());
        }
        let json = json_safe(serde_json::to_string(&text).expect("JSON"));
        prop_assert!(!json.chars().any(unseen), "{:?}", json);
        prop_assert_eq!(serde_json::from_str::<String>(&json).expect("still JSON"), text);
    }
}
