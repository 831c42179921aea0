//! OpenAI's error body, `{"error": {"message", "type", "param", "code"}}`:
//! the answer to a failed request and the last data frame of a stream that
//! failed. `param` and `code` are always present, `null` when they do not
//! apply, as OpenAI sends them.

use serde::{Deserialize, Serialize};

/// The message of every 5xx whose details go to the log only.
pub const GENERIC_SERVER_ERROR: &str = "the server had an error while processing your request";

/// OpenAI's `type` values Meterline answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidRequest,
    Server,
    Timeout,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request_error",
            Self::Server => "server_error",
            Self::Timeout => "timeout",
        }
    }
}

/// The whole body: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ApiError,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `server_error`, or for a
    /// rate limit the limit's own name.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The request parameter (field, header) at fault.
    #[serde(default)]
    pub param: Option<String>,
    #[serde(default)]
    pub code: Option<String>,
}

impl ErrorBody {
    pub fn new(
        message: impl Into<String>,
        kind: impl Into<String>,
        param: Option<&str>,
        code: Option<&str>,
    ) -> Self {
        Self {
            error: ApiError {
                message: message.into(),
                kind: kind.into(),
                param: param.map(str::to_owned),
                code: code.map(str::to_owned),
            },
        }
    }

    /// A 5xx whose details are in the log, not in the answer.
    pub fn server_error() -> Self {
        Self::new(GENERIC_SERVER_ERROR, ErrorKind::Server.as_str(), None, None)
    }

    /// The body as JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_always_carries_param_and_code() {
        let body = ErrorBody::new("bad n", "invalid_request_error", Some("n"), None);
        let v: serde_json::Value = serde_json::from_str(&body.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {"message": "bad n", "type": "invalid_request_error", "param": "n", "code": null}})
        );
        let openai = r#"{"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}"#;
        let parsed: ErrorBody = serde_json::from_str(openai).unwrap();
        assert_eq!(parsed.error.code.as_deref(), Some("invalid_api_key"));
        assert_eq!(
            serde_json::to_value(&parsed).unwrap(),
            serde_json::from_str::<serde_json::Value>(openai).unwrap()
        );
    }
}
