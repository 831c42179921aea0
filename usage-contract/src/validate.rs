//! The rules an event must keep (v1, and v2's `placement`). Each broken rule is a [`Violation`]
//! with a stable code (stored in dead letters) and a message naming it.

use chrono::{DateTime, Duration, Utc};
use rust_decimal::Decimal;

use crate::event::{UsageEvent, GPU_SECONDS_SCALE, SCHEMA_V1, SCHEMA_VERSION};

/// More tokens than any context window we know of by an order of magnitude.
pub const MAX_TOKENS: i64 = 10_000_000;
/// One request on a frontier replica (8 GPUs) for a whole day.
pub const MAX_GPU_SECONDS: i64 = 8 * 86_400;
/// How far in the future an event time may lie before it is rejected.
pub const MAX_FUTURE: Duration = Duration::days(1);
const MAX_PRIORITY: i16 = 5;
/// Far more preemptions than one request could survive.
pub const MAX_PREEMPTIONS: i64 = 1_000;
const MAX_ID_LEN: usize = 200;

/// Why an event was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("message is not a JSON object: {0}")]
    Undecodable(String),
    #[error("schema_version {0} is not supported (this reader knows versions 1 and 2)")]
    UnknownSchemaVersion(i64),
    #[error("missing field `{0}`")]
    MissingField(String),
    #[error("invalid field: {0}")]
    InvalidField(String),
    #[error("{field} is {value}, which is negative")]
    NegativeCount { field: &'static str, value: String },
    #[error("{field} is {value}, above the limit of {limit}")]
    AbsurdCount {
        field: &'static str,
        value: String,
        limit: String,
    },
    #[error("cached_tokens ({cached}) exceeds prompt_tokens ({prompt})")]
    CachedExceedsPrompt { cached: i64, prompt: i64 },
    #[error("{field} has more than 6 decimal places (GPU time is exact to the microsecond)")]
    TooPrecise { field: &'static str },
    #[error("finished_at ({finished}) is before started_at ({started})")]
    FinishedBeforeStarted { started: String, finished: String },
    #[error("first_token_at ({first}) is outside started_at..finished_at")]
    FirstTokenOutOfRange { first: String },
    #[error("{field} ({at}) is more than a day in the future")]
    InFuture { field: &'static str, at: String },
    #[error("{field} is empty, longer than {MAX_ID_LEN} bytes, or holds control characters")]
    BadIdentifier { field: &'static str },
    #[error("priority {0} is outside 1..=5")]
    BadPriority(i16),
    #[error("tenant {0:?} is not known")]
    UnknownTenant(String),
    #[error("request_id already stored with different content")]
    Conflict,
    #[error("request from {0}, a day whose request_log partition was dropped; it can no longer be told from a re-send")]
    BeyondRetention(chrono::NaiveDate),
}

impl Violation {
    /// A stable, machine-readable code for dead letters and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Undecodable(_) => "undecodable",
            Self::UnknownSchemaVersion(_) => "unknown_schema_version",
            Self::MissingField(_) => "missing_field",
            Self::InvalidField(_) => "invalid_field",
            Self::NegativeCount { .. } => "negative_count",
            Self::AbsurdCount { .. } => "absurd_count",
            Self::CachedExceedsPrompt { .. } => "cached_exceeds_prompt",
            Self::TooPrecise { .. } => "too_precise",
            Self::FinishedBeforeStarted { .. } => "finished_before_started",
            Self::FirstTokenOutOfRange { .. } => "first_token_out_of_range",
            Self::InFuture { .. } => "in_future",
            Self::BadIdentifier { .. } => "bad_identifier",
            Self::BadPriority(_) => "bad_priority",
            Self::UnknownTenant(_) => "unknown_tenant",
            Self::Conflict => "conflict",
            Self::BeyondRetention(_) => "beyond_retention",
        }
    }
}

impl UsageEvent {
    /// Checks every rule of contract v1 against the clock `now`; returns the
    /// first rule broken.
    pub fn validate(&self, now: DateTime<Utc>) -> Result<(), Violation> {
        match (self.schema_version, &self.placement) {
            (SCHEMA_V1, None) => {}
            (SCHEMA_V1, Some(_)) => {
                return Err(Violation::InvalidField(
                    "placement is a schema_version 2 field; a version 1 event has none".into(),
                ))
            }
            (SCHEMA_VERSION, None) => return Err(Violation::MissingField("placement".into())),
            (SCHEMA_VERSION, Some(p)) => {
                let owner = p.dedicated_to.as_ref();
                for (field, value) in [
                    ("placement.pool", Some(&p.pool)),
                    ("placement.dedicated_to", owner),
                ] {
                    if let Some(value) = value {
                        check_identifier(field, value)?;
                    }
                }
                check_count(
                    "placement.queue_wait_ms",
                    p.queue_wait_ms,
                    MAX_FUTURE.num_milliseconds(),
                )?;
                check_count("placement.preemptions", p.preemptions, MAX_PREEMPTIONS)?;
            }
            (other, _) => return Err(Violation::UnknownSchemaVersion(other.into())),
        }
        for (field, value) in [
            ("tenant_id", &self.tenant_id),
            ("api_key_id", &self.api_key_id),
            ("model", &self.model),
            ("model_version", &self.model_version),
            ("replica_id", &self.replica_id),
            ("gateway_id", &self.gateway_id),
        ] {
            check_identifier(field, value)?;
        }
        if !(1..=MAX_PRIORITY).contains(&self.priority) {
            return Err(Violation::BadPriority(self.priority));
        }
        for (field, value) in [
            ("prompt_tokens", self.prompt_tokens),
            ("cached_tokens", self.cached_tokens),
            ("completion_tokens", self.completion_tokens),
        ] {
            check_count(field, value, MAX_TOKENS)?;
        }
        for (field, value) in [("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms)] {
            if let Some(value) = value {
                check_count(field, value, MAX_FUTURE.num_milliseconds())?;
            }
        }
        if self.cached_tokens > self.prompt_tokens {
            return Err(Violation::CachedExceedsPrompt {
                cached: self.cached_tokens,
                prompt: self.prompt_tokens,
            });
        }
        for (field, value) in [
            ("gpu_seconds", self.gpu_seconds),
            ("preempted_gpu_seconds", self.preempted_gpu_seconds),
        ] {
            check_gpu_seconds(field, value)?;
        }
        if self.finished_at < self.started_at {
            return Err(Violation::FinishedBeforeStarted {
                started: self.started_at.to_rfc3339(),
                finished: self.finished_at.to_rfc3339(),
            });
        }
        if let Some(first) = self.first_token_at {
            if first < self.started_at || first > self.finished_at {
                return Err(Violation::FirstTokenOutOfRange {
                    first: first.to_rfc3339(),
                });
            }
        }
        let horizon = now + MAX_FUTURE;
        for (field, at) in [
            ("started_at", self.started_at),
            ("finished_at", self.finished_at),
            ("request_id", self.request_id.created_at()),
        ] {
            if at > horizon {
                return Err(Violation::InFuture {
                    field,
                    at: at.to_rfc3339(),
                });
            }
        }
        Ok(())
    }
}

pub(crate) fn check_identifier(field: &'static str, value: &str) -> Result<(), Violation> {
    if value.is_empty() || value.len() > MAX_ID_LEN || value.chars().any(char::is_control) {
        return Err(Violation::BadIdentifier { field });
    }
    Ok(())
}

fn check_count(field: &'static str, value: i64, limit: i64) -> Result<(), Violation> {
    if value < 0 {
        return Err(Violation::NegativeCount {
            field,
            value: value.to_string(),
        });
    }
    if value > limit {
        return Err(Violation::AbsurdCount {
            field,
            value: value.to_string(),
            limit: limit.to_string(),
        });
    }
    Ok(())
}

fn check_gpu_seconds(field: &'static str, value: Decimal) -> Result<(), Violation> {
    if value.is_sign_negative() && !value.is_zero() {
        return Err(Violation::NegativeCount {
            field,
            value: value.to_string(),
        });
    }
    if value > Decimal::from(MAX_GPU_SECONDS) {
        return Err(Violation::AbsurdCount {
            field,
            value: value.to_string(),
            limit: MAX_GPU_SECONDS.to_string(),
        });
    }
    if value.normalize().scale() > GPU_SECONDS_SCALE {
        return Err(Violation::TooPrecise { field });
    }
    Ok(())
}
