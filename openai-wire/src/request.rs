//! The OpenAI chat-completions request as it arrives on the wire, shared by
//! the engine's own server and the gateway so both read it the same way.
//!
//! Everything OpenAI's API accepts in a chat request parses: message
//! `content` as a string, an array of content parts (`text`, `image_url`,
//! `input_audio`) or `null` beside `tool_calls`; the roles `system`,
//! `developer`, `user`, `assistant` and `tool` (with `tool_call_id`); and
//! `n`, `stop`, `logprobs`, `top_logprobs`, `response_format`, `tools`,
//! `tool_choice`, `user`, `seed`, `temperature`, `top_p`, `modalities`,
//! `audio`. Unknown fields are accepted and ignored (an HTTP upstream still
//! gets them: it is sent the client's own body).
//!
//! The simulator reads only the prompt ([`ChatRequest::prompt`]); what it
//! cannot do it refuses rather than ignores (the engine's
//! `wire::unsupported_by_simulator`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What an `image_url` content part costs the simulator, in prompt tokens,
/// whatever the image: OpenAI's price of a `low`-detail image (85 tokens).
pub const IMAGE_PART_TOKENS: u64 = 85;
/// What an `input_audio` content part costs the simulator, in prompt
/// tokens, whatever the clip: 10 s at OpenAI's audio input rate of about
/// 10 tokens a second.
pub const AUDIO_PART_TOKENS: u64 = 100;

/// Text standing for an image or an audio clip in the simulator's prompt:
/// `word` (one cl100k token with its leading space) `tokens` times.
fn placeholder(word: &str, tokens: u64) -> String {
    word.repeat(tokens as usize)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    /// Read through [`ChatRequest::streams`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Choices to generate; the simulator makes one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Tool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Accepted; the simulator is deterministic per seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Accepted; the simulator is deterministic per seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    /// Output modalities: `["text"]`, `["text", "audio"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modalities: Option<Vec<String>>,
    /// Audio output settings (`voice`, `format`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    /// `None` (`null` or absent) only beside an assistant's `tool_calls`.
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// A `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text { text: String },
    ImageUrl { image_url: ImageUrl },
    InputAudio { input_audio: InputAudio },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageUrl {
    /// An `https://` URL or a `data:` URL.
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputAudio {
    /// Base64.
    pub data: String,
    /// `wav` or `mp3`.
    pub format: String,
}

/// A tool call the assistant made, sent back in the conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text, as the model wrote it.
    pub arguments: String,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDefinition,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDefinition {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    /// `none`, `auto`, `required`.
    Mode(ToolChoiceMode),
    /// `{"type": "function", "function": {"name": ...}}`.
    Named(NamedToolChoice),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoiceMode {
    None,
    Auto,
    Required,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: NamedFunction,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedFunction {
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: Value },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// A request parameter the server refuses, with OpenAI's `param`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The top-level field at fault (OpenAI's `param`).
    pub param: &'static str,
    pub message: String,
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

impl Message {
    /// The texts of this message with where each sits, e.g.
    /// `messages[1].content[0].text`.
    fn texts(&self, i: usize) -> Vec<(String, &str)> {
        match &self.content {
            None => Vec::new(),
            Some(Content::Text(t)) => vec![(format!("messages[{i}].content"), t.as_str())],
            Some(Content::Parts(parts)) => parts
                .iter()
                .enumerate()
                .filter_map(|(j, p)| match p {
                    ContentPart::Text { text } => {
                        Some((format!("messages[{i}].content[{j}].text"), text.as_str()))
                    }
                    ContentPart::ImageUrl { .. } | ContentPart::InputAudio { .. } => None,
                })
                .collect(),
        }
    }

    /// What the simulator sees of this message: its text, each image and
    /// audio part as placeholder text of its fixed token cost, and the
    /// tool calls' names and arguments.
    fn prompt_text(&self) -> String {
        let mut pieces: Vec<String> = match &self.content {
            None => Vec::new(),
            Some(Content::Text(t)) => vec![t.clone()],
            Some(Content::Parts(parts)) => parts
                .iter()
                .map(|p| match p {
                    ContentPart::Text { text } => text.clone(),
                    ContentPart::ImageUrl { .. } => placeholder(" image", IMAGE_PART_TOKENS),
                    ContentPart::InputAudio { .. } => placeholder(" audio", AUDIO_PART_TOKENS),
                })
                .collect(),
        };
        for call in self.tool_calls.iter().flatten() {
            pieces.push(format!(
                "{} {}",
                call.function.name, call.function.arguments
            ));
        }
        pieces.join("\n")
    }
}

impl ChatRequest {
    /// Whether the answer is streamed as SSE.
    pub fn streams(&self) -> bool {
        self.stream.unwrap_or(false)
    }

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
            .enumerate()
            .flat_map(|(i, m)| m.texts(i))
            .find(|(_, text)| text.contains('\0'))
            .map(|(path, _)| NulField {
                param: "messages",
                path,
            })
    }

    /// What OpenAI refuses in any request: no messages, a message without
    /// content that is not an assistant's tool calls, a `tool` message
    /// without `tool_call_id`, an output cap of 0 (it would bill a prompt
    /// for an empty answer), `stream_options` without `stream: true`.
    pub fn invalid(&self) -> Option<Invalid> {
        if self.messages.is_empty() {
            return Some(Invalid {
                param: "messages",
                message: "messages must contain at least one message".into(),
            });
        }
        for (param, cap) in [
            ("max_tokens", self.max_tokens),
            ("max_completion_tokens", self.max_completion_tokens),
        ] {
            if cap == Some(0) {
                return Some(Invalid {
                    param,
                    message: format!("{param} must be at least 1 (got 0)"),
                });
            }
        }
        if self.stream_options.is_some() && self.stream != Some(true) {
            return Some(Invalid {
                param: "stream_options",
                message: "stream_options is only allowed when stream is true".into(),
            });
        }
        self.messages.iter().enumerate().find_map(|(i, m)| {
            let calls = m.tool_calls.as_ref().is_some_and(|c| !c.is_empty());
            let message = if m.content.is_none() && !(m.role == Role::Assistant && calls) {
                format!(
                    "messages[{i}].content must be set, unless an assistant message has tool_calls"
                )
            } else if m.role == Role::Tool && m.tool_call_id.is_none() {
                format!("messages[{i}] has role tool but no tool_call_id")
            } else {
                return None;
            };
            Some(Invalid {
                param: "messages",
                message,
            })
        })
    }

    /// The messages flattened into the prompt the engine sees.
    pub fn prompt(&self) -> String {
        self.messages
            .iter()
            .map(Message::prompt_text)
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
    use serde_json::json;

    fn parse(body: &str) -> ChatRequest {
        serde_json::from_str(body).unwrap()
    }

    /// Parsed and written back, an OpenAI-shaped request is unchanged.
    fn round_trip(sample: Value) -> ChatRequest {
        let req: ChatRequest = serde_json::from_value(sample.clone()).unwrap();
        assert_eq!(serde_json::to_value(&req).unwrap(), sample);
        req
    }

    #[test]
    fn a_nul_is_found_in_the_model_or_a_message() {
        let ok = parse(r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#);
        assert_eq!(ok.nul_field(), None);
        let model =
            parse(r#"{"model": "m\u0000", "messages": [{"role": "user", "content": "hi"}]}"#);
        assert_eq!(model.nul_field().unwrap().param, "model");
        let second = parse(
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "a\u0000b"}]}"#,
        );
        assert_eq!(second.nul_field().unwrap().path, "messages[1].content");
        let part = parse(
            r#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a\u0000"}]}]}"#,
        );
        assert_eq!(
            part.nul_field().unwrap().path,
            "messages[0].content[0].text"
        );
    }

    #[test]
    fn content_parts_round_trip() {
        let req = round_trip(json!({
            "model": "gpt-4o",
            "messages": [
                {"role": "developer", "content": "Answer briefly."},
                {"role": "user", "content": [
                    {"type": "text", "text": "What is in this image, and what is said?"},
                    {"type": "image_url", "image_url": {"url": "https://upload.wikimedia.org/boardwalk.jpg", "detail": "low"}},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                    {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZF", "format": "wav"}}
                ]}
            ],
            "max_completion_tokens": 300,
            "temperature": 0.2,
            "top_p": 0.9,
            "seed": 42,
            "user": "user-1234",
            "stop": ["\n\n", "END"],
            "n": 1
        }));
        assert!(matches!(&req.messages[1].content, Some(Content::Parts(p)) if p.len() == 4));
        assert_eq!(req.invalid(), None);
    }

    #[test]
    fn tool_calls_and_tool_messages_round_trip() {
        let req = round_trip(json!({
            "model": "gpt-4.1",
            "messages": [
                {"role": "system", "content": "You are a weather bot."},
                {"role": "user", "content": "What's the weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [{
                    "id": "call_abc123", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}
                }]},
                {"role": "tool", "tool_call_id": "call_abc123", "content": "{\"temperature_c\": 14}"}
            ],
            "tools": [{"type": "function", "function": {
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
                "strict": true
            }}],
            "tool_choice": "auto",
            "parallel_tool_calls": false,
            "response_format": {"type": "json_object"},
            "stop": "END",
            "logprobs": false,
            "stream": true,
            "stream_options": {"include_usage": true}
        }));
        assert_eq!(req.invalid(), None);
        assert!(req.streams() && req.include_usage());
        assert!(req
            .prompt()
            .contains("get_weather {\"location\":\"Paris\"}"));
    }

    #[test]
    fn null_content_without_tool_calls_and_tool_without_id_are_invalid() {
        let null = parse(r#"{"model": "m", "messages": [{"role": "user", "content": null}]}"#);
        assert_eq!(null.invalid().unwrap().param, "messages");
        let tool = parse(r#"{"model": "m", "messages": [{"role": "tool", "content": "x"}]}"#);
        assert!(tool.invalid().unwrap().message.contains("tool_call_id"));
        let empty = parse(r#"{"model": "m", "messages": []}"#);
        assert_eq!(empty.invalid().unwrap().param, "messages");
    }

    #[test]
    fn a_zero_output_cap_and_stream_options_without_stream_are_invalid() {
        let with = |extra: serde_json::Value| {
            let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            parse(&body.to_string()).invalid().map(|bad| bad.param)
        };
        assert_eq!(with(json!({"max_tokens": 0})), Some("max_tokens"));
        assert_eq!(
            with(json!({"max_completion_tokens": 0})),
            Some("max_completion_tokens")
        );
        assert_eq!(with(json!({"max_tokens": 1})), None);
        let options = json!({"include_usage": true});
        assert_eq!(
            with(json!({"stream_options": options})),
            Some("stream_options")
        );
        assert_eq!(
            with(json!({"stream": false, "stream_options": options})),
            Some("stream_options")
        );
        assert_eq!(
            with(json!({"stream": true, "stream_options": options})),
            None
        );
        assert_eq!(with(json!({"stream": false, "stream_options": null})), None);
    }
}
