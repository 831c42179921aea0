//! Usage as billing reads it: usage_hourly (summed per rating group, per
//! hour for shadow bills, per tenant for metrics and the overhead split),
//! idle fleet time, and one request_log row for lookup. billing-api never
//! writes usage.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::error::BillingError;
use crate::rating::UsageGroup;

/// One tenant's window of usage: `(tenant, start, end)`.
pub type Window = (String, DateTime<Utc>, DateTime<Utc>);

/// Each tenant's usage in its own `[start, end)`, summed per rating group;
/// an hour in `off_peak` is off-peak. Off-peak is decided per hour in Rust
/// (chrono-tz, exact across DST) and handed over as a short list: no
/// time-zone work per row in Postgres, and small hash joins that parallel
/// workers can share.
pub async fn groups(
    conn: &mut PgConnection,
    windows: &[Window],
    off_peak: &[DateTime<Utc>],
) -> Result<HashMap<String, Vec<UsageGroup>>, BillingError> {
    let ids: Vec<&str> = windows.iter().map(|w| w.0.as_str()).collect();
    let starts: Vec<DateTime<Utc>> = windows.iter().map(|w| w.1).collect();
    let ends: Vec<DateTime<Utc>> = windows.iter().map(|w| w.2).collect();
    let (Some(from), Some(to)) = (starts.iter().min().copied(), ends.iter().max().copied()) else {
        return Ok(HashMap::new());
    };
    type Row = (String, String, i16, bool, i64, i64, i64, i64, Decimal);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT u.tenant_id, u.model, u.priority, op.hour IS NOT NULL,
                sum(u.requests)::bigint, sum(u.prompt_tokens)::bigint, sum(u.cached_tokens)::bigint,
                sum(u.completion_tokens)::bigint, sum(u.gpu_seconds)
         FROM usage_hourly u
         JOIN UNNEST($1::text[], $2::timestamptz[], $3::timestamptz[]) AS w(tenant_id, s, e)
           ON w.tenant_id = u.tenant_id AND u.hour >= w.s AND u.hour < w.e
         LEFT JOIN UNNEST($4::timestamptz[]) AS op(hour) ON op.hour = u.hour
         WHERE u.hour >= $5 AND u.hour < $6
         GROUP BY 1, 2, 3, 4",
    )
    .bind(&ids)
    .bind(&starts)
    .bind(&ends)
    .bind(off_peak)
    .bind(from)
    .bind(to)
    .fetch_all(&mut *conn)
    .await?;
    let mut out: HashMap<String, Vec<UsageGroup>> = HashMap::new();
    for (tenant, model, priority, off_peak, requests, prompt, cached, completion, gpu) in rows {
        out.entry(tenant).or_default().push(UsageGroup {
            model,
            priority,
            off_peak,
            requests,
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: completion,
            gpu_seconds: gpu,
        });
    }
    Ok(out)
}

/// Each owner's dedicated pools in its own window, from the replica reports
/// and the usage that ran on them: per model, the replicas' GPU-seconds
/// (busy and idle), the owner's own usage there in rating groups (an hour
/// in `off_peak` is off-peak), and the GPU-seconds other tenants ran there
/// (as the replicas reported it; see [`usage_contract::ReplicaReport`]).
pub async fn reservations(
    conn: &mut PgConnection,
    windows: &[Window],
    off_peak: &[DateTime<Utc>],
) -> Result<HashMap<String, Vec<crate::rating::Reservation>>, BillingError> {
    use std::collections::BTreeMap;

    use crate::rating::Reservation;

    let ids: Vec<&str> = windows.iter().map(|w| w.0.as_str()).collect();
    let starts: Vec<DateTime<Utc>> = windows.iter().map(|w| w.1).collect();
    let ends: Vec<DateTime<Utc>> = windows.iter().map(|w| w.2).collect();
    const WINDOWS: &str = "JOIN UNNEST($1::text[], $2::timestamptz[], $3::timestamptz[])
           AS w(tenant_id, s, e) ON w.tenant_id = d.owner_id AND d.hour >= w.s AND d.hour < w.e";
    let capacity: Vec<(String, String, Decimal)> = sqlx::query_as(&format!(
        "SELECT d.owner_id, d.model, sum(d.busy_gpu_seconds + d.idle_gpu_seconds)
         FROM dedicated_capacity_hourly d {WINDOWS} GROUP BY 1, 2"
    ))
    .bind(&ids)
    .bind(&starts)
    .bind(&ends)
    .fetch_all(&mut *conn)
    .await?;
    // Lent time as the replicas counted it (reports v2); an hour holding a
    // v1 report, which does not say, takes it from the events that ended
    // on the replicas, as before v2.
    let lent: Vec<(String, String, Decimal)> = sqlx::query_as(&format!(
        "SELECT owner_id, model, sum(lent) FROM (
             SELECT d.owner_id, d.model, d.lent_gpu_seconds AS lent
             FROM dedicated_capacity_hourly d {WINDOWS} WHERE d.reports_without_lent = 0
             UNION ALL
             SELECT d.owner_id, d.model, d.gpu_seconds
             FROM dedicated_usage_hourly d {WINDOWS}
             JOIN dedicated_capacity_hourly c
               ON c.owner_id = d.owner_id AND c.model = d.model AND c.hour = d.hour
             WHERE d.tenant_id <> d.owner_id AND c.reports_without_lent > 0
         ) l GROUP BY 1, 2"
    ))
    .bind(&ids)
    .bind(&starts)
    .bind(&ends)
    .fetch_all(&mut *conn)
    .await?;
    type Row = (String, String, i16, bool, i64, i64, i64, i64, Decimal);
    let own: Vec<Row> = sqlx::query_as(&format!(
        "SELECT d.owner_id, d.model, d.priority, op.hour IS NOT NULL,
                sum(d.requests)::bigint, sum(d.prompt_tokens)::bigint, sum(d.cached_tokens)::bigint,
                sum(d.completion_tokens)::bigint, sum(d.gpu_seconds)
         FROM dedicated_usage_hourly d {WINDOWS}
         LEFT JOIN UNNEST($4::timestamptz[]) AS op(hour) ON op.hour = d.hour
         WHERE d.tenant_id = d.owner_id
         GROUP BY 1, 2, 3, 4"
    ))
    .bind(&ids)
    .bind(&starts)
    .bind(&ends)
    .bind(off_peak)
    .fetch_all(&mut *conn)
    .await?;
    fn entry(
        map: &mut BTreeMap<(String, String), Reservation>,
        owner: String,
        model: String,
    ) -> &mut Reservation {
        map.entry((owner, model.clone()))
            .or_insert_with(|| Reservation {
                model,
                ..Reservation::default()
            })
    }
    let mut by_owner: BTreeMap<(String, String), Reservation> = BTreeMap::new();
    for (owner, model, seconds) in capacity {
        entry(&mut by_owner, owner, model).reserved_gpu_seconds += seconds;
    }
    for (owner, model, seconds) in lent {
        entry(&mut by_owner, owner, model).lent_gpu_seconds += seconds;
    }
    for (owner, model, priority, off_peak, requests, prompt, cached, completion, gpu) in own {
        entry(&mut by_owner, owner, model.clone())
            .own_usage
            .push(UsageGroup {
                model,
                priority,
                off_peak,
                requests,
                prompt_tokens: prompt,
                cached_tokens: cached,
                completion_tokens: completion,
                gpu_seconds: gpu,
            });
    }
    let mut out: HashMap<String, Vec<Reservation>> = HashMap::new();
    for ((owner, _), r) in by_owner {
        out.entry(owner).or_default().push(r);
    }
    Ok(out)
}

/// Billable GPU-seconds per tenant in `[start, end)` (the overhead split's weights).
pub async fn gpu_seconds_by_tenant(
    conn: &mut PgConnection,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> Result<Vec<(String, Decimal)>, BillingError> {
    Ok(sqlx::query_as(
        "SELECT tenant_id, sum(gpu_seconds) FROM usage_hourly
         WHERE hour >= $1 AND hour < $2 GROUP BY tenant_id",
    )
    .bind(start)
    .bind(end)
    .fetch_all(&mut *conn)
    .await?)
}

/// The fleet's idle GPU-seconds in `[start, end)`.
pub async fn idle_gpu_seconds(
    conn: &mut PgConnection,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> Result<Decimal, BillingError> {
    let (idle,): (Option<Decimal>,) = sqlx::query_as(
        "SELECT sum(gpu_seconds) FROM fleet_idle_hourly WHERE hour >= $1 AND hour < $2",
    )
    .bind(start)
    .bind(end)
    .fetch_one(&mut *conn)
    .await?;
    Ok(idle.unwrap_or_default())
}

/// One usage_hourly row.
#[derive(Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct HourRow {
    pub hour: DateTime<Utc>,
    pub model: String,
    pub priority: i16,
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    #[serde(with = "rust_decimal::serde::str")]
    pub gpu_seconds: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub preempted_gpu_seconds: Decimal,
    pub cancelled_requests: i64,
    pub errored_requests: i64,
}

/// A tenant's usage_hourly rows in `[from, to)`, by hour, model, priority.
pub async fn hours(
    conn: &mut PgConnection,
    tenant: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<HourRow>, BillingError> {
    Ok(sqlx::query_as(
        "SELECT hour, model, priority, requests, prompt_tokens, cached_tokens, completion_tokens,
                gpu_seconds, preempted_gpu_seconds, cancelled_requests, errored_requests
         FROM usage_hourly WHERE tenant_id = $1 AND hour >= $2 AND hour < $3
         ORDER BY hour, model, priority",
    )
    .bind(tenant)
    .bind(from)
    .bind(to)
    .fetch_all(&mut *conn)
    .await?)
}

/// Total GPU-seconds and preemption waste per tenant, ever (the metrics' counters).
pub async fn lifetime_by_tenant(
    conn: &mut PgConnection,
) -> Result<Vec<(String, Decimal, Decimal)>, BillingError> {
    Ok(sqlx::query_as(
        "SELECT tenant_id, sum(gpu_seconds), sum(preempted_gpu_seconds) FROM usage_hourly
         GROUP BY tenant_id ORDER BY tenant_id",
    )
    .fetch_all(&mut *conn)
    .await?)
}

/// One request's stored record (no money in it).
#[derive(Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct RequestRecord {
    #[sqlx(skip)]
    pub request_id: String,
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
    #[serde(with = "rust_decimal::serde::str")]
    pub gpu_seconds: Decimal,
    pub finish_reason: String,
    pub gateway_id: String,
    pub replica_id: String,
    pub stream: bool,
    pub ingested_at: DateTime<Utc>,
}

/// The request_log row of a request id, if request_log still holds it.
pub async fn request(
    conn: &mut PgConnection,
    id: Uuid,
) -> Result<Option<RequestRecord>, BillingError> {
    let record: Option<RequestRecord> = sqlx::query_as(
        "SELECT tenant_id, api_key_id, model, model_version, priority, started_at, first_token_at,
                finished_at, prompt_tokens, cached_tokens, completion_tokens, gpu_seconds,
                finish_reason, gateway_id, replica_id, stream, ingested_at
         FROM request_log WHERE request_id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(record.map(|mut r| {
        r.request_id = format!("req_{id}");
        r
    }))
}

/// Per-hour usage rows for a shadow bill: `(hour, model, priority, requests,
/// prompt, cached, completion, gpu_seconds)`.
pub type ShadowRow = (DateTime<Utc>, String, i16, i64, i64, i64, i64, Decimal);

/// A tenant's usage_hourly rows in `[from, to)`, unsorted, for rating per hour.
pub async fn shadow_rows(
    conn: &mut PgConnection,
    tenant: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<ShadowRow>, BillingError> {
    Ok(sqlx::query_as(
        "SELECT hour, model, priority, requests, prompt_tokens, cached_tokens, completion_tokens, gpu_seconds
         FROM usage_hourly WHERE tenant_id = $1 AND hour >= $2 AND hour < $3",
    )
    .bind(tenant)
    .bind(from)
    .bind(to)
    .fetch_all(&mut *conn)
    .await?)
}

/// Per-key rows for a shadow bill: `(api_key_id, hour, model, priority,
/// requests, prompt, cached, completion, gpu_seconds)`.
pub type KeyRow = (
    String,
    DateTime<Utc>,
    String,
    i16,
    i64,
    i64,
    i64,
    i64,
    Decimal,
);

/// A tenant's usage_key_hourly rows in `[from, to)`.
pub async fn key_rows(
    conn: &mut PgConnection,
    tenant: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<KeyRow>, BillingError> {
    Ok(sqlx::query_as(
        "SELECT api_key_id, hour, model, priority, requests, prompt_tokens, cached_tokens,
                completion_tokens, gpu_seconds
         FROM usage_key_hourly WHERE tenant_id = $1 AND hour >= $2 AND hour < $3",
    )
    .bind(tenant)
    .bind(from)
    .bind(to)
    .fetch_all(&mut *conn)
    .await?)
}
