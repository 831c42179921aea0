//! Who may call: tenants and their API keys, from Postgres, cached in
//! memory and refreshed off the request path (a revoked key stops working
//! within one refresh interval). Keys are looked up by their SHA-256; the
//! key itself is never stored.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::PgPool;

pub use admission::caller::{Caller, ModelLimits, RequestRate};

/// The SHA-256 of an API key, as stored in `api_keys.key_hash`.
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

#[derive(sqlx::FromRow)]
struct KeyRow {
    key_hash: Vec<u8>,
    tenant_id: String,
    api_key_id: String,
    priority: i16,
    wfq_weight: i32,
    max_concurrency: Option<i32>,
    max_kv_gib_seconds: Option<i64>,
    slo_ttft_p95_ms: Option<i32>,
    slo_e2e_p95_ms: Option<i32>,
    slo_availability_bp: Option<i32>,
    requests_per_second: Option<i32>,
    burst: Option<i32>,
}

#[derive(sqlx::FromRow)]
struct LimitRow {
    tenant_id: String,
    model: String,
    rpm: Option<i32>,
    tpm: Option<i64>,
    max_context: Option<i32>,
    max_output: Option<i32>,
}

/// A positive database integer, or none (the columns' CHECKs keep them > 0).
fn positive<T: TryInto<u64>>(v: Option<T>) -> Option<u64> {
    v.and_then(|v| v.try_into().ok()).filter(|v| *v > 0)
}

fn positive_u32<T: TryInto<u64>>(v: Option<T>) -> Option<u32> {
    positive(v).map(|v| u32::try_from(v).unwrap_or(u32::MAX))
}

/// The in-memory view of active keys, and the tenants' reserved floors.
#[derive(Clone, Default)]
pub struct Registry {
    by_hash: Arc<RwLock<HashMap<[u8; 32], Caller>>>,
    /// Basis points of each model pool, by tenant (those with a floor).
    floors: Arc<RwLock<HashMap<String, u32>>>,
}

impl Registry {
    /// The caller a bearer key belongs to, if the key is active.
    pub fn authenticate(&self, key: &str) -> Option<Caller> {
        let hash = hash_key(key);
        self.by_hash.read().ok()?.get(&hash).cloned()
    }

    /// Registers one key directly, without Postgres (benchmarks, tests); the
    /// next [`Registry::refresh`] replaces it.
    pub fn insert(&self, key: &str, caller: Caller) {
        if let Ok(mut guard) = self.by_hash.write() {
            guard.insert(hash_key(key), caller);
        }
    }

    /// The tenants' reserved floors at the last refresh (basis points).
    pub fn floors(&self) -> HashMap<String, u32> {
        self.floors.read().map(|f| f.clone()).unwrap_or_default()
    }

    /// Reloads every active key, and the reserved floors, from Postgres.
    pub async fn refresh(&self, pool: &PgPool) -> Result<usize, sqlx::Error> {
        let floors: Vec<(String, i32)> = sqlx::query_as(
            "SELECT tenant_id, reserved_floor_bp FROM tenants WHERE reserved_floor_bp IS NOT NULL",
        )
        .fetch_all(pool)
        .await?;
        let rows: Vec<KeyRow> = sqlx::query_as(
            "SELECT k.key_hash, k.tenant_id, k.api_key_id, t.priority, t.wfq_weight, t.max_concurrency,
                    t.max_kv_gib_seconds, t.slo_ttft_p95_ms, t.slo_e2e_p95_ms,
                    t.slo_availability_bp, t.requests_per_second, t.burst
             FROM api_keys k
             JOIN tenants t USING (tenant_id)
             WHERE k.revoked_at IS NULL",
        )
        .fetch_all(pool)
        .await?;
        let limit_rows: Vec<LimitRow> = sqlx::query_as(
            "SELECT tenant_id, model, rpm, tpm, max_context, max_output FROM limits",
        )
        .fetch_all(pool)
        .await?;
        let mut by_tenant: HashMap<String, HashMap<String, ModelLimits>> = HashMap::new();
        for l in limit_rows {
            by_tenant.entry(l.tenant_id).or_default().insert(
                l.model,
                ModelLimits {
                    rpm: positive_u32(l.rpm),
                    tpm: positive(l.tpm),
                    max_context: positive_u32(l.max_context),
                    max_output: positive_u32(l.max_output),
                },
            );
        }
        let by_tenant: HashMap<String, Arc<HashMap<String, ModelLimits>>> = by_tenant
            .into_iter()
            .map(|(t, m)| (t, Arc::new(m)))
            .collect();
        let none = Arc::new(HashMap::new());
        let mut map = HashMap::with_capacity(rows.len());
        for row in rows {
            let Ok(hash) = <[u8; 32]>::try_from(row.key_hash.as_slice()) else {
                continue;
            };
            map.insert(
                hash,
                Caller {
                    api_key_id: row.api_key_id,
                    priority: row.priority,
                    weight: positive_u32(Some(row.wfq_weight)).unwrap_or(1),
                    max_concurrency: positive_u32(row.max_concurrency),
                    max_kv_mib_seconds: positive(row.max_kv_gib_seconds)
                        .map(|g| g.saturating_mul(1024)),
                    slo: fleet::slo::Slo {
                        ttft_p95_ms: positive_u32(row.slo_ttft_p95_ms),
                        e2e_p95_ms: positive_u32(row.slo_e2e_p95_ms),
                        availability_bp: positive_u32(row.slo_availability_bp),
                    },
                    // A rate without a burst may burst one second's worth.
                    rate: positive_u32(row.requests_per_second).map(|per_second| RequestRate {
                        per_second,
                        burst: positive_u32(row.burst).unwrap_or(per_second),
                    }),
                    limits: by_tenant
                        .get(&row.tenant_id)
                        .cloned()
                        .unwrap_or_else(|| none.clone()),
                    tenant_id: row.tenant_id,
                },
            );
        }
        let n = map.len();
        if let Ok(mut guard) = self.by_hash.write() {
            *guard = map;
        }
        if let Ok(mut guard) = self.floors.write() {
            *guard = floors
                .into_iter()
                .filter_map(|(t, bp)| Some((t, positive_u32(Some(bp))?)))
                .collect();
        }
        Ok(n)
    }

    /// Refreshes every `every` in the background, calling `refreshed`
    /// after each good refresh; a failed refresh keeps the last good view.
    pub fn spawn_refresh(
        &self,
        pool: PgPool,
        every: Duration,
        refreshed: impl Fn(&Self) + Send + 'static,
    ) {
        let registry = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                match registry.refresh(&pool).await {
                    Ok(_) => refreshed(&registry),
                    Err(e) => {
                        tracing::warn!(error = %e, "key refresh failed; keeping the last view");
                    }
                }
            }
        });
    }
}
