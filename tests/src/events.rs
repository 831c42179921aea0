//! Usage events for tests that write the topic or ingest's batches
//! themselves.

use chrono::{DurationRound, TimeDelta, Utc};
use rust_decimal::Decimal;
use usage_contract::{FinishReason, RequestId, UsageEvent};

/// A valid event of `tenant`, started five minutes ago, whose figures
/// follow from `n`: `50 + n` prompt tokens, `n` completion tokens and
/// `(1000 + n)` µs of GPU time, priority 3, model `llama-3.1-8b`.
pub fn usage_event(tenant: &str, n: i64) -> UsageEvent {
    let started_at = (Utc::now() - TimeDelta::minutes(5))
        .duration_trunc(TimeDelta::milliseconds(1))
        .unwrap_or_else(|_| Utc::now());
    UsageEvent {
        schema_version: 1,
        request_id: RequestId::at(started_at),
        tenant_id: tenant.into(),
        api_key_id: "k".into(),
        model: "llama-3.1-8b".into(),
        model_version: "v".into(),
        priority: 3,
        started_at,
        first_token_at: None,
        finished_at: started_at,
        prompt_tokens: 50 + n,
        cached_tokens: 0,
        completion_tokens: n,
        gpu_seconds: Decimal::new(1_000 + n, 6),
        preempted_gpu_seconds: Decimal::ZERO,
        finish_reason: FinishReason::Stop,
        ttft_ms: None,
        tpot_ms: None,
        replica_id: "r".into(),
        gateway_id: "g".into(),
        stream: false,
        placement: None,
    }
}
