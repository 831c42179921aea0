//! The in-process engine: costs a request with its model profile and
//! produces deterministic text.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rust_decimal::Decimal;

use crate::profile::ModelProfile;
use crate::tokenizer;

/// Words that are one cl100k token each when preceded by a space, so the
/// completion's token count is exactly the number of words generated.
const WORDS: &[&str] = &[
    " the", " model", " answer", " is", " a", " token", " of", " GPU", " time", " and", " we",
    " meter", " each", " request", " once", " cost", " per", " hour", " off", " peak",
];

/// What the engine needs to know about a request. No tenant, no price.
#[derive(Debug, Clone)]
pub struct CompletionRequest {
    pub model: String,
    /// The prompt as the engine sees it (the chat messages, flattened).
    pub prompt: String,
    pub max_tokens: Option<u32>,
    /// Seeds the generated text: same seed and prompt, same answer.
    pub seed: u64,
}

/// What a finished request used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub model_version: String,
    pub text: String,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// True when `max_tokens` cut the answer short.
    pub length_capped: bool,
    /// Simulated time to first token and total time.
    pub ttft: Duration,
    pub total: Duration,
    /// GPU time attributed to the request: busy time × the replica's GPUs.
    pub gpu_seconds: Decimal,
    pub replica_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("model {0:?} is not served")]
    UnknownModel(String),
    #[error(
        "prompt of {prompt} tokens plus {output} output tokens exceeds the context of {limit}"
    )]
    ContextTooLong {
        prompt: u64,
        output: u64,
        limit: u32,
    },
}

/// The simulated engine. `speedup` divides real sleeping time (1 = real
/// time; 0 = answer at once), never the reported figures.
#[derive(Debug, Clone)]
pub struct Simulator {
    profiles: Vec<ModelProfile>,
    speedup: u32,
}

impl Simulator {
    pub fn new(profiles: Vec<ModelProfile>, speedup: u32) -> Self {
        tokenizer::warm_up();
        Self { profiles, speedup }
    }

    pub fn models(&self) -> &[ModelProfile] {
        &self.profiles
    }

    pub fn profile(&self, model: &str) -> Option<&ModelProfile> {
        self.profiles.iter().find(|p| p.name == model)
    }

    /// Costs and answers one request without waiting.
    pub fn plan(&self, req: &CompletionRequest) -> Result<Completion, EngineError> {
        let profile = self
            .profile(&req.model)
            .ok_or_else(|| EngineError::UnknownModel(req.model.clone()))?;
        let prompt_tokens = tokenizer::count(&req.prompt);
        let mut rng = StdRng::seed_from_u64(req.seed ^ prompt_tokens.rotate_left(17));
        let natural: u64 = rng.random_range(16..=600);
        let cap = u64::from(req.max_tokens.unwrap_or(u32::MAX));
        let completion_tokens = natural.min(cap);
        let room = u64::from(profile.max_context).saturating_sub(prompt_tokens);
        if completion_tokens > room {
            return Err(EngineError::ContextTooLong {
                prompt: prompt_tokens,
                output: completion_tokens,
                limit: profile.max_context,
            });
        }
        let mut text = String::with_capacity(completion_tokens as usize * 6);
        for _ in 0..completion_tokens {
            text.push_str(WORDS[rng.random_range(0..WORDS.len())]);
        }
        let prefill = profile.prefill_micros(prompt_tokens);
        let decode = completion_tokens.saturating_mul(profile.decode_step_micros);
        // The first decode step produces the first token.
        let ttft = prefill + profile.decode_step_micros.min(decode);
        let busy = prefill + decode;
        let gpu_micros = busy.saturating_mul(u64::from(profile.gpus));
        Ok(Completion {
            model_version: profile.version.clone(),
            text,
            prompt_tokens,
            cached_tokens: 0,
            completion_tokens,
            length_capped: completion_tokens < natural,
            ttft: Duration::from_micros(ttft),
            total: Duration::from_micros(busy),
            gpu_seconds: Decimal::new(gpu_micros as i64, 6),
            replica_id: format!("{}-r0", profile.name),
        })
    }

    /// Answers a request, taking (simulated time / speedup) of real time.
    pub async fn complete(&self, req: &CompletionRequest) -> Result<Completion, EngineError> {
        let done = self.plan(req)?;
        if self.speedup > 0 {
            tokio::time::sleep(done.total / self.speedup).await;
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim() -> Simulator {
        Simulator::new(ModelProfile::reference(), 0)
    }

    fn req(prompt: &str, max_tokens: Option<u32>) -> CompletionRequest {
        CompletionRequest {
            model: "llama-3.1-70b".into(),
            prompt: prompt.into(),
            max_tokens,
            seed: 7,
        }
    }

    #[test]
    fn same_seed_same_answer() {
        let a = sim().plan(&req("tell me about GPUs", None)).unwrap();
        let b = sim().plan(&req("tell me about GPUs", None)).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn completion_tokens_are_the_tokens_of_the_text() {
        let c = sim().plan(&req("count me", Some(50))).unwrap();
        assert_eq!(tokenizer::count(&c.text), c.completion_tokens);
    }

    #[test]
    fn max_tokens_caps_and_says_so() {
        let c = sim().plan(&req("a long answer please", Some(3))).unwrap();
        assert_eq!(c.completion_tokens, 3);
        assert!(c.length_capped);
    }

    #[test]
    fn gpu_seconds_are_busy_time_times_gpus() {
        let c = sim().plan(&req("hello", Some(10))).unwrap();
        let busy = Decimal::from(c.total.as_micros() as i64) / Decimal::from(1_000_000);
        assert_eq!(c.gpu_seconds, busy * Decimal::from(4));
        assert!(c.gpu_seconds.scale() <= 6);
    }

    #[test]
    fn unknown_model_is_an_error() {
        let mut r = req("x", None);
        r.model = "gpt-9".into();
        assert_eq!(
            sim().plan(&r),
            Err(EngineError::UnknownModel("gpt-9".into()))
        );
    }
}
