//! Model profiles: how big a replica is and how fast it runs. The numbers
//! come from the reference fleet (70B on 4 H100-class GPUs: prefill about
//! 28,000 tokens/s, so 4,096 tokens in about 146 ms; a lone decode step
//! reads every weight once, about 10 ms).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelProfile {
    /// The model name clients send.
    pub name: String,
    /// Reported as `model_version` on usage events.
    pub version: String,
    /// GPUs per replica: every busy second of a replica is this many GPU-seconds.
    pub gpus: u32,
    /// Prefill throughput, prompt tokens per second.
    pub prefill_tokens_per_second: u64,
    /// Time of one decode step for a lone request, in microseconds.
    pub decode_step_micros: u64,
    /// The longest prompt plus output a replica accepts.
    pub max_context: u32,
}

impl ModelProfile {
    /// The reference profiles: 8B on 1 GPU, 70B on 4, a frontier model on 8.
    pub fn reference() -> Vec<Self> {
        vec![
            Self {
                name: "llama-3.1-8b".into(),
                version: "8b-2026.10".into(),
                gpus: 1,
                prefill_tokens_per_second: 40_000,
                decode_step_micros: 6_000,
                max_context: 131_072,
            },
            Self {
                name: "llama-3.1-70b".into(),
                version: "70b-2026.10".into(),
                gpus: 4,
                prefill_tokens_per_second: 28_000,
                decode_step_micros: 10_400,
                max_context: 131_072,
            },
            Self {
                name: "frontier-405b".into(),
                version: "405b-2026.10".into(),
                gpus: 8,
                prefill_tokens_per_second: 12_000,
                decode_step_micros: 28_000,
                max_context: 131_072,
            },
        ]
    }

    /// Unchunked prefill time for `tokens`, in microseconds.
    pub fn prefill_micros(&self, tokens: u64) -> u64 {
        tokens.saturating_mul(1_000_000) / self.prefill_tokens_per_second.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_4k_prefill_on_70b_takes_about_146_ms() {
        let p70 = &ModelProfile::reference()[1];
        let ms = p70.prefill_micros(4096) / 1000;
        assert!((140..=150).contains(&ms), "took {ms} ms");
    }
}
