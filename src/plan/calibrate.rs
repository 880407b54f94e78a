//! `--from-log`: the figures a previous start of the engine logged.

use super::launch::Engine;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Logged {
    pub weights_per_gpu: Option<u64>,
    pub free_before_load: Option<u64>,
    pub tokens: Option<u64>,
    pub kv_bytes: Option<u64>,
    pub engine: Option<Engine>,
}

/// Reads the lines ENGINES.md §1.3 / §2 name, both engines.
pub fn read_log(text: &str) -> Logged {
    let mut logged = Logged::default();
    for line in text.lines() {
        if let Some(rest) = line.split("KV Cache is allocated. #tokens: ").nth(1) {
            logged.engine = Some(Engine::Sglang);
            logged.tokens = rest
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|digits| digits.parse().ok());
        }
    }
    logged
}
