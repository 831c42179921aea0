//! A request as `request_log` stores it, and the one way back from such a
//! row to the contract event it was stored from.
//!
//! The row keeps every field of the event in its column type, with two
//! differences from the event: GPU-seconds are `numeric(20, 6)`, so the
//! event's own decimal scale is not kept (`"0.50874"` and `"0.508740"` are
//! stored alike, while their canonical JSON and so their content hash
//! differ), and times are microsecond timestamps (the contract's JSON
//! carries milliseconds). The row's `content_hash`, the SHA-256 of the
//! event's canonical JSON, says which scale the event had:
//! [`StoredRequest::to_event`] returns the event whose canonical JSON
//! hashes to it, so `to_event()?.to_json()` is, byte for byte, the JSON
//! that was hashed when the row was stored.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use rust_decimal::Decimal;
use uuid::Uuid;

use crate::request_id::InvalidRequestId;
use crate::{FinishReason, Placement, RequestId, UsageEvent, SCHEMA_V1, SCHEMA_VERSION};

/// One `request_log` row: the stored event's columns and its content hash.
/// With feature `sqlx` it reads straight from a query selecting these
/// columns by name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct StoredRequest {
    pub request_id: Uuid,
    pub tenant_id: String,
    pub api_key_id: String,
    pub model: String,
    pub model_version: String,
    pub priority: i16,
    pub started_at: DateTime<Utc>,
    pub first_token_at: Option<DateTime<Utc>>,
    pub finished_at: DateTime<Utc>,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    pub gpu_seconds: Decimal,
    pub preempted_gpu_seconds: Decimal,
    pub finish_reason: String,
    pub ttft_ms: Option<i64>,
    pub tpot_ms: Option<i64>,
    pub replica_id: String,
    pub gateway_id: String,
    pub stream: bool,
    /// The v2 placement's fields; all NULL on a row from a v1 event.
    pub pool: Option<String>,
    pub dedicated_to: Option<String>,
    pub queue_wait_ms: Option<i64>,
    pub preemptions: Option<i64>,
    /// SHA-256 of the event's canonical JSON ([`UsageEvent::content_hash`]).
    pub content_hash: Vec<u8>,
}

/// Why a stored row is not a contract event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoredRequestError {
    #[error(transparent)]
    RequestId(#[from] InvalidRequestId),
    #[error("finish_reason {0:?} is not one of stop, length, cancelled, error")]
    FinishReason(String),
    #[error(
        "no decimal scale of gpu_seconds {gpu_seconds} and preempted_gpu_seconds \
         {preempted_gpu_seconds} gives an event with the stored content hash"
    )]
    HashMismatch {
        gpu_seconds: Decimal,
        preempted_gpu_seconds: Decimal,
    },
}

impl StoredRequest {
    /// The contract event this row was stored from: the one whose canonical
    /// JSON has the stored content hash. Fails when the row holds something
    /// no contract event could have (a finish reason outside the contract, an id
    /// that is not a UUIDv7) or when no event rebuilt from it has its hash
    /// (the row was not written from a contract event).
    pub fn to_event(&self) -> Result<UsageEvent, StoredRequestError> {
        // A v2 event always has a placement, a v1 event never.
        let placement = match (&self.pool, self.queue_wait_ms, self.preemptions) {
            (Some(pool), Some(queue_wait_ms), Some(preemptions)) => Some(Placement {
                pool: pool.clone(),
                dedicated_to: self.dedicated_to.clone(),
                queue_wait_ms,
                preemptions,
            }),
            _ => None,
        };
        let mut event = UsageEvent {
            schema_version: if placement.is_some() {
                SCHEMA_VERSION
            } else {
                SCHEMA_V1
            },
            request_id: RequestId::from_uuid(self.request_id)?,
            tenant_id: self.tenant_id.clone(),
            api_key_id: self.api_key_id.clone(),
            model: self.model.clone(),
            model_version: self.model_version.clone(),
            priority: self.priority,
            started_at: millis(self.started_at),
            first_token_at: self.first_token_at.map(millis),
            finished_at: millis(self.finished_at),
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            completion_tokens: self.completion_tokens,
            gpu_seconds: self.gpu_seconds,
            preempted_gpu_seconds: self.preempted_gpu_seconds,
            finish_reason: FinishReason::parse(&self.finish_reason)
                .ok_or_else(|| StoredRequestError::FinishReason(self.finish_reason.clone()))?,
            ttft_ms: self.ttft_ms,
            tpot_ms: self.tpot_ms,
            replica_id: self.replica_id.clone(),
            gateway_id: self.gateway_id.clone(),
            stream: self.stream,
            placement,
        };
        for gpu in scales(self.gpu_seconds) {
            for preempted in scales(self.preempted_gpu_seconds) {
                event.gpu_seconds = gpu;
                event.preempted_gpu_seconds = preempted;
                if event.content_hash().as_slice() == self.content_hash.as_slice() {
                    return Ok(event);
                }
            }
        }
        Err(StoredRequestError::HashMismatch {
            gpu_seconds: self.gpu_seconds,
            preempted_gpu_seconds: self.preempted_gpu_seconds,
        })
    }
}

/// The contract's time precision.
fn millis(t: DateTime<Utc>) -> DateTime<Utc> {
    // Truncating a valid UTC time to the millisecond cannot overflow.
    t.duration_trunc(TimeDelta::milliseconds(1)).unwrap_or(t)
}

/// The renderings of a stored decimal an event may have had, most likely
/// first: the column's six places (what Meterline's own engines emit), the
/// fewest places that hold the value, then every other scale up to
/// [`Decimal::MAX_SCALE`] (trailing zeros beyond six places keep the
/// contract's rule, which counts significant places).
fn scales(stored: Decimal) -> Vec<Decimal> {
    let shortest = stored.normalize().scale();
    let mut out: Vec<Decimal> = Vec::new();
    for scale in [crate::GPU_SECONDS_SCALE, shortest]
        .into_iter()
        .chain(shortest..=Decimal::MAX_SCALE)
    {
        let mut d = stored;
        d.rescale(scale);
        // A scale the mantissa cannot hold comes back as a smaller one.
        if d == stored && !out.iter().any(|o| o.scale() == d.scale()) {
            out.push(d);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn event(gpu: Decimal, preempted: Decimal) -> UsageEvent {
        let started = Utc
            .with_ymd_and_hms(2026, 11, 29, 10, 0, 0)
            .unwrap()
            .checked_add_signed(TimeDelta::milliseconds(123))
            .unwrap();
        UsageEvent {
            schema_version: 1,
            request_id: RequestId::at(started),
            tenant_id: "acme-corp".into(),
            api_key_id: "key-1".into(),
            model: "llama-3.1-8b".into(),
            model_version: "3.1".into(),
            priority: 3,
            started_at: started,
            first_token_at: Some(started + TimeDelta::milliseconds(40)),
            finished_at: started + TimeDelta::milliseconds(900),
            prompt_tokens: 120,
            cached_tokens: 64,
            completion_tokens: 33,
            gpu_seconds: gpu,
            preempted_gpu_seconds: preempted,
            finish_reason: FinishReason::Length,
            ttft_ms: Some(40),
            tpot_ms: None,
            replica_id: "sim-0".into(),
            gateway_id: "gw-1".into(),
            stream: true,
            placement: None,
        }
    }

    /// What request_log keeps of an event: numeric(20, 6), microseconds.
    fn stored(e: &UsageEvent) -> StoredRequest {
        let six = |d: Decimal| {
            let mut d = d;
            d.rescale(6);
            d
        };
        StoredRequest {
            request_id: e.request_id.as_uuid(),
            tenant_id: e.tenant_id.clone(),
            api_key_id: e.api_key_id.clone(),
            model: e.model.clone(),
            model_version: e.model_version.clone(),
            priority: e.priority,
            started_at: e.started_at,
            first_token_at: e.first_token_at,
            finished_at: e.finished_at,
            prompt_tokens: e.prompt_tokens,
            cached_tokens: e.cached_tokens,
            completion_tokens: e.completion_tokens,
            gpu_seconds: six(e.gpu_seconds),
            preempted_gpu_seconds: six(e.preempted_gpu_seconds),
            finish_reason: e.finish_reason.as_str().to_owned(),
            ttft_ms: e.ttft_ms,
            tpot_ms: e.tpot_ms,
            replica_id: e.replica_id.clone(),
            gateway_id: e.gateway_id.clone(),
            stream: e.stream,
            pool: e.placement.as_ref().map(|p| p.pool.clone()),
            dedicated_to: e.placement.as_ref().and_then(|p| p.dedicated_to.clone()),
            queue_wait_ms: e.placement.as_ref().map(|p| p.queue_wait_ms),
            preemptions: e.placement.as_ref().map(|p| p.preemptions),
            content_hash: e.content_hash().to_vec(),
        }
    }

    #[test]
    fn a_v2_row_gives_back_its_placement_and_a_v1_row_none() {
        let v1 = event(Decimal::new(5, 1), Decimal::ZERO);
        assert_eq!(stored(&v1).to_event().unwrap(), v1);
        let mut v2 = v1.clone();
        v2.schema_version = crate::SCHEMA_VERSION;
        v2.placement = Some(Placement {
            pool: "llama-3.1-8b".into(),
            dedicated_to: Some("acme-corp".into()),
            queue_wait_ms: 12,
            preemptions: 1,
        });
        let back = stored(&v2).to_event().unwrap();
        assert_eq!(back, v2);
        assert_eq!(back.to_json(), v2.to_json());
    }

    #[test]
    fn a_stored_row_gives_back_the_canonical_json_it_was_hashed_from() {
        for (gpu, preempted) in [
            (Decimal::new(508_740, 6), Decimal::new(0, 6)),
            (Decimal::new(50_874, 5), Decimal::ZERO),
            (Decimal::new(5, 1), Decimal::new(2_500, 4)),
            (Decimal::new(10_000_000, 7), Decimal::new(1, 6)),
        ] {
            let original = event(gpu, preempted);
            let back = stored(&original).to_event().unwrap();
            assert_eq!(back.to_json(), original.to_json());
            assert_eq!(back, original);
        }
    }

    #[test]
    fn a_row_that_no_event_hashes_to_is_refused() {
        let mut row = stored(&event(Decimal::new(1, 1), Decimal::ZERO));
        row.completion_tokens += 1;
        assert!(matches!(
            row.to_event(),
            Err(StoredRequestError::HashMismatch { .. })
        ));
        row.finish_reason = "done".into();
        assert_eq!(
            row.to_event(),
            Err(StoredRequestError::FinishReason("done".into()))
        );
    }

    #[test]
    fn times_come_back_at_the_contracts_millisecond_precision() {
        let original = event(Decimal::new(1, 6), Decimal::ZERO);
        let mut row = stored(&original);
        row.started_at += TimeDelta::microseconds(456);
        assert_eq!(row.to_event().unwrap().started_at, original.started_at);
    }
}
