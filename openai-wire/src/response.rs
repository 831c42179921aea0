//! What a chat completion answers: `chat.completion` (non-streaming) and
//! `chat.completion.chunk` (one per SSE frame), with `usage` and the
//! `meterline` extension.
//!
//! With `stream_options.include_usage`, every chunk carries `"usage": null`
//! and one last chunk with empty `choices` carries the usage, as OpenAI
//! streams it; without it, no chunk has a `usage` key
//! ([`ChatCompletionChunk::usage`]).

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const COMPLETION_OBJECT: &str = "chat.completion";
pub const CHUNK_OBJECT: &str = "chat.completion.chunk";

/// A non-streaming answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletion {
    pub id: String,
    /// Always [`COMPLETION_OBJECT`].
    pub object: String,
    pub created: i64,
    pub model: String,
    pub choices: Vec<Choice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Meterline's engine only; absent from the gateway's answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meterline: Option<Meterline>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    pub index: u32,
    pub message: AssistantMessage,
    pub finish_reason: Option<FinishReason>,
}

/// The assistant's answer in a [`Choice`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: String,
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
}

/// One SSE frame of a streamed answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    /// Always [`CHUNK_OBJECT`].
    pub object: String,
    pub created: i64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    /// `None`: no `usage` key (the client did not ask for usage);
    /// `Some(None)`: `"usage": null` (asked for, not this chunk);
    /// `Some(Some(_))`: the usage chunk. Read back, `null` and absent are
    /// both `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    /// Meterline's engine only, on its usage chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meterline: Option<Meterline>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub finish_reason: Option<FinishReason>,
}

/// What a chunk adds to the answer; empty (`{}`) on the finishing chunk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    FunctionCall,
}

impl FinishReason {
    /// `length` when the output cap cut the completion, else `stop`.
    pub fn of_capped(length_capped: bool) -> Self {
        if length_capped {
            Self::Length
        } else {
            Self::Stop
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Some servers leave it out; read as 0 then.
    #[serde(default)]
    pub total_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

impl Usage {
    /// The usage of a completion's token counts, the total and the cached
    /// prompt tokens included.
    pub fn of_counts(prompt_tokens: u64, cached_tokens: u64, completion_tokens: u64) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: Some(PromptTokensDetails {
                cached_tokens: Some(cached_tokens),
            }),
        }
    }

    /// `prompt_tokens_details.cached_tokens`, 0 when not reported.
    pub fn cached_tokens(&self) -> u64 {
        self.prompt_tokens_details
            .as_ref()
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0)
    }
}

/// What a real engine cannot tell and Meterline needs: the request's
/// attributed GPU time, exact to the microsecond, as decimal strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meterline {
    pub gpu_seconds: Decimal,
    #[serde(default)]
    pub preempted_gpu_seconds: Decimal,
    #[serde(default)]
    pub model_version: Option<String>,
    #[serde(default)]
    pub replica_id: Option<String>,
    /// How often the replica preempted the request.
    #[serde(default)]
    pub preemptions: u32,
    /// The owner of the replica, when it is dedicated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedicated_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_ms: Option<u64>,
}

impl ChatCompletion {
    /// The answer of a completed generation: one choice with its text.
    pub fn answer(
        id: String,
        created: i64,
        model: String,
        text: String,
        finish_reason: FinishReason,
        usage: Usage,
    ) -> Self {
        Self {
            id,
            object: COMPLETION_OBJECT.to_owned(),
            created,
            model,
            choices: vec![Choice {
                index: 0,
                message: AssistantMessage {
                    role: "assistant".to_owned(),
                    content: Some(text),
                    tool_calls: None,
                },
                finish_reason: Some(finish_reason),
            }],
            usage: Some(usage),
            meterline: None,
        }
    }
}

/// The fixed part of every chunk of one stream, and how to make each one.
#[derive(Debug, Clone)]
pub struct ChunkStream {
    pub id: String,
    pub created: i64,
    pub model: String,
    /// Whether the client asked for `stream_options.include_usage`.
    pub include_usage: bool,
}

impl ChunkStream {
    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: CHUNK_OBJECT.to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: self.include_usage.then_some(usage),
            meterline: None,
        }
    }

    /// A chunk with one token of content; `first` also carries the role.
    pub fn token(&self, text: &str, first: bool) -> ChatCompletionChunk {
        let delta = Delta {
            role: first.then(|| "assistant".to_owned()),
            content: Some(text.to_owned()),
            tool_calls: None,
        };
        self.chunk(
            vec![ChunkChoice {
                index: 0,
                delta,
                finish_reason: None,
            }],
            None,
        )
    }

    /// The chunk with an empty delta and the finish reason.
    pub fn finish(&self, reason: FinishReason) -> ChatCompletionChunk {
        self.chunk(
            vec![ChunkChoice {
                index: 0,
                delta: Delta::default(),
                finish_reason: Some(reason),
            }],
            None,
        )
    }

    /// The last chunk of `include_usage`: empty `choices`, the usage.
    pub fn usage(&self, usage: Usage) -> ChatCompletionChunk {
        self.chunk(Vec::new(), Some(usage))
    }
}

impl ChatCompletionChunk {
    /// The chunk as JSON text (one SSE `data:` line).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip<T: Serialize + for<'de> Deserialize<'de>>(sample: Value) {
        let parsed: T = serde_json::from_value(sample.clone()).unwrap();
        assert_eq!(serde_json::to_value(&parsed).unwrap(), sample);
    }

    #[test]
    fn openai_completion_with_tool_calls_round_trips() {
        round_trip::<ChatCompletion>(json!({
            "id": "chatcmpl-abc123",
            "object": "chat.completion",
            "created": 1_741_569_952,
            "model": "gpt-4.1-2025-04-14",
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": null,
                    "tool_calls": [{
                        "id": "call_abc123",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}
                    }]
                },
                "finish_reason": "tool_calls"
            }],
            "usage": {"prompt_tokens": 82, "completion_tokens": 17, "total_tokens": 99,
                      "prompt_tokens_details": {"cached_tokens": 0}}
        }));
    }

    #[test]
    fn stream_chunks_round_trip_with_and_without_usage() {
        round_trip::<ChatCompletionChunk>(json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": null}]
        }));
        round_trip::<ChatCompletionChunk>(json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21,
                      "prompt_tokens_details": {"cached_tokens": 0}}
        }));
    }

    #[test]
    fn with_include_usage_every_chunk_has_a_usage_key() {
        let stream = |include_usage| ChunkStream {
            id: "c".into(),
            created: 0,
            model: "m".into(),
            include_usage,
        };
        let with = serde_json::to_value(stream(true).token("a", true)).unwrap();
        assert_eq!(with["usage"], Value::Null);
        assert!(with.as_object().unwrap().contains_key("usage"));
        let without = serde_json::to_value(stream(false).token("a", true)).unwrap();
        assert!(!without.as_object().unwrap().contains_key("usage"));
        let last = serde_json::to_value(stream(true).usage(Usage::of_counts(3, 0, 1))).unwrap();
        assert_eq!(last["usage"]["total_tokens"], 4);
        assert_eq!(last["choices"], json!([]));
        let finish =
            serde_json::to_value(stream(true).finish(FinishReason::of_capped(false))).unwrap();
        assert_eq!(finish["choices"][0]["delta"], json!({}));
        assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    }
}
