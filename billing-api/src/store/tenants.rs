//! Tenants and their API keys in Postgres. Rows are turned into
//! [`Tenant`]s here; a stored row that does not parse (written before
//! billing-api validated tenants) is a server fault naming the tenant.

use chrono::NaiveDate;
use sqlx::PgConnection;

use crate::error::BillingError;
use crate::period::parse_zone;
use crate::rating::BillingMode;
use crate::tenant::Tenant;

/// Tenants by id (all of them when `ids` is `None`), ordered by id.
pub async fn list(
    conn: &mut PgConnection,
    ids: Option<&[String]>,
) -> Result<Vec<Tenant>, BillingError> {
    type Row = (String, String, String, bool, String, i16, Option<NaiveDate>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT tenant_id, display_name, billing_mode, shadow, time_zone, priority,
                chargeback_since FROM tenants
         WHERE $1::text[] IS NULL OR tenant_id = ANY($1) ORDER BY tenant_id",
    )
    .bind(ids)
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(
            |(tenant_id, display_name, mode, shadow, tz, priority, chargeback_since)| {
                Ok(Tenant {
                    billing_mode: BillingMode::parse(&mode).ok_or_else(|| {
                        BillingError::Internal(format!("tenant {tenant_id}: billing_mode {mode:?}"))
                    })?,
                    time_zone: parse_zone(&tz).map_err(|_| {
                        BillingError::Internal(format!("tenant {tenant_id}: time_zone {tz:?}"))
                    })?,
                    tenant_id,
                    display_name,
                    shadow,
                    priority,
                    chargeback_since,
                })
            },
        )
        .collect()
}

/// One tenant, if it exists.
pub async fn get(conn: &mut PgConnection, id: &str) -> Result<Option<Tenant>, BillingError> {
    let ids = [id.to_owned()];
    Ok(list(conn, Some(&ids)).await?.pop())
}

/// One page of tenant ids, in order, after `cursor` (from the first when `None`).
pub async fn page(
    conn: &mut PgConnection,
    cursor: Option<&str>,
    limit: i64,
) -> Result<Vec<String>, BillingError> {
    let page: Vec<(String,)> = sqlx::query_as(
        "SELECT tenant_id FROM tenants WHERE $1::text IS NULL OR tenant_id > $1 ORDER BY tenant_id LIMIT $2",
    )
    .bind(cursor)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    Ok(page.into_iter().map(|(t,)| t).collect())
}

/// A tenant's row as administration writes it (already validated).
pub struct TenantRow<'a> {
    pub tenant_id: &'a str,
    pub display_name: &'a str,
    pub plan: &'a str,
    pub priority: i16,
    pub wfq_weight: i32,
    pub billing_mode: &'a str,
    pub shadow: bool,
    pub time_zone: &'a str,
    pub requests_per_second: i32,
    pub burst: i32,
    pub max_concurrency: i32,
    pub max_kv_gib_seconds: Option<i64>,
    pub slo_ttft_p95_ms: Option<i32>,
    pub slo_e2e_p95_ms: Option<i32>,
    pub slo_availability_bp: Option<i32>,
    pub slo_best_effort: bool,
    /// Share of each model pool's KV kept for it, basis points.
    pub reserved_floor_bp: Option<i32>,
    /// The first day of real chargeback (see [`crate::grace`]).
    pub chargeback_since: Option<NaiveDate>,
}

/// Upserts a tenant.
pub async fn put(conn: &mut PgConnection, t: &TenantRow<'_>) -> Result<(), BillingError> {
    sqlx::query(
        "INSERT INTO tenants (tenant_id, display_name, plan, priority, wfq_weight, billing_mode,
             shadow, time_zone, requests_per_second, burst, max_concurrency,
             max_kv_gib_seconds, slo_ttft_p95_ms, slo_e2e_p95_ms, slo_availability_bp,
             slo_best_effort, reserved_floor_bp, chargeback_since)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
             $18)
         ON CONFLICT (tenant_id) DO UPDATE SET display_name = EXCLUDED.display_name,
             plan = EXCLUDED.plan, priority = EXCLUDED.priority,
             wfq_weight = EXCLUDED.wfq_weight, billing_mode = EXCLUDED.billing_mode,
             shadow = EXCLUDED.shadow, time_zone = EXCLUDED.time_zone,
             requests_per_second = EXCLUDED.requests_per_second, burst = EXCLUDED.burst,
             max_concurrency = EXCLUDED.max_concurrency,
             max_kv_gib_seconds = EXCLUDED.max_kv_gib_seconds,
             slo_ttft_p95_ms = EXCLUDED.slo_ttft_p95_ms,
             slo_e2e_p95_ms = EXCLUDED.slo_e2e_p95_ms,
             slo_availability_bp = EXCLUDED.slo_availability_bp,
             slo_best_effort = EXCLUDED.slo_best_effort,
             reserved_floor_bp = EXCLUDED.reserved_floor_bp,
             chargeback_since = EXCLUDED.chargeback_since, updated_at = now()",
    )
    .bind(t.tenant_id)
    .bind(t.display_name)
    .bind(t.plan)
    .bind(t.priority)
    .bind(t.wfq_weight)
    .bind(t.billing_mode)
    .bind(t.shadow)
    .bind(t.time_zone)
    .bind(t.requests_per_second)
    .bind(t.burst)
    .bind(t.max_concurrency)
    .bind(t.max_kv_gib_seconds)
    .bind(t.slo_ttft_p95_ms)
    .bind(t.slo_e2e_p95_ms)
    .bind(t.slo_availability_bp)
    .bind(t.slo_best_effort)
    .bind(t.reserved_floor_bp)
    .bind(t.chargeback_since)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Upserts an API key (its SHA-256 hash and first characters only).
pub async fn put_key(
    conn: &mut PgConnection,
    api_key_id: &str,
    tenant_id: &str,
    key_hash: &[u8; 32],
    key_prefix: &str,
) -> Result<(), BillingError> {
    sqlx::query(
        "INSERT INTO api_keys (api_key_id, tenant_id, key_hash, key_prefix)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (api_key_id) DO UPDATE SET key_hash = EXCLUDED.key_hash,
             key_prefix = EXCLUDED.key_prefix, tenant_id = EXCLUDED.tenant_id",
    )
    .bind(api_key_id)
    .bind(tenant_id)
    .bind(key_hash.as_slice())
    .bind(key_prefix)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Upserts a per-model limit.
pub async fn put_limit(
    conn: &mut PgConnection,
    tenant_id: &str,
    model: &str,
    rpm: Option<i32>,
    tpm: Option<i64>,
    max_context: Option<i32>,
    max_output: Option<i32>,
) -> Result<(), BillingError> {
    sqlx::query(
        "INSERT INTO limits (tenant_id, model, rpm, tpm, max_context, max_output)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (tenant_id, model) DO UPDATE SET rpm = EXCLUDED.rpm,
             tpm = EXCLUDED.tpm, max_context = EXCLUDED.max_context,
             max_output = EXCLUDED.max_output",
    )
    .bind(tenant_id)
    .bind(model)
    .bind(rpm)
    .bind(tpm)
    .bind(max_context)
    .bind(max_output)
    .execute(&mut *conn)
    .await?;
    Ok(())
}
