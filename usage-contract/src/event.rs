//! The usage event, exactly as it travels on the topic: contract v2, which
//! adds where and how the fleet ran the request ([`Placement`]), and v1,
//! which readers keep accepting (a v1 event has no `placement`).

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::RequestId;

/// The schema version the gateway writes. Readers accept it and
/// [`SCHEMA_V1`].
pub const SCHEMA_VERSION: u32 = 2;

/// The first contract: every field but `placement`.
pub const SCHEMA_V1: u32 = 1;

/// GPU time is exact to the microsecond: at most six decimal places.
pub const GPU_SECONDS_SCALE: u32 = 6;

/// One admitted request's usage. Counts are `i64` on the wire so that a
/// negative count decodes and is then rejected by a named rule, not by an
/// opaque parse error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageEvent {
    pub schema_version: u32,
    pub request_id: RequestId,
    pub tenant_id: String,
    pub api_key_id: String,
    pub model: String,
    pub model_version: String,
    /// 1 lowest … 5 highest: the tenant's tier at request time.
    pub priority: i16,
    #[serde(with = "millis")]
    pub started_at: DateTime<Utc>,
    #[serde(default, with = "millis_opt", skip_serializing_if = "Option::is_none")]
    pub first_token_at: Option<DateTime<Utc>>,
    #[serde(with = "millis")]
    pub finished_at: DateTime<Utc>,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    /// Tokens actually produced, also when the client went away.
    pub completion_tokens: i64,
    /// A decimal string such as `"0.412345"`, never a float.
    #[serde(with = "rust_decimal::serde::str")]
    pub gpu_seconds: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub preempted_gpu_seconds: Decimal,
    pub finish_reason: FinishReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_ms: Option<i64>,
    pub replica_id: String,
    pub gateway_id: String,
    pub stream: bool,
    /// What the fleet layer did with the request: required in v2, absent
    /// in v1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// Where and how the fleet ran a request (contract v2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// The replica pool that served it: the model's pool.
    pub pool: String,
    /// The tenant owning the replica it ran on, when that replica is
    /// dedicated (the owner itself, or a borrower of a lent replica).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedicated_to: Option<String>,
    /// How long it waited in the pool's fair queue before a replica took
    /// it, in the engine's time (as `ttft_ms`).
    pub queue_wait_ms: i64,
    /// How often a replica preempted it (its thrown-away GPU time is
    /// `preempted_gpu_seconds`).
    pub preemptions: i64,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    Cancelled,
    Error,
}

impl FinishReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Cancelled => "cancelled",
            Self::Error => "error",
        }
    }

    /// The reason named `text` ([`as_str`](Self::as_str)'s inverse).
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Stop, Self::Length, Self::Cancelled, Self::Error]
            .into_iter()
            .find(|r| r.as_str() == text)
    }
}

impl UsageEvent {
    /// The canonical JSON bytes: what the gateway publishes and what the
    /// content hash covers.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// [`to_json`](Self::to_json) as text, for a text column or a log line.
    pub fn to_json_string(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// SHA-256 of the canonical form. Two versions of one `request_id` with
    /// the same hash are a duplicate; with different hashes, a conflict.
    pub fn content_hash(&self) -> [u8; 32] {
        Sha256::digest(self.to_json()).into()
    }
}

/// Timestamps travel as RFC 3339 UTC with milliseconds: `2026-11-29T18:20:21.123Z`.
pub(crate) mod millis {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&t.to_rfc3339_opts(SecondsFormat::Millis, true))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| serde::de::Error::custom(format!("{text:?} is not an RFC 3339 time: {e}")))
    }
}

mod millis_opt {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => super::millis::serialize(t, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "super::millis")] DateTime<Utc>);
        Ok(Option::<Wrapped>::deserialize(d)?.map(|Wrapped(t)| t))
    }
}
