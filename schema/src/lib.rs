//! The schema, and how a service reaches it.
//!
//! `migrations/` at the repository root is the only place the schema
//! changes; [`MIGRATOR`] embeds it. Every service calls [`connect`] at
//! start-up: it waits for Postgres (a service started before its database
//! should wait, not crash), then applies pending migrations under sqlx's
//! advisory lock, so several services starting at once are harmless.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

/// The advisory lock that ingest transactions hold shared and rollup holds
/// exclusively while it closes hours or drops request_log partitions, so
/// neither happens in the middle of a batch. Billing holds it exclusively
/// while it finalizes an invoice, so the invoice's `finalized_at` divides
/// stored usage exactly by `ingested_at` (before: on it; after: not).
pub const USAGE_LOCK: i64 = 0x6d65_7465_726c;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("DATABASE_URL is not a Postgres URL: {0}")]
    BadUrl(sqlx::Error),
    #[error("DATABASE_URL must start with postgres:// or postgresql://")]
    BadScheme,
    #[error("postgres did not answer within {0:?}: {1}")]
    Unreachable(Duration, sqlx::Error),
    #[error("applying migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// Parses a Postgres URL, refusing other schemes (sqlx alone would accept
/// `mysql://…` and then retry a connection that can never work).
pub fn parse_url(url: &str) -> Result<PgConnectOptions, SchemaError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(SchemaError::BadScheme);
    }
    url.parse().map_err(SchemaError::BadUrl)
}

/// Connects (retrying for up to `wait`) and applies the migrations.
pub async fn connect(
    url: &str,
    max_connections: u32,
    wait: Duration,
) -> Result<PgPool, SchemaError> {
    let options = parse_url(url)?;
    let deadline = tokio::time::Instant::now() + wait;
    let mut backoff = Duration::from_millis(100);
    let pool = loop {
        let attempt = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options.clone())
            .await;
        match attempt {
            Ok(pool) => break pool,
            Err(e) if tokio::time::Instant::now() + backoff < deadline => {
                tracing::warn!(error = %e, retry_in = ?backoff, "postgres not reachable; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(SchemaError::Unreachable(wait, e)),
        }
    };
    MIGRATOR.run(&pool).await?;
    Ok(pool)
}
