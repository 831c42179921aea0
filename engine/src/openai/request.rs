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

/// Where a NUL was found: the top-level parameter and the exact path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NulField {
    /// The top-level field (OpenAI's `param`): `model` or `messages`.
    pub param: &'static str,
    /// The field itself, e.g. `messages[2].content`.
    pub path: String,
}

impl NulField {
    pub fn message(&self) -> String {
        serving::nul_message(&self.path)
    }
}

impl ChatRequest {
    /// The first field this server reads that holds a NUL.
    pub fn nul_field(&self) -> Option<NulField> {
        if self.model.contains('\0') {
            return Some(NulField {
                param: "model",
                path: "model".into(),
            });
        }
        self.messages
            .iter()
            .position(|m| m.content.contains('\0'))
            .map(|i| NulField {
                param: "messages",
                path: format!("messages[{i}].content"),
            })
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_is_found_in_the_model_or_a_message() {
        let parse = |body: &str| serde_json::from_str::<ChatRequest>(body).unwrap();
        let ok = parse(r#"{"model": "m", "messages": [{"content": "hi"}]}"#);
        assert_eq!(ok.nul_field(), None);
        let model = parse(r#"{"model": "m\u0000", "messages": [{"content": "hi"}]}"#);
        assert_eq!(model.nul_field().unwrap().param, "model");
        let second =
            parse(r#"{"model": "m", "messages": [{"content": "hi"}, {"content": "a\u0000b"}]}"#);
        assert_eq!(second.nul_field().unwrap().path, "messages[1].content");
    }
}
