//! Bytes from the topic → a validated record (a usage event, or a replica
//! report), or the [`Violation`] that says why not. The happy path parses
//! once; only bad input and the rare replica report are looked at twice.

use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::replica_report::{ReplicaReport, RECORD_KIND};
use crate::{UsageEvent, Violation, SCHEMA_V1, SCHEMA_VERSION};

/// What a message on the usage topic is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Usage(UsageEvent),
    Replica(ReplicaReport),
}

/// Decodes and validates one message, of either kind: a JSON object with
/// `"record": "replica_report"` is a replica report, anything else must be
/// a usage event.
pub fn decode_record(bytes: &[u8], now: DateTime<Utc>) -> Result<Record, Violation> {
    match serde_json::from_slice::<UsageEvent>(bytes) {
        Ok(event) => {
            event.validate(now)?;
            Ok(Record::Usage(event))
        }
        Err(err) => {
            #[derive(Deserialize)]
            struct Kind<'a> {
                #[serde(borrow)]
                record: Option<std::borrow::Cow<'a, str>>,
            }
            match serde_json::from_slice::<Kind>(bytes) {
                Ok(Kind { record: Some(kind) }) if kind == RECORD_KIND => {
                    let report: ReplicaReport =
                        serde_json::from_slice(bytes).map_err(explain_report)?;
                    report.validate(now)?;
                    Ok(Record::Replica(report))
                }
                _ => Err(explain(bytes, err)),
            }
        }
    }
}

fn explain_report(err: serde_json::Error) -> Violation {
    let text = err.to_string();
    match text
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
    {
        Some(field) => Violation::MissingField(field.to_owned()),
        None => Violation::InvalidField(text),
    }
}

/// Decodes and validates one usage event (a replica report is refused).
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
        Some(serde_json::Value::Number(n))
            if n.as_i64() != Some(SCHEMA_VERSION.into())
                && n.as_i64() != Some(SCHEMA_V1.into()) =>
        {
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
