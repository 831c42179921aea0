//! Bytes from the topic → a validated event, or the [`Violation`] that says
//! why not. The happy path parses once; only bad input is looked at twice,
//! to name what is wrong with it.

use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::{UsageEvent, Violation, SCHEMA_VERSION};

/// Decodes and validates one message payload.
pub fn decode(bytes: &[u8], now: DateTime<Utc>) -> Result<UsageEvent, Violation> {
    match serde_json::from_slice::<UsageEvent>(bytes) {
        Ok(event) => {
            event.validate(now)?;
            Ok(event)
        }
        Err(err) => Err(explain(bytes, err)),
    }
}

/// Turns a serde error into the most specific violation: an unknown schema
/// version wins over everything else, because a v2 event is not "malformed".
fn explain(bytes: &[u8], err: serde_json::Error) -> Violation {
    #[derive(Deserialize)]
    struct Envelope {
        schema_version: Option<serde_json::Value>,
    }
    let Ok(envelope) = serde_json::from_slice::<Envelope>(bytes) else {
        return Violation::Undecodable(err.to_string());
    };
    match envelope.schema_version {
        Some(serde_json::Value::Number(n)) if n.as_i64() != Some(SCHEMA_VERSION.into()) => {
            return Violation::UnknownSchemaVersion(n.as_i64().unwrap_or(-1));
        }
        None => return Violation::MissingField("schema_version".into()),
        _ => {}
    }
    let text = err.to_string();
    match text
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
    {
        Some(field) => Violation::MissingField(field.to_owned()),
        None => Violation::InvalidField(text),
    }
}
