//! usage_hourly: what inserted requests add to their hour; usage_key_hourly:
//! the same per API key (for cost per key); and marking closed hours that
//! received late usage. Both rollups take the same inserted rows in the same
//! transaction, each as one sorted multi-row UNNEST upsert.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use usage_contract::UsageEvent;

use crate::batch::{aggregate, aggregate_by_key, hour_of};

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

/// Adds the inserted events to usage_key_hourly: aggregated per (tenant,
/// API key, model, priority, hour) first, then one multi-row upsert in key
/// order (so concurrent batches cannot deadlock).
pub async fn upsert_key_hourly<'a>(
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

/// Marks closed hours that just received usage as adjusted, so billing can
/// tell a closed hour changed.
pub(crate) async fn mark_late_hours<'a>(
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
