//! Who may call: tenants and their API keys, from Postgres, cached in
//! memory and refreshed off the request path (a revoked key stops working
//! within one refresh interval). Keys are looked up by their SHA-256; the
//! key itself is never stored.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::PgPool;

/// What the gateway needs to know about a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub tenant_id: String,
    pub api_key_id: String,
    pub priority: i16,
    pub max_context: Option<i32>,
    pub max_output: Option<i32>,
}

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
    max_context: Option<i32>,
    max_output: Option<i32>,
}

/// The in-memory view of active keys.
#[derive(Clone, Default)]
pub struct Registry {
    by_hash: Arc<RwLock<HashMap<[u8; 32], Caller>>>,
}

impl Registry {
    /// The caller a bearer key belongs to, if the key is active.
    pub fn authenticate(&self, key: &str) -> Option<Caller> {
        let hash = hash_key(key);
        self.by_hash.read().ok()?.get(&hash).cloned()
    }

    /// Reloads every active key from Postgres.
    pub async fn refresh(&self, pool: &PgPool) -> Result<usize, sqlx::Error> {
        let rows: Vec<KeyRow> = sqlx::query_as(
            "SELECT k.key_hash, k.tenant_id, k.api_key_id, t.priority, l.max_context, l.max_output
             FROM api_keys k
             JOIN tenants t USING (tenant_id)
             LEFT JOIN limits l ON l.tenant_id = k.tenant_id AND l.model = '*'
             WHERE k.revoked_at IS NULL",
        )
        .fetch_all(pool)
        .await?;
        let mut map = HashMap::with_capacity(rows.len());
        for row in rows {
            let Ok(hash) = <[u8; 32]>::try_from(row.key_hash.as_slice()) else {
                continue;
            };
            map.insert(
                hash,
                Caller {
                    tenant_id: row.tenant_id,
                    api_key_id: row.api_key_id,
                    priority: row.priority,
                    max_context: row.max_context,
                    max_output: row.max_output,
                },
            );
        }
        let n = map.len();
        if let Ok(mut guard) = self.by_hash.write() {
            *guard = map;
        }
        Ok(n)
    }

    /// Refreshes every `every` in the background; a failed refresh keeps the
    /// last good view.
    pub fn spawn_refresh(&self, pool: PgPool, every: Duration) {
        let registry = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                if let Err(e) = registry.refresh(&pool).await {
                    tracing::warn!(error = %e, "key refresh failed; keeping the last view");
                }
            }
        });
    }
}
