//! What a caller and an engine exchange: the request as the engine needs
//! it, what a running generation reports, and what a finished (or failed)
//! request used. The simulator and the HTTP upstreams both speak it; the
//! error type carries a [`Completion`] when a replica died mid-request.

use std::borrow::Cow;
use std::time::Duration;

use rust_decimal::Decimal;

use crate::scheduler::ServiceClass;

/// The output assumed for a request's estimates (its queue cost, its KV
/// for the reserved floors) when neither it nor its tenant caps it.
pub const DEFAULT_OUTPUT_ESTIMATE: u64 = 4096;

/// What the engine needs to know about a request. No price, no plan: the
/// tenant only keys the prefix cache, the class only gates admission.
#[derive(Debug, Clone, Default)]
pub struct CompletionRequest {
    pub model: String,
    /// The prompt as the engine sees it (the chat messages, flattened).
    pub prompt: String,
    pub max_tokens: Option<u32>,
    /// Seeds the generated text: same seed and prompt, same answer.
    pub seed: u64,
    /// Whose prefix-cache entries this request may use and fill.
    pub tenant_id: String,
    pub class: ServiceClass,
    /// The client's request as sent, passed through to an HTTP upstream
    /// (the simulator reads only `prompt`).
    pub body: Option<serde_json::Value>,
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
    /// Simulated time to first token and total time, queueing included.
    pub ttft: Duration,
    pub total: Duration,
    /// GPU time attributed to the request (its share of every step it was in).
    pub gpu_seconds: Decimal,
    /// The part of `gpu_seconds` thrown away by preemptions.
    pub preempted_gpu_seconds: Decimal,
    /// How often the replica preempted it.
    pub preemptions: u32,
    pub replica_id: String,
    /// The owner of the replica it ran on, when that replica is dedicated.
    pub dedicated_to: Option<String>,
}

/// What a running generation reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Token(Cow<'static, str>),
    Done(Completion),
}
