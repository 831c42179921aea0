//! A simulated [`Completion`] on the OpenAI wire: the one place that turns
//! what the simulator measured into `openai_wire` types, for the engine's
//! server and the gateway alike (the wire crate knows nothing of the
//! simulator).

use openai_wire::{ChatCompletion, FinishReason, Meterline, Usage};

use crate::simulator::Completion;

/// How the completion ended: `length` when the output cap cut it.
pub fn finish_reason(done: &Completion) -> FinishReason {
    FinishReason::of_capped(done.length_capped)
}

/// The engine's own token counts.
pub fn usage(done: &Completion) -> Usage {
    Usage::of_counts(
        done.prompt_tokens,
        done.cached_tokens,
        done.completion_tokens,
    )
}

/// The GPU figures no real engine reports, exact.
pub fn meterline(done: &Completion) -> Meterline {
    Meterline {
        gpu_seconds: done.gpu_seconds,
        preempted_gpu_seconds: done.preempted_gpu_seconds,
        model_version: Some(done.model_version.clone()),
        replica_id: Some(done.replica_id.clone()),
        preemptions: done.preemptions,
        dedicated_to: done.dedicated_to.clone(),
        ttft_ms: Some(done.ttft.as_millis() as u64),
        total_ms: Some(done.total.as_millis() as u64),
    }
}

/// The `chat.completion` answer of a completed generation.
pub fn chat_completion(
    id: String,
    created: i64,
    model: String,
    done: &Completion,
) -> ChatCompletion {
    ChatCompletion::answer(
        id,
        created,
        model,
        done.text.clone(),
        finish_reason(done),
        usage(done),
    )
}
