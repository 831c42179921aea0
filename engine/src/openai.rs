//! The OpenAI chat-completions request as it arrives on the wire, shared by
//! the engine's own server and the gateway so both read it the same way.
//! Fields Meterline does not use (temperature, tools, …) are accepted and
//! ignored, as OpenAI-compatible servers do.

use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub seed: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// One chat message; the simulator reads only its text.
#[derive(Debug, Deserialize)]
pub struct Message {
    pub content: String,
}

impl ChatRequest {
    /// The messages flattened into the prompt the engine sees.
    pub fn prompt(&self) -> String {
        self.messages
            .iter()
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The output cap asked for: `max_completion_tokens`, else `max_tokens`.
    pub fn max_output(&self) -> Option<u32> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    /// Whether the last streamed chunk should carry `usage`.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}
