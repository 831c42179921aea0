//! Ingest's two write paths (`INGEST_WRITE_PATH`): `rows`, the current
//! statements (the request rows as one composite array, one statement for
//! the hourly rollups), and `unnest`, the earlier ones that `ingest-bench`
//! measures beside them. The same batches through each store the same
//! request rows, hourly sums (per tenant, per API key, on dedicated
//! replicas), late hours, dead letters and queued ids.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::collections::BTreeMap;

use chrono::{DurationRound, TimeDelta, Utc};
use ingest::batch::{split, RawMessage};
use ingest::offsets::ConsumerKey;
use ingest::store::{commit_batch, Outcome, Partitions, SynchronousCommit, WritePath, Writes};
use rust_decimal::Decimal;
use sqlx::PgPool;
use tests::events::usage_event as event;
use usage_contract::{FinishReason, Placement, UsageEvent};

/// Three batches: v1 and v2 events (some on a dedicated replica, of
/// several keys, models and priorities, cancelled and errored), one in a
/// closed hour, a re-send, a conflicting version, an unknown tenant and
/// bytes that are no event.
fn batches() -> Vec<Vec<Vec<u8>>> {
    let closed = (Utc::now() - TimeDelta::hours(3))
        .duration_trunc(TimeDelta::hours(1))
        .unwrap();
    let mut events: Vec<UsageEvent> = Vec::new();
    for n in 0..60 {
        let mut e = event(["acme-corp", "codegen-platform"][n % 2], n as i64);
        e.api_key_id = format!("key-{}", n % 3);
        e.model = ["llama-3.1-8b", "llama-3.1-70b"][n % 2].into();
        e.priority = 1 + (n % 3) as i16;
        e.gpu_seconds = Decimal::new(1_234_567 + n as i64, 6);
        e.preempted_gpu_seconds = Decimal::new((n % 4) as i64 * 1000, 6);
        e.finish_reason = [
            FinishReason::Stop,
            FinishReason::Length,
            FinishReason::Cancelled,
            FinishReason::Error,
        ][n % 4];
        if n % 3 > 0 {
            e.schema_version = 2;
            e.placement = Some(Placement {
                pool: e.model.clone(),
                dedicated_to: (n % 3 == 1).then(|| "acme-corp".to_owned()),
                queue_wait_ms: n as i64,
                preemptions: (n % 2) as i64,
            });
        }
        events.push(e);
    }
    let mut late = event("acme-corp", 100);
    late.started_at = closed + TimeDelta::minutes(5);
    late.finished_at = late.started_at;
    late.request_id = usage_contract::RequestId::at(late.started_at);
    let mut conflict = events[3].clone();
    conflict.completion_tokens += 1;
    let stranger = event("nobody-knows-us", 7);
    let json = |e: &UsageEvent| e.to_json();
    vec![
        events[..30].iter().map(json).collect(),
        events[30..]
            .iter()
            .map(json)
            .chain([json(&late), json(&events[5]), json(&conflict)])
            .collect(),
        vec![json(&stranger), b"not an event".to_vec(), json(&events[7])],
    ]
}

/// What the database holds after the batches, without the columns that
/// record when (ingested_at, updated_at, received_at, ids of their own).
async fn stored(pool: &PgPool) -> BTreeMap<&'static str, Vec<String>> {
    let tables = [
        (
            "request_log",
            "SELECT r::text FROM (SELECT request_id, tenant_id, api_key_id, model, model_version,
                 priority, started_at, first_token_at, finished_at, prompt_tokens, cached_tokens,
                 completion_tokens, gpu_seconds, preempted_gpu_seconds, finish_reason, ttft_ms,
                 tpot_ms, replica_id, gateway_id, stream, content_hash, kafka_partition,
                 kafka_offset, pool, dedicated_to, queue_wait_ms, preemptions
             FROM request_log) r ORDER BY 1",
        ),
        (
            "usage_hourly",
            "SELECT r::text FROM (SELECT tenant_id, model, priority, hour, requests,
                 prompt_tokens, cached_tokens, completion_tokens, gpu_seconds,
                 preempted_gpu_seconds, cancelled_requests, errored_requests
             FROM usage_hourly) r ORDER BY 1",
        ),
        (
            "usage_key_hourly",
            "SELECT r::text FROM usage_key_hourly r ORDER BY 1",
        ),
        (
            "dedicated_usage_hourly",
            "SELECT r::text FROM dedicated_usage_hourly r ORDER BY 1",
        ),
        (
            "usage_hours",
            "SELECT r::text FROM (SELECT hour, adjusted, late_requests FROM usage_hours) r
             ORDER BY 1",
        ),
        (
            "dead_letters",
            "SELECT r::text FROM (SELECT topic, kafka_partition, kafka_offset, raw, reason_code,
                 reason, request_id, tenant_id, stored_version FROM dead_letters) r ORDER BY 1",
        ),
        (
            "archive_queue",
            "SELECT request_id::text FROM archive_queue ORDER BY 1",
        ),
    ];
    let mut out = BTreeMap::new();
    for (name, sql) in tables {
        let rows: Vec<(String,)> = sqlx::query_as(sql).fetch_all(pool).await.unwrap();
        out.insert(name, rows.into_iter().map(|(r,)| r).collect());
    }
    out
}

/// A fresh database after `batches` went through `path`.
async fn through(path: WritePath, batches: &[Vec<Vec<u8>>]) -> BTreeMap<&'static str, Vec<String>> {
    let db = tests::stack::fresh_database("write_paths").await;
    let pool = db.pool.clone();
    for tenant in ["acme-corp", "codegen-platform"] {
        sqlx::query(
            "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode)
             VALUES ($1, $1, 'standard', 3, 'per_token')",
        )
        .bind(tenant)
        .execute(&pool)
        .await
        .unwrap();
    }
    // An hour rollup closed three hours ago: the late event adjusts it.
    sqlx::query(
        "INSERT INTO usage_hours (hour, watermark)
         VALUES (date_trunc('hour', now() - interval '3 hours'), now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    let key = ConsumerKey {
        group: "write-paths".into(),
        topic: usage_contract::TOPIC.into(),
    };
    let writes = Writes {
        synchronous_commit: SynchronousCommit::On,
        path,
    };
    let mut expected: BTreeMap<i32, Option<i64>> = BTreeMap::new();
    let mut offset = 0;
    for payloads in batches {
        let messages: Vec<RawMessage> = payloads
            .iter()
            .cloned()
            .map(|payload| {
                offset += 1;
                RawMessage {
                    partition: 0,
                    offset: offset - 1,
                    payload,
                    decoded: None,
                }
            })
            .collect();
        let decoded = split(&messages, Utc::now());
        let next = decoded.next_offsets.clone();
        Partitions::default()
            .ensure(&pool, decoded.firsts.iter().map(|c| &c.event))
            .await
            .unwrap();
        let outcome = commit_batch(&pool, &key, &expected, decoded, writes)
            .await
            .unwrap();
        assert!(matches!(outcome, Outcome::Committed(_)), "{outcome:?}");
        expected.extend(next.into_iter().map(|(p, o)| (p, Some(o))));
    }
    stored(&pool).await
}

#[tokio::test]
async fn both_write_paths_store_the_same_rows_and_sums() {
    let batches = batches();
    let rows = through(WritePath::Rows, &batches).await;
    let unnest = through(WritePath::Unnest, &batches).await;
    for (table, stored) in &rows {
        assert!(!stored.is_empty(), "{table} is empty");
        assert_eq!(stored, &unnest[table], "{table} differs");
    }
    // 60 events and the late one; a conflict, a stranger and bytes.
    assert_eq!(
        (rows["request_log"].len(), rows["dead_letters"].len()),
        (61, 3)
    );
    assert!(
        rows["usage_hours"][0].ends_with(",t,1)"),
        "the closed hour is not marked late once: {:?}",
        rows["usage_hours"]
    );
}
