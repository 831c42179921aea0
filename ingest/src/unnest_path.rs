//! The write path ingest used before composite rows and one-pass rollups
//! ([`crate::request_rows`], [`crate::hourly`]), kept so that
//! `ingest-bench` measures before and after in one run
//! (`INGEST_WRITE_PATH=unnest`): the request rows as 27 arrays taken apart
//! by one multi-argument `UNNEST` (Postgres materializes each array on its
//! own before zipping them), and one statement per hourly rollup and for
//! the late hours, each with its own aggregation of the events. It writes
//! exactly what the current path writes.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgConnection, Postgres};
use usage_contract::UsageEvent;
use uuid::Uuid;

use crate::batch::{aggregate, aggregate_by_key, hour_of, Candidate, HourTotals};

type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

pub(crate) const INSERT_ROWS: &str =
    "INSERT INTO request_log (request_id, tenant_id, api_key_id, model,
     model_version, priority, started_at, first_token_at, finished_at, prompt_tokens,
     cached_tokens, completion_tokens, gpu_seconds, preempted_gpu_seconds, finish_reason,
     ttft_ms, tpot_ms, replica_id, gateway_id, stream, content_hash, kafka_partition,
     kafka_offset, pool, dedicated_to, queue_wait_ms, preemptions)
 SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[],
     $6::smallint[], $7::timestamptz[], $8::timestamptz[], $9::timestamptz[],
     $10::bigint[], $11::bigint[], $12::bigint[], $13::numeric[], $14::numeric[],
     $15::text[], $16::bigint[], $17::bigint[], $18::text[], $19::text[],
     $20::boolean[], $21::bytea[], $22::integer[], $23::bigint[], $24::text[],
     $25::text[], $26::bigint[], $27::bigint[])";

/// Column-wise arrays for UNNEST.
#[derive(Default)]
pub(crate) struct RequestColumns<'a> {
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
    pool: Vec<Option<&'a str>>,
    dedicated_to: Vec<Option<&'a str>>,
    queue_wait_ms: Vec<Option<i64>>,
    preemptions: Vec<Option<i64>>,
}

impl<'a> RequestColumns<'a> {
    pub(crate) fn of(rows: &'a [Candidate]) -> Self {
        let mut cols = Self {
            request_id: Vec::with_capacity(rows.len()),
            started_at: Vec::with_capacity(rows.len()),
            ..Self::default()
        };
        for c in rows {
            cols.push(c);
        }
        cols
    }

    /// Binds the columns as `$1` … `$27`, in [`INSERT_ROWS`]' order.
    pub(crate) fn bind<'q>(&'q self, q: PgQuery<'q>) -> PgQuery<'q> {
        q.bind(&self.request_id[..])
            .bind(&self.tenant_id[..])
            .bind(&self.api_key_id[..])
            .bind(&self.model[..])
            .bind(&self.model_version[..])
            .bind(&self.priority[..])
            .bind(&self.started_at[..])
            .bind(&self.first_token_at[..])
            .bind(&self.finished_at[..])
            .bind(&self.prompt_tokens[..])
            .bind(&self.cached_tokens[..])
            .bind(&self.completion_tokens[..])
            .bind(&self.gpu_seconds[..])
            .bind(&self.preempted_gpu_seconds[..])
            .bind(&self.finish_reason[..])
            .bind(&self.ttft_ms[..])
            .bind(&self.tpot_ms[..])
            .bind(&self.replica_id[..])
            .bind(&self.gateway_id[..])
            .bind(&self.stream[..])
            .bind(&self.content_hash[..])
            .bind(&self.kafka_partition[..])
            .bind(&self.kafka_offset[..])
            .bind(&self.pool[..])
            .bind(&self.dedicated_to[..])
            .bind(&self.queue_wait_ms[..])
            .bind(&self.preemptions[..])
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
        let p = e.placement.as_ref();
        self.pool.push(p.map(|p| p.pool.as_str()));
        self.dedicated_to
            .push(p.and_then(|p| p.dedicated_to.as_deref()));
        self.queue_wait_ms.push(p.map(|p| p.queue_wait_ms));
        self.preemptions.push(p.map(|p| p.preemptions));
    }
}

/// The three rollups and the late hours, one aggregation and one statement each.
pub(crate) async fn upsert_rollups(
    conn: &mut PgConnection,
    events: &[&UsageEvent],
) -> Result<(), sqlx::Error> {
    upsert_hourly(conn, events.iter().copied()).await?;
    upsert_key_hourly(conn, events.iter().copied()).await?;
    upsert_dedicated_usage(conn, events.iter().copied()).await?;
    mark_late_hours(conn, events.iter().copied()).await
}

/// Adds the inserted events to usage_hourly: aggregated per key first, then
/// one multi-row upsert. Keys are sorted so concurrent batches lock rows in
/// the same order and cannot deadlock.
async fn upsert_hourly<'a>(
    conn: &mut PgConnection,
    events: impl IntoIterator<Item = &'a UsageEvent>,
) -> Result<(), sqlx::Error> {
    let sums = aggregate(events);
    if sums.is_empty() {
        return Ok(());
    }
    let n = sums.len();
    let (mut tenant, mut model, mut priority, mut hour) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut requests, mut prompt, mut cached, mut completion) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut gpu, mut preempted, mut cancelled, mut errored) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for (k, t) in sums {
        tenant.push(k.tenant_id);
        model.push(k.model);
        priority.push(k.priority);
        hour.push(k.hour);
        requests.push(t.requests);
        prompt.push(t.prompt_tokens);
        cached.push(t.cached_tokens);
        completion.push(t.completion_tokens);
        gpu.push(t.gpu_seconds);
        preempted.push(t.preempted_gpu_seconds);
        cancelled.push(t.cancelled_requests);
        errored.push(t.errored_requests);
    }
    sqlx::query(
        "INSERT INTO usage_hourly AS u (tenant_id, model, priority, hour, requests,
             prompt_tokens, cached_tokens, completion_tokens, gpu_seconds,
             preempted_gpu_seconds, cancelled_requests, errored_requests)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::smallint[], $4::timestamptz[],
             $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::numeric[],
             $10::numeric[], $11::bigint[], $12::bigint[])
         ON CONFLICT (tenant_id, model, priority, hour) DO UPDATE SET
             requests = u.requests + EXCLUDED.requests,
             prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
             cached_tokens = u.cached_tokens + EXCLUDED.cached_tokens,
             completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens,
             gpu_seconds = u.gpu_seconds + EXCLUDED.gpu_seconds,
             preempted_gpu_seconds = u.preempted_gpu_seconds + EXCLUDED.preempted_gpu_seconds,
             cancelled_requests = u.cancelled_requests + EXCLUDED.cancelled_requests,
             errored_requests = u.errored_requests + EXCLUDED.errored_requests,
             updated_at = now()",
    )
    .bind(tenant)
    .bind(model)
    .bind(priority)
    .bind(hour)
    .bind(requests)
    .bind(prompt)
    .bind(cached)
    .bind(completion)
    .bind(gpu)
    .bind(preempted)
    .bind(cancelled)
    .bind(errored)
    .execute(conn)
    .await?;
    Ok(())
}

/// Adds the inserted events to usage_key_hourly: aggregated per (tenant,
/// API key, model, priority, hour) first, then one multi-row upsert in key
/// order (so concurrent batches cannot deadlock).
async fn upsert_key_hourly<'a>(
    conn: &mut PgConnection,
    events: impl IntoIterator<Item = &'a UsageEvent>,
) -> Result<(), sqlx::Error> {
    let sums = aggregate_by_key(events);
    if sums.is_empty() {
        return Ok(());
    }
    let n = sums.len();
    let (mut tenant, mut key, mut model, mut priority, mut hour) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut requests, mut prompt, mut cached, mut completion, mut gpu) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for ((t, k, m, p, h), totals) in sums {
        tenant.push(t);
        key.push(k);
        model.push(m);
        priority.push(p);
        hour.push(h);
        requests.push(totals.requests);
        prompt.push(totals.prompt_tokens);
        cached.push(totals.cached_tokens);
        completion.push(totals.completion_tokens);
        gpu.push(totals.gpu_seconds);
    }
    sqlx::query(
        "INSERT INTO usage_key_hourly AS u (tenant_id, api_key_id, model, priority, hour,
             requests, prompt_tokens, cached_tokens, completion_tokens, gpu_seconds)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::smallint[],
             $5::timestamptz[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[],
             $10::numeric[])
         ON CONFLICT (tenant_id, api_key_id, model, priority, hour) DO UPDATE SET
             requests = u.requests + EXCLUDED.requests,
             prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
             cached_tokens = u.cached_tokens + EXCLUDED.cached_tokens,
             completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens,
             gpu_seconds = u.gpu_seconds + EXCLUDED.gpu_seconds",
    )
    .bind(tenant)
    .bind(key)
    .bind(model)
    .bind(priority)
    .bind(hour)
    .bind(requests)
    .bind(prompt)
    .bind(cached)
    .bind(completion)
    .bind(gpu)
    .execute(conn)
    .await?;
    Ok(())
}

/// Adds counted events that ran on a dedicated replica to
/// dedicated_usage_hourly, aggregated per key and sorted (one upsert).
async fn upsert_dedicated_usage<'a>(
    conn: &mut PgConnection,
    events: impl IntoIterator<Item = &'a UsageEvent>,
) -> Result<(), sqlx::Error> {
    let mut sums: BTreeMap<(&str, &str, &str, i16, DateTime<Utc>), HourTotals> = BTreeMap::new();
    for e in events {
        let Some(owner) = e.placement.as_ref().and_then(|p| p.dedicated_to.as_deref()) else {
            continue;
        };
        sums.entry((owner, &e.tenant_id, &e.model, e.priority, hour_of(e)))
            .or_default()
            .add(e);
    }
    if sums.is_empty() {
        return Ok(());
    }
    let n = sums.len();
    let mut owner = Vec::with_capacity(n);
    let mut tenant = Vec::with_capacity(n);
    let mut model = Vec::with_capacity(n);
    let mut priority = Vec::with_capacity(n);
    let mut hour = Vec::with_capacity(n);
    let mut requests = Vec::with_capacity(n);
    let mut prompt = Vec::with_capacity(n);
    let mut cached = Vec::with_capacity(n);
    let mut completion = Vec::with_capacity(n);
    let mut gpu = Vec::with_capacity(n);
    for ((o, t, m, p, h), s) in sums {
        owner.push(o);
        tenant.push(t);
        model.push(m);
        priority.push(p);
        hour.push(h);
        requests.push(s.requests);
        prompt.push(s.prompt_tokens);
        cached.push(s.cached_tokens);
        completion.push(s.completion_tokens);
        gpu.push(s.gpu_seconds);
    }
    sqlx::query(
        "INSERT INTO dedicated_usage_hourly AS d (owner_id, tenant_id, model, priority, hour,
             requests, prompt_tokens, cached_tokens, completion_tokens, gpu_seconds)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::smallint[],
             $5::timestamptz[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[],
             $10::numeric[])
         ON CONFLICT (owner_id, tenant_id, model, priority, hour) DO UPDATE SET
             requests = d.requests + EXCLUDED.requests,
             prompt_tokens = d.prompt_tokens + EXCLUDED.prompt_tokens,
             cached_tokens = d.cached_tokens + EXCLUDED.cached_tokens,
             completion_tokens = d.completion_tokens + EXCLUDED.completion_tokens,
             gpu_seconds = d.gpu_seconds + EXCLUDED.gpu_seconds",
    )
    .bind(owner)
    .bind(tenant)
    .bind(model)
    .bind(priority)
    .bind(hour)
    .bind(requests)
    .bind(prompt)
    .bind(cached)
    .bind(completion)
    .bind(gpu)
    .execute(conn)
    .await?;
    Ok(())
}

/// Marks closed hours that just received usage as adjusted, so billing can
/// tell a closed hour changed.
async fn mark_late_hours<'a>(
    conn: &mut PgConnection,
    events: impl IntoIterator<Item = &'a UsageEvent>,
) -> Result<(), sqlx::Error> {
    let mut per_hour: BTreeMap<DateTime<Utc>, i64> = BTreeMap::new();
    for e in events {
        *per_hour.entry(hour_of(e)).or_default() += 1;
    }
    if per_hour.is_empty() {
        return Ok(());
    }
    let (hours, counts): (Vec<_>, Vec<_>) = per_hour.into_iter().unzip();
    sqlx::query(
        "UPDATE usage_hours h SET adjusted = true, late_requests = h.late_requests + x.n,
             last_adjusted_at = now()
         FROM UNNEST($1::timestamptz[], $2::bigint[]) AS x(hour, n)
         WHERE h.hour = x.hour",
    )
    .bind(hours)
    .bind(counts)
    .execute(conn)
    .await?;
    Ok(())
}
