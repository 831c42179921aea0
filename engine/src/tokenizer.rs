//! Prompt tokens from a real BPE vocabulary (cl100k_base, shipped inside
//! the tiktoken-rs crate, so nothing is fetched at run time), and the
//! chained hashes of their 16-token blocks that key the prefix cache.

use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;

static BPE: OnceLock<Option<CoreBPE>> = OnceLock::new();

fn bpe() -> Option<&'static CoreBPE> {
    BPE.get_or_init(|| tiktoken_rs::cl100k_base().ok()).as_ref()
}

/// Loads the vocabulary now rather than on the first request.
pub fn warm_up() -> bool {
    bpe().is_some()
}

/// The number of tokens in `text`.
pub fn count(text: &str) -> u64 {
    match bpe() {
        Some(bpe) => bpe.encode_ordinary(text).len() as u64,
        // The vocabulary is compiled into the binary; this cannot happen in
        // practice, but a count must never be zero for non-empty text.
        None => text.len().div_ceil(4) as u64,
    }
}

/// The token ids of `text` (byte-chunk ids if the vocabulary were missing).
pub fn encode(text: &str) -> Vec<u32> {
    match bpe() {
        Some(bpe) => bpe.encode_ordinary(text),
        None => text
            .as_bytes()
            .chunks(4)
            .map(|c| c.iter().fold(0u32, |h, &b| (h << 8) | u32::from(b)))
            .collect(),
    }
}

/// Chained hashes of the full 16-token blocks of `tokens`, seeded with the
/// model version: block i's hash covers every token up to its end, so equal
/// hashes mean equal prefixes (FNV-1a, stable across runs and builds).
pub fn block_hashes(version: &str, tokens: &[u32]) -> Vec<u64> {
    const PRIME: u64 = 0x0000_0100_0000_01B3;
    let mut h = version.bytes().fold(0xCBF2_9CE4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(PRIME)
    });
    tokens
        .chunks_exact(crate::profile::BLOCK_TOKENS as usize)
        .map(|block| {
            for &t in block {
                h = (h ^ u64::from(t)).wrapping_mul(PRIME);
            }
            h
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    fn parse(body: &str) -> openai_wire::ChatRequest {
        serde_json::from_str(body).unwrap()
    }

    /// What the simulator counts of a request with content parts.
    #[test]
    fn images_and_audio_cost_their_fixed_tokens() {
        let text = "Describe this picture";
        let plain = parse(
            &json!({"model": "m", "messages": [{"role": "user", "content": text}]}).to_string(),
        );
        let parts = parse(
            &json!({"model": "m", "messages": [{"role": "user", "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "mp3"}}
            ]}]})
            .to_string(),
        );
        let count = |r: &openai_wire::ChatRequest| super::count(&r.prompt());
        assert_eq!(
            count(&parts),
            count(&plain) + openai_wire::IMAGE_PART_TOKENS + openai_wire::AUDIO_PART_TOKENS + 2,
            "the text, each part's fixed cost, and the two newlines between parts"
        );
        // A text part counts like the same string content.
        let one_part = parse(&json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}).to_string());
        assert_eq!(count(&one_part), count(&plain));
    }

    #[test]
    fn equal_prefixes_hash_equal_and_versions_differ() {
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        b[20] = 999;
        let (ha, hb) = (super::block_hashes("v1", &a), super::block_hashes("v1", &b));
        assert_eq!(ha.len(), 2);
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        assert_ne!(ha[0], super::block_hashes("v2", &a)[0]);
        assert_eq!(super::encode("hello world").len(), 2);
    }

    #[test]
    fn counts_bpe_tokens_not_characters() {
        assert_eq!(super::count("hello world"), 2);
        assert_eq!(super::count(""), 0);
    }
}
