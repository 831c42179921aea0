//! The OpenAI chat-completions request as it arrives on the wire, shared by
//! the engine's own server and the gateway so both read it the same way.
//! Fields Meterline does not use (temperature, tools, …) are accepted and
//! ignored, as OpenAI-compatible servers do.
//!
//! Both servers also refuse a NUL character (U+0000) in what they read —
//! the model, a message's content, a query parameter — with a 400 naming
//! it ([`ChatRequest::nul_field`], [`nul_query_param`]): no identifier or
//! prompt of theirs can hold one, and Postgres refuses it in text.

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
        nul_message(&self.path)
    }
}

/// The message for a field or parameter that holds a NUL.
pub fn nul_message(name: &str) -> String {
    format!("`{name}` contains a NUL character (U+0000), which is never valid here")
}

/// The first query parameter (by name) whose decoded name or value holds a
/// NUL; a query that does not decode as UTF-8 is reported as `Err` with
/// axum's message.
pub fn nul_query_param(uri: &axum::http::Uri) -> Result<Option<String>, String> {
    let axum::extract::Query(pairs) =
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map_err(|e| e.body_text())?;
    Ok(pairs
        .into_iter()
        .find(|(k, v)| k.contains('\0') || v.contains('\0'))
        .map(|(k, _)| k))
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

    #[test]
    fn a_nul_in_the_query_is_named() {
        let uri = |s: &str| s.parse::<axum::http::Uri>().unwrap();
        assert_eq!(
            nul_query_param(&uri("/v1/models?a=1&b=x%00")),
            Ok(Some("b".into()))
        );
        assert_eq!(nul_query_param(&uri("/v1/models?a=1")), Ok(None));
        assert_eq!(nul_query_param(&uri("/v1/models")), Ok(None));
    }
}
