//! Seeds tenants, keys and limits from a YAML file shaped like the
//! reference tenant config. Upserts, so seeding twice is harmless. Keys in
//! the file are hashed on the way in; only hashes reach Postgres.

use std::path::Path;

use serde::Deserialize;
use sqlx::PgPool;

use crate::error::GatewayError;
use crate::tenants::hash_key;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedFile {
    pub tenants: Vec<TenantSeed>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TenantSeed {
    pub name: String,
    pub display_name: Option<String>,
    pub plan: String,
    pub priority: i16,
    pub weight: i32,
    pub rate_limit: RateLimit,
    pub max_concurrency: i32,
    /// Cap on KV·seconds in flight (GiB·s), all gateways together.
    #[serde(default)]
    pub max_kv_gib_seconds: Option<i64>,
    pub billing_mode: String,
    #[serde(default = "yes")]
    pub shadow: bool,
    #[serde(default = "utc")]
    pub time_zone: String,
    #[serde(default)]
    pub slo: SloSeed,
    #[serde(default)]
    pub keys: Vec<KeySeed>,
    #[serde(default)]
    pub limits: Vec<LimitSeed>,
}

/// A tenant's `slo:` (see `fleet::slo::Slo`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SloSeed {
    pub ttft_p95_ms: Option<u32>,
    pub e2e_p95_ms: Option<u32>,
    /// A percentage as text, e.g. `"99.9"`.
    pub availability: Option<String>,
    #[serde(default)]
    pub best_effort: bool,
}

impl SloSeed {
    pub fn typed(&self) -> Result<fleet::slo::Slo, fleet::slo::SloError> {
        fleet::slo::Slo::new(
            self.ttft_p95_ms,
            self.e2e_p95_ms,
            self.availability.as_deref(),
            self.best_effort,
        )
    }
}

fn yes() -> bool {
    true
}

fn utc() -> String {
    "UTC".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RateLimit {
    pub requests_per_second: i32,
    pub burst: i32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySeed {
    pub id: String,
    /// The key itself: fine in a demo file, hashed before it is stored.
    pub key: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LimitSeed {
    pub model: String,
    pub rpm: Option<i32>,
    pub tpm: Option<i64>,
    pub max_context: Option<i32>,
    pub max_output: Option<i32>,
}

/// Reads and parses a seed file, naming the file and the problem on error.
pub fn load(path: &Path) -> Result<SeedFile, GatewayError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        GatewayError::Config(format!("GATEWAY_TENANTS_FILE {}: {e}", path.display()))
    })?;
    let file: SeedFile = serde_norway::from_str(&text).map_err(|e| {
        GatewayError::Config(format!("GATEWAY_TENANTS_FILE {}: {e}", path.display()))
    })?;
    for t in &file.tenants {
        t.slo.typed().map_err(|e| {
            GatewayError::Config(format!(
                "GATEWAY_TENANTS_FILE {}: tenant {:?}: {e}",
                path.display(),
                t.name
            ))
        })?;
    }
    Ok(file)
}

/// Upserts every tenant, key and limit in one transaction.
pub async fn apply(pool: &PgPool, seed: &SeedFile) -> Result<(), GatewayError> {
    let mut tx = pool.begin().await?;
    for t in &seed.tenants {
        let slo = t
            .slo
            .typed()
            .map_err(|e| GatewayError::Config(format!("tenant {:?}: {e}", t.name)))?;
        sqlx::query(
            "INSERT INTO tenants (tenant_id, display_name, plan, priority, wfq_weight, billing_mode,
                 shadow, time_zone, requests_per_second, burst, max_concurrency,
                 max_kv_gib_seconds, slo_ttft_p95_ms, slo_e2e_p95_ms, slo_availability_bp,
                 slo_best_effort)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
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
                 slo_best_effort = EXCLUDED.slo_best_effort, updated_at = now()",
        )
        .bind(&t.name)
        .bind(t.display_name.as_deref().unwrap_or(&t.name))
        .bind(&t.plan)
        .bind(t.priority)
        .bind(t.weight)
        .bind(&t.billing_mode)
        .bind(t.shadow)
        .bind(&t.time_zone)
        .bind(t.rate_limit.requests_per_second)
        .bind(t.rate_limit.burst)
        .bind(t.max_concurrency)
        .bind(t.max_kv_gib_seconds)
        .bind(t.slo.ttft_p95_ms.map(|v| v as i32))
        .bind(t.slo.e2e_p95_ms.map(|v| v as i32))
        .bind(slo.availability_bp.map(|v| v as i32))
        .bind(t.slo.best_effort)
        .execute(&mut *tx)
        .await
        .map_err(|e| seed_error(&t.name, e))?;
        for k in &t.keys {
            let prefix: String = k.key.chars().take(8).collect();
            sqlx::query(
                "INSERT INTO api_keys (api_key_id, tenant_id, key_hash, key_prefix)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (api_key_id) DO UPDATE SET key_hash = EXCLUDED.key_hash,
                     key_prefix = EXCLUDED.key_prefix, tenant_id = EXCLUDED.tenant_id",
            )
            .bind(&k.id)
            .bind(&t.name)
            .bind(hash_key(&k.key).as_slice())
            .bind(prefix)
            .execute(&mut *tx)
            .await
            .map_err(|e| seed_error(&t.name, e))?;
        }
        for l in &t.limits {
            sqlx::query(
                "INSERT INTO limits (tenant_id, model, rpm, tpm, max_context, max_output)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (tenant_id, model) DO UPDATE SET rpm = EXCLUDED.rpm,
                     tpm = EXCLUDED.tpm, max_context = EXCLUDED.max_context,
                     max_output = EXCLUDED.max_output",
            )
            .bind(&t.name)
            .bind(&l.model)
            .bind(l.rpm)
            .bind(l.tpm)
            .bind(l.max_context)
            .bind(l.max_output)
            .execute(&mut *tx)
            .await
            .map_err(|e| seed_error(&t.name, e))?;
        }
    }
    tx.commit().await?;
    Ok(())
}

fn seed_error(tenant: &str, e: sqlx::Error) -> GatewayError {
    GatewayError::Config(format!(
        "GATEWAY_TENANTS_FILE: tenant {tenant:?} was rejected: {e}"
    ))
}
