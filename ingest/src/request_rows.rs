//! request_log rows: the one multi-row insert per batch (UNNEST over
//! column arrays, `ON CONFLICT DO NOTHING RETURNING`) and the stored version
//! of ids that were already there.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::batch::Candidate;

/// One multi-row insert for the whole batch; returns the ids actually inserted.
pub(crate) async fn insert_request_rows(
    conn: &mut PgConnection,
    rows: &[Candidate],
) -> Result<HashSet<Uuid>, sqlx::Error> {
    if rows.is_empty() {
        return Ok(HashSet::new());
    }
    let mut cols = RequestColumns::with_capacity(rows.len());
    for c in rows {
        cols.push(c);
    }
    let ids: Vec<(Uuid,)> = sqlx::query_as(
        "INSERT INTO request_log (request_id, tenant_id, api_key_id, model, model_version,
             priority, started_at, first_token_at, finished_at, prompt_tokens, cached_tokens,
             completion_tokens, gpu_seconds, preempted_gpu_seconds, finish_reason, ttft_ms,
             tpot_ms, replica_id, gateway_id, stream, content_hash, kafka_partition, kafka_offset)
         SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[],
             $6::smallint[], $7::timestamptz[], $8::timestamptz[], $9::timestamptz[],
             $10::bigint[], $11::bigint[], $12::bigint[], $13::numeric[], $14::numeric[],
             $15::text[], $16::bigint[], $17::bigint[], $18::text[], $19::text[],
             $20::boolean[], $21::bytea[], $22::integer[], $23::bigint[])
         ON CONFLICT (request_id) DO NOTHING
         RETURNING request_id",
    )
    .bind(cols.request_id)
    .bind(cols.tenant_id)
    .bind(cols.api_key_id)
    .bind(cols.model)
    .bind(cols.model_version)
    .bind(cols.priority)
    .bind(cols.started_at)
    .bind(cols.first_token_at)
    .bind(cols.finished_at)
    .bind(cols.prompt_tokens)
    .bind(cols.cached_tokens)
    .bind(cols.completion_tokens)
    .bind(cols.gpu_seconds)
    .bind(cols.preempted_gpu_seconds)
    .bind(cols.finish_reason)
    .bind(cols.ttft_ms)
    .bind(cols.tpot_ms)
    .bind(cols.replica_id)
    .bind(cols.gateway_id)
    .bind(cols.stream)
    .bind(cols.content_hash)
    .bind(cols.kafka_partition)
    .bind(cols.kafka_offset)
    .fetch_all(conn)
    .await?;
    Ok(ids.into_iter().map(|(id,)| id).collect())
}

/// Column-wise arrays for UNNEST.
#[derive(Default)]
struct RequestColumns<'a> {
    request_id: Vec<Uuid>,
    tenant_id: Vec<&'a str>,
    api_key_id: Vec<&'a str>,
    model: Vec<&'a str>,
    model_version: Vec<&'a str>,
    priority: Vec<i16>,
    started_at: Vec<DateTime<Utc>>,
    first_token_at: Vec<Option<DateTime<Utc>>>,
    finished_at: Vec<DateTime<Utc>>,
    prompt_tokens: Vec<i64>,
    cached_tokens: Vec<i64>,
    completion_tokens: Vec<i64>,
    gpu_seconds: Vec<Decimal>,
    preempted_gpu_seconds: Vec<Decimal>,
    finish_reason: Vec<&'static str>,
    ttft_ms: Vec<Option<i64>>,
    tpot_ms: Vec<Option<i64>>,
    replica_id: Vec<&'a str>,
    gateway_id: Vec<&'a str>,
    stream: Vec<bool>,
    content_hash: Vec<&'a [u8]>,
    kafka_partition: Vec<i32>,
    kafka_offset: Vec<i64>,
}

impl<'a> RequestColumns<'a> {
    fn with_capacity(n: usize) -> Self {
        Self {
            request_id: Vec::with_capacity(n),
            started_at: Vec::with_capacity(n),
            ..Self::default()
        }
    }

    fn push(&mut self, c: &'a Candidate) {
        let e = &c.event;
        self.request_id.push(e.request_id.as_uuid());
        self.tenant_id.push(&e.tenant_id);
        self.api_key_id.push(&e.api_key_id);
        self.model.push(&e.model);
        self.model_version.push(&e.model_version);
        self.priority.push(e.priority);
        self.started_at.push(e.started_at);
        self.first_token_at.push(e.first_token_at);
        self.finished_at.push(e.finished_at);
        self.prompt_tokens.push(e.prompt_tokens);
        self.cached_tokens.push(e.cached_tokens);
        self.completion_tokens.push(e.completion_tokens);
        self.gpu_seconds.push(e.gpu_seconds);
        self.preempted_gpu_seconds.push(e.preempted_gpu_seconds);
        self.finish_reason.push(e.finish_reason.as_str());
        self.ttft_ms.push(e.ttft_ms);
        self.tpot_ms.push(e.tpot_ms);
        self.replica_id.push(&e.replica_id);
        self.gateway_id.push(&e.gateway_id);
        self.stream.push(e.stream);
        self.content_hash.push(&c.hash);
        self.kafka_partition.push(c.partition);
        self.kafka_offset.push(c.offset);
    }
}

/// The stored hash and the stored version (as event JSON) of each id.
pub(crate) async fn stored_versions(
    conn: &mut PgConnection,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, ([u8; 32], serde_json::Value)>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<(Uuid, Vec<u8>, serde_json::Value)> = sqlx::query_as(
        "SELECT request_id, content_hash,
                to_jsonb(r) - 'content_hash' - 'kafka_partition' - 'kafka_offset' - 'ingested_at'
         FROM request_log r WHERE request_id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, hash, json)| {
            let mut fixed = [0u8; 32];
            if hash.len() == 32 {
                fixed.copy_from_slice(&hash);
            }
            (id, (fixed, json))
        })
        .collect())
}
