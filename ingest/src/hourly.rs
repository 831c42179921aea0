//! What the inserted requests add to the hourly rollups, in one pass and
//! one statement: usage_hourly (per tenant, model, priority and hour),
//! usage_key_hourly (the same per API key, for cost per key),
//! dedicated_usage_hourly (the usage that ran on a dedicated replica, under
//! its owner) and the closed hours that received late usage (usage_hours).
//!
//! One loop over the events adds each to its three rollup keys and its
//! hour; one statement then upserts all three rollups (data-modifying
//! `WITH` queries) and marks the late hours, so a batch pays one round trip
//! for them, not four. Every rollup's keys are sorted, so concurrent
//! batches lock rows in the same order and cannot deadlock; the statement
//! is the same for every batch, so its tables are taken in the same order.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use usage_contract::UsageEvent;

use crate::batch::{hour_of, HourTotals};

/// usage_hourly's key: tenant, model, priority, hour.
type HourKey<'a> = (&'a str, &'a str, i16, DateTime<Utc>);
/// usage_key_hourly's and dedicated_usage_hourly's: a tenant or owner and
/// an API key or tenant, then model, priority, hour.
type PairKey<'a> = (&'a str, &'a str, &'a str, i16, DateTime<Utc>);

/// A batch's inserted events, added up for every rollup at once.
#[derive(Debug, Default)]
pub struct Rollups<'a> {
    pub hourly: BTreeMap<HourKey<'a>, HourTotals>,
    pub per_key: BTreeMap<PairKey<'a>, HourTotals>,
    /// By owner, tenant, model, priority, hour.
    pub dedicated: BTreeMap<PairKey<'a>, HourTotals>,
    /// Requests per hour (closed hours among them are marked late).
    pub hours: BTreeMap<DateTime<Utc>, i64>,
}

impl<'a> Rollups<'a> {
    /// Adds up `events` (borrowing their names: nothing is allocated per event).
    pub fn of(events: impl IntoIterator<Item = &'a UsageEvent>) -> Self {
        let mut r = Self::default();
        for e in events {
            let hour = hour_of(e);
            let (tenant, model, priority) = (e.tenant_id.as_str(), e.model.as_str(), e.priority);
            r.hourly
                .entry((tenant, model, priority, hour))
                .or_default()
                .add(e);
            r.per_key
                .entry((tenant, &e.api_key_id, model, priority, hour))
                .or_default()
                .add(e);
            if let Some(owner) = e.placement.as_ref().and_then(|p| p.dedicated_to.as_deref()) {
                r.dedicated
                    .entry((owner, tenant, model, priority, hour))
                    .or_default()
                    .add(e);
            }
            *r.hours.entry(hour).or_default() += 1;
        }
        r
    }
}

/// Column arrays of one rollup's rows, in key order.
#[derive(Default)]
struct Columns<'a> {
    first: Vec<&'a str>,
    second: Vec<&'a str>,
    model: Vec<&'a str>,
    priority: Vec<i16>,
    hour: Vec<DateTime<Utc>>,
    totals: Vec<&'a HourTotals>,
}

impl<'a> Columns<'a> {
    fn of_pairs(sums: &'a BTreeMap<PairKey<'a>, HourTotals>) -> Self {
        let mut c = Self::default();
        for ((first, second, model, priority, hour), t) in sums {
            c.first.push(first);
            c.second.push(second);
            c.model.push(model);
            c.priority.push(*priority);
            c.hour.push(*hour);
            c.totals.push(t);
        }
        c
    }

    fn of_hours(sums: &'a BTreeMap<HourKey<'a>, HourTotals>) -> Self {
        let mut c = Self::default();
        for ((tenant, model, priority, hour), t) in sums {
            c.first.push(tenant);
            c.model.push(model);
            c.priority.push(*priority);
            c.hour.push(*hour);
            c.totals.push(t);
        }
        c
    }

    fn field<T>(&self, f: impl Fn(&HourTotals) -> T) -> Vec<T> {
        self.totals.iter().map(|t| f(t)).collect()
    }
}

const UPSERT_ROLLUPS: &str = "WITH hourly AS (
    INSERT INTO usage_hourly AS u (tenant_id, model, priority, hour, requests, prompt_tokens,
        cached_tokens, completion_tokens, gpu_seconds, preempted_gpu_seconds,
        cancelled_requests, errored_requests)
    SELECT * FROM UNNEST($1::text[], $2::text[], $3::smallint[], $4::timestamptz[],
        $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::numeric[], $10::numeric[],
        $11::bigint[], $12::bigint[])
    ON CONFLICT (tenant_id, model, priority, hour) DO UPDATE SET
        requests = u.requests + EXCLUDED.requests,
        prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
        cached_tokens = u.cached_tokens + EXCLUDED.cached_tokens,
        completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens,
        gpu_seconds = u.gpu_seconds + EXCLUDED.gpu_seconds,
        preempted_gpu_seconds = u.preempted_gpu_seconds + EXCLUDED.preempted_gpu_seconds,
        cancelled_requests = u.cancelled_requests + EXCLUDED.cancelled_requests,
        errored_requests = u.errored_requests + EXCLUDED.errored_requests,
        updated_at = now()
), per_key AS (
    INSERT INTO usage_key_hourly AS u (tenant_id, api_key_id, model, priority, hour,
        requests, prompt_tokens, cached_tokens, completion_tokens, gpu_seconds)
    SELECT * FROM UNNEST($13::text[], $14::text[], $15::text[], $16::smallint[],
        $17::timestamptz[], $18::bigint[], $19::bigint[], $20::bigint[], $21::bigint[],
        $22::numeric[])
    ON CONFLICT (tenant_id, api_key_id, model, priority, hour) DO UPDATE SET
        requests = u.requests + EXCLUDED.requests,
        prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
        cached_tokens = u.cached_tokens + EXCLUDED.cached_tokens,
        completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens,
        gpu_seconds = u.gpu_seconds + EXCLUDED.gpu_seconds
), dedicated AS (
    INSERT INTO dedicated_usage_hourly AS d (owner_id, tenant_id, model, priority, hour,
        requests, prompt_tokens, cached_tokens, completion_tokens, gpu_seconds)
    SELECT * FROM UNNEST($23::text[], $24::text[], $25::text[], $26::smallint[],
        $27::timestamptz[], $28::bigint[], $29::bigint[], $30::bigint[], $31::bigint[],
        $32::numeric[])
    ON CONFLICT (owner_id, tenant_id, model, priority, hour) DO UPDATE SET
        requests = d.requests + EXCLUDED.requests,
        prompt_tokens = d.prompt_tokens + EXCLUDED.prompt_tokens,
        cached_tokens = d.cached_tokens + EXCLUDED.cached_tokens,
        completion_tokens = d.completion_tokens + EXCLUDED.completion_tokens,
        gpu_seconds = d.gpu_seconds + EXCLUDED.gpu_seconds
)
UPDATE usage_hours h SET adjusted = true, late_requests = h.late_requests + x.n,
    last_adjusted_at = now()
FROM UNNEST($33::timestamptz[], $34::bigint[]) AS x(hour, n)
WHERE h.hour = x.hour";

/// Adds the inserted `events` to the three rollups and marks the closed
/// hours among theirs as adjusted, in one statement.
pub async fn upsert_rollups<'a>(
    conn: &mut PgConnection,
    events: impl IntoIterator<Item = &'a UsageEvent>,
) -> Result<(), sqlx::Error> {
    let r = Rollups::of(events);
    if r.hours.is_empty() {
        return Ok(());
    }
    let hourly = Columns::of_hours(&r.hourly);
    let per_key = Columns::of_pairs(&r.per_key);
    let dedicated = Columns::of_pairs(&r.dedicated);
    let (hours, counts): (Vec<_>, Vec<_>) = r.hours.iter().map(|(h, n)| (*h, *n)).unzip();
    let mut q = sqlx::query(UPSERT_ROLLUPS)
        .bind(&hourly.first)
        .bind(&hourly.model)
        .bind(&hourly.priority)
        .bind(&hourly.hour)
        .bind(hourly.field(|t| t.requests))
        .bind(hourly.field(|t| t.prompt_tokens))
        .bind(hourly.field(|t| t.cached_tokens))
        .bind(hourly.field(|t| t.completion_tokens))
        .bind(hourly.field(|t| t.gpu_seconds))
        .bind(hourly.field(|t| t.preempted_gpu_seconds))
        .bind(hourly.field(|t| t.cancelled_requests))
        .bind(hourly.field(|t| t.errored_requests));
    for c in [&per_key, &dedicated] {
        q = q
            .bind(&c.first)
            .bind(&c.second)
            .bind(&c.model)
            .bind(&c.priority)
            .bind(&c.hour)
            .bind(c.field(|t| t.requests))
            .bind(c.field(|t| t.prompt_tokens))
            .bind(c.field(|t| t.cached_tokens))
            .bind(c.field(|t| t.completion_tokens))
            .bind(c.field(|t| t.gpu_seconds));
    }
    q.bind(hours).bind(counts).execute(conn).await?;
    Ok(())
}
