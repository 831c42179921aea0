//! Prompt token counting with a real BPE vocabulary (cl100k_base, shipped
//! inside the tiktoken-rs crate, so nothing is fetched at run time).

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

#[cfg(test)]
mod tests {
    #[test]
    fn counts_bpe_tokens_not_characters() {
        assert_eq!(super::count("hello world"), 2);
        assert_eq!(super::count(""), 0);
    }
}
