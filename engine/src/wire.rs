//! A simulated [`Completion`] on the OpenAI wire: the one place that turns
//! what the simulator measured into `openai_wire` types, for the engine's
//! server and the gateway alike (the wire crate knows nothing of the
//! simulator), and what of a request the simulator refuses
//! ([`unsupported_by_simulator`]).

use openai_wire::{
    ChatCompletion, ChatRequest, FinishReason, Invalid, Meterline, ResponseFormat, ToolChoice,
    ToolChoiceMode, Usage,
};

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

/// What the simulator cannot do in a request, refused rather than ignored
/// (the engine's server and the gateway, for a simulated model): several
/// choices, log probabilities, forced or named tool calls, JSON-schema
/// output and audio output.
pub fn unsupported_by_simulator(req: &ChatRequest) -> Option<Invalid> {
    let refuse = |param: &'static str, what: &str| {
        Some(Invalid {
            param,
            message: format!("{what} is not supported by simulated models"),
        })
    };
    if req.n.is_some_and(|n| n > 1) {
        return refuse("n", "n greater than 1");
    }
    if req.logprobs == Some(true) {
        return refuse("logprobs", "logprobs");
    }
    if req.top_logprobs.is_some_and(|n| n > 0) {
        return refuse("top_logprobs", "top_logprobs");
    }
    match &req.tool_choice {
        None | Some(ToolChoice::Mode(ToolChoiceMode::Auto | ToolChoiceMode::None)) => {}
        Some(ToolChoice::Mode(ToolChoiceMode::Required)) => {
            return refuse("tool_choice", "tool_choice \"required\"")
        }
        Some(ToolChoice::Named(_)) => return refuse("tool_choice", "a named tool_choice"),
    }
    if matches!(req.response_format, Some(ResponseFormat::JsonSchema { .. })) {
        return refuse("response_format", "response_format json_schema");
    }
    if req
        .modalities
        .iter()
        .flatten()
        .any(|m| m.as_str() == "audio")
    {
        return refuse("modalities", "audio output");
    }
    if req.audio.as_ref().is_some_and(|a| !a.is_null()) {
        return refuse("audio", "audio output");
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use serde_json::{json, Value};

    use super::*;

    #[test]
    fn what_the_simulator_cannot_do_is_refused_naming_the_parameter() {
        let base = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let with = |field: &str, value: Value| {
            let mut body = base.clone();
            body[field] = value;
            unsupported_by_simulator(&serde_json::from_value::<ChatRequest>(body).unwrap())
                .map(|i| i.param)
        };
        assert_eq!(with("n", json!(2)), Some("n"));
        assert_eq!(with("n", json!(1)), None);
        assert_eq!(with("logprobs", json!(true)), Some("logprobs"));
        assert_eq!(with("top_logprobs", json!(3)), Some("top_logprobs"));
        assert_eq!(with("tool_choice", json!("required")), Some("tool_choice"));
        assert_eq!(
            with(
                "tool_choice",
                json!({"type": "function", "function": {"name": "f"}})
            ),
            Some("tool_choice")
        );
        assert_eq!(with("tool_choice", json!("none")), None);
        assert_eq!(
            with(
                "response_format",
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {}}})
            ),
            Some("response_format")
        );
        assert_eq!(
            with("modalities", json!(["text", "audio"])),
            Some("modalities")
        );
        assert_eq!(with("modalities", json!(["text"])), None);
        assert_eq!(
            with("audio", json!({"voice": "alloy", "format": "wav"})),
            Some("audio")
        );
        assert_eq!(with("temperature", json!(1.5)), None);
        assert_eq!(with("logprobs", json!(false)), None);
        assert_eq!(with("tool_choice", json!("auto")), None);
        assert_eq!(
            with("response_format", json!({"type": "json_object"})),
            None
        );
    }
}
