//! The one Postgres transaction that makes a batch count exactly once:
//! move each partition's offset by compare-and-set, insert the new request
//! rows, add only what was inserted to usage_hourly, and keep everything
//! that can't be counted in dead_letters. All of it commits, or none.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use usage_contract::{UsageEvent, Violation};
use uuid::Uuid;

use crate::batch::{aggregate, compare, hour_of, Candidate, Decoded, Rejected, Verdict};
use crate::offsets::{self, Cas, ConsumerKey};

/// What a committed batch did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub inserted: u64,
    pub duplicates: u64,
    pub conflicts: u64,
    pub dead_lettered: u64,
}

/// The result of trying to commit a batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Committed(Counts),
    /// Some partitions' stored offsets were not where this consumer thought.
    /// `done`: already moved exactly to this batch's end (an earlier attempt
    /// whose acknowledgement was lost, or another consumer with the same
    /// messages): nothing more to write for them. `fenced`: moved elsewhere,
    /// so this consumer is a zombie for them and must rejoin.
    Stale {
        done: Vec<i32>,
        fenced: Vec<i32>,
    },
}

/// Remembers which day partitions of request_log exist.
#[derive(Debug, Default)]
pub struct Partitions {
    known: HashSet<NaiveDate>,
}

impl Partitions {
    /// Creates the day partitions the events need, outside the batch
    /// transaction so the DDL lock is held only for a moment.
    pub async fn ensure<'a>(
        &mut self,
        pool: &PgPool,
        events: impl IntoIterator<Item = &'a UsageEvent>,
    ) -> Result<(), sqlx::Error> {
        let missing: HashSet<NaiveDate> = events
            .into_iter()
            .map(|e| e.request_id.day())
            .filter(|d| !self.known.contains(d))
            .collect();
        for day in missing {
            sqlx::query("SELECT ensure_request_log_partition($1)")
                .bind(day)
                .execute(pool)
                .await?;
            self.known.insert(day);
        }
        Ok(())
    }
}

/// Commits one batch. `expected` holds, per partition, the stored offset
/// this consumer believes in (`None`: no row yet).
pub async fn commit_batch(
    pool: &PgPool,
    key: &ConsumerKey,
    expected: &BTreeMap<i32, Option<i64>>,
    decoded: Decoded,
) -> Result<Outcome, sqlx::Error> {
    let mut tx = pool.begin().await?;
    // Safe without waiting for the WAL flush: data and offsets commit
    // together, so a Postgres crash that loses this commit loses both, and
    // the batch is consumed again from the older offset (our next CAS fails,
    // we rejoin and reload). Nothing is lost or doubled; the commit is faster.
    sqlx::query("SET LOCAL synchronous_commit = off")
        .execute(&mut *tx)
        .await?;
    // Offsets first: the row locks serialize two consumers of one partition
    // before either writes data, and a zombie fails fast.
    let mut done = Vec::new();
    let mut fenced = Vec::new();
    for (&partition, &next) in &decoded.next_offsets {
        let believed = expected.get(&partition).copied().flatten();
        match offsets::compare_and_set(&mut tx, key, partition, believed, next).await? {
            Cas::Moved => {}
            Cas::Stale { stored } if stored == Some(next) => done.push(partition),
            Cas::Stale { .. } => fenced.push(partition),
        }
    }
    if !done.is_empty() || !fenced.is_empty() {
        tx.rollback().await?;
        return Ok(Outcome::Stale { done, fenced });
    }
    let counts = apply(&mut tx, decoded).await?;
    tx.commit().await?;
    Ok(Outcome::Committed(counts))
}

/// Writes a decoded batch inside an open transaction: request rows, hourly
/// deltas for what was inserted, dead letters for the rest.
pub async fn apply(
    tx: &mut Transaction<'_, Postgres>,
    decoded: Decoded,
) -> Result<Counts, sqlx::Error> {
    let Decoded {
        firsts,
        repeats,
        mut rejected,
        ..
    } = decoded;
    let mut counts = Counts::default();
    // Shared with every other ingest transaction; rollup takes it exclusively
    // to close hours or drop partitions, so neither happens under a batch.
    sqlx::query("SELECT pg_advisory_xact_lock_shared($1)")
        .bind(schema::USAGE_LOCK)
        .execute(&mut **tx)
        .await?;

    // Requests from dropped days can't be deduplicated any more: keep them
    // aside rather than risk counting a re-send twice.
    let dropped: Option<(NaiveDate,)> =
        sqlx::query_as("SELECT dropped_through FROM request_log_retention")
            .fetch_optional(&mut **tx)
            .await?;
    let (firsts, repeats) = match dropped {
        None => (firsts, repeats),
        Some((through,)) => {
            let expired = |c: &Candidate| c.event.request_id.day() <= through;
            let (old, firsts): (Vec<_>, Vec<_>) = firsts.into_iter().partition(expired);
            let (old_repeats, repeats): (Vec<_>, Vec<_>) = repeats.into_iter().partition(expired);
            for c in old.into_iter().chain(old_repeats) {
                let day = c.event.request_id.day();
                rejected.push(reject(c, Violation::BeyondRetention(day), None));
            }
            (firsts, repeats)
        }
    };

    // Unknown tenants are dead letters, decided against the table itself.
    let tenants: Vec<&str> = firsts.iter().map(|c| c.event.tenant_id.as_str()).collect();
    let known = known_tenants(tx, &tenants).await?;
    let (firsts, unknown): (Vec<_>, Vec<_>) = firsts
        .into_iter()
        .partition(|c| known.contains(&c.event.tenant_id));
    let (repeats, unknown_repeats): (Vec<_>, Vec<_>) = repeats
        .into_iter()
        .partition(|c| known.contains(&c.event.tenant_id));
    for c in unknown.into_iter().chain(unknown_repeats) {
        let violation = Violation::UnknownTenant(c.event.tenant_id.clone());
        rejected.push(reject(c, violation, None));
    }

    let inserted: HashSet<Uuid> = insert_request_rows(tx, &firsts).await?;
    counts.inserted = inserted.len() as u64;

    // Every id not inserted now has a stored version to compare against:
    // either a row from an earlier batch, or this batch's first occurrence.
    let mut stored: HashMap<Uuid, ([u8; 32], serde_json::Value)> = HashMap::new();
    let mut lookup = Vec::new();
    for c in &firsts {
        let id = c.event.request_id.as_uuid();
        if inserted.contains(&id) {
            stored.insert(id, (c.hash, to_json(&c.event)));
        } else {
            lookup.push(id);
        }
    }
    stored.extend(stored_versions(tx, &lookup).await?);

    let (counted, others): (Vec<_>, Vec<_>) = firsts
        .into_iter()
        .partition(|c| inserted.contains(&c.event.request_id.as_uuid()));
    for c in others.into_iter().chain(repeats) {
        let Some((hash, version)) = stored.get(&c.event.request_id.as_uuid()) else {
            // The row vanished between insert and lookup: only possible if a
            // partition was dropped concurrently. Keep the message.
            let violation = Violation::InvalidField("stored version disappeared".into());
            rejected.push(reject(c, violation, None));
            continue;
        };
        match compare(hash, &c.hash) {
            Verdict::Duplicate => counts.duplicates += 1,
            Verdict::Conflict => {
                counts.conflicts += 1;
                rejected.push(reject(c, Violation::Conflict, Some(version.clone())));
            }
        }
    }

    upsert_hourly(tx, counted.iter().map(|c| &c.event)).await?;
    mark_late_hours(tx, counted.iter().map(|c| &c.event)).await?;
    counts.dead_lettered = insert_dead_letters(tx, &rejected).await?;
    Ok(counts)
}

fn reject(c: Candidate, violation: Violation, stored: Option<serde_json::Value>) -> Rejected {
    Rejected {
        partition: c.partition,
        offset: c.offset,
        raw: c.event.to_json(),
        violation,
        request_id: Some(c.event.request_id.as_uuid()),
        tenant_id: Some(c.event.tenant_id),
        stored_version: stored,
    }
}

fn to_json(e: &UsageEvent) -> serde_json::Value {
    serde_json::to_value(e).unwrap_or(serde_json::Value::Null)
}

async fn known_tenants(
    conn: &mut PgConnection,
    tenants: &[&str],
) -> Result<HashSet<String>, sqlx::Error> {
    let mut distinct: Vec<&str> = tenants.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let rows: Vec<(String,)> =
        sqlx::query_as("SELECT tenant_id FROM tenants WHERE tenant_id = ANY($1)")
            .bind(&distinct)
            .fetch_all(conn)
            .await?;
    Ok(rows.into_iter().map(|(t,)| t).collect())
}

/// One multi-row insert for the whole batch; returns the ids actually inserted.
async fn insert_request_rows(
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
async fn stored_versions(
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

/// Adds the inserted events to usage_hourly: aggregated per key first, then
/// one multi-row upsert. Keys are sorted so concurrent batches lock rows in
/// the same order and cannot deadlock.
pub async fn upsert_hourly<'a>(
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

/// Stores rejected messages. A message already dead-lettered (same topic,
/// partition, offset) is not stored twice.
async fn insert_dead_letters(
    conn: &mut PgConnection,
    rejected: &[Rejected],
) -> Result<u64, sqlx::Error> {
    if rejected.is_empty() {
        return Ok(0);
    }
    let topic = usage_contract::TOPIC;
    let partition: Vec<i32> = rejected.iter().map(|r| r.partition).collect();
    let offset: Vec<i64> = rejected.iter().map(|r| r.offset).collect();
    let raw: Vec<&[u8]> = rejected.iter().map(|r| r.raw.as_slice()).collect();
    let code: Vec<&str> = rejected.iter().map(|r| r.violation.code()).collect();
    // Postgres text can't hold NUL, and a reason may quote the bad input.
    let reason: Vec<String> = rejected
        .iter()
        .map(|r| r.violation.to_string().replace('\0', "\u{fffd}"))
        .collect();
    let request_id: Vec<Option<Uuid>> = rejected.iter().map(|r| r.request_id).collect();
    let tenant: Vec<Option<&str>> = rejected.iter().map(|r| r.tenant_id.as_deref()).collect();
    let stored: Vec<Option<&serde_json::Value>> =
        rejected.iter().map(|r| r.stored_version.as_ref()).collect();
    let result = sqlx::query(
        "INSERT INTO dead_letters (topic, kafka_partition, kafka_offset, raw, reason_code,
             reason, request_id, tenant_id, stored_version)
         SELECT $1, * FROM UNNEST($2::integer[], $3::bigint[], $4::bytea[], $5::text[],
             $6::text[], $7::uuid[], $8::text[], $9::jsonb[])
         ON CONFLICT (topic, kafka_partition, kafka_offset) DO NOTHING",
    )
    .bind(topic)
    .bind(partition)
    .bind(offset)
    .bind(raw)
    .bind(code)
    .bind(reason)
    .bind(request_id)
    .bind(tenant)
    .bind(stored)
    .execute(conn)
    .await?;
    Ok(result.rows_affected())
}
