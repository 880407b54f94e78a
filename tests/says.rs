//! What a command printed, asserted phrase by phrase: a missing phrase
//! fails naming it, with the whole text.

/// Asserts that `text` contains each of `phrases`.
pub fn says(text: &str, phrases: &[&str]) {
    for phrase in phrases {
        assert!(text.contains(phrase), "{phrase:?} not in:\n{text}");
    }
}
