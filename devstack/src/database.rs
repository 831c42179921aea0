//! A fresh database per test, bench or demo run, dropped when its handle
//! is: `mt_<name>_<random>` on a server, with Meterline's migrations
//! applied (or empty, for a private broker's log).
//!
//! Dropping waits for `DROP DATABASE … WITH (FORCE)` (which also cuts the
//! connections services still hold), on a thread of its own so that it
//! works from async code and from a panicking test alike. Set
//! `METERLINE_KEEP_DATABASES=1` to keep them for a post-mortem; `devstack
//! down` drops any `mt_` database a killed run left behind.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use crate::error::{DevstackError, Result};
use crate::postgres;

/// The prefix of every database the dev stack creates for a run.
pub const PREFIX: &str = "mt_";

/// A database of our own; dropped with the handle.
pub struct Database {
    /// Its URL, for the services' `DATABASE_URL`.
    pub url: String,
    /// A small pool on it (4 connections) for the caller's own queries.
    pub pool: PgPool,
    name: String,
    admin: PgConnectOptions,
    kept: bool,
}

/// A random suffix that keeps parallel runs' names apart.
pub fn unique_suffix() -> String {
    let s = uuid::Uuid::now_v7().simple().to_string();
    s[s.len() - 10..].to_owned()
}

impl Database {
    /// A fresh, migrated database on the shared server ([`postgres::shared_url`]).
    pub async fn fresh(name: &str) -> Result<Self> {
        Self::fresh_on(&postgres::shared_url(), name).await
    }

    /// A fresh, migrated database on the server of `server_url`.
    pub async fn fresh_on(server_url: &str, name: &str) -> Result<Self> {
        let db = Self::empty_on(server_url, name).await?;
        schema::MIGRATOR
            .run(&db.pool)
            .await
            .map_err(|source| DevstackError::Migrate {
                database: db.name.clone(),
                source,
            })?;
        Ok(db)
    }

    /// A fresh database without Meterline's schema (a broker's storage).
    pub async fn empty_on(server_url: &str, name: &str) -> Result<Self> {
        let base = postgres::parse(server_url, "DATABASE_URL")?;
        let at = postgres::address(&base);
        let name = format!("{PREFIX}{}_{}", sanitize(name), unique_suffix());
        let admin = base.clone().database("postgres");
        let mut conn = admin
            .connect()
            .await
            .map_err(|source| DevstackError::Postgres {
                at: format!("{at} (start the stack with scripts/stack.sh up, or set DATABASE_URL)"),
                source,
            })?;
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut conn)
            .await
            .map_err(DevstackError::pg(format!("{at}: CREATE DATABASE {name}")))?;
        let options = base.database(&name);
        // Built from the caller's URL, not `to_url_lossy` (which adds sqlx's
        // own parameters that other clients, the broker's among them, refuse).
        let url = postgres::with_database(server_url, &name);
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
            .map_err(DevstackError::pg(format!("{at}/{name}")))?;
        Ok(Self {
            url,
            pool,
            name,
            admin,
            kept: false,
        })
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Keeps the database when the handle is dropped (a bench's `--keep`).
    pub fn keep(&mut self) {
        self.kept = true;
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        if self.kept || std::env::var("METERLINE_KEEP_DATABASES").is_ok_and(|v| v == "1") {
            return;
        }
        let admin = self.admin.clone();
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || drop_database(admin, &name)).join();
        if let Ok(Err(e)) = dropped {
            eprintln!("warning: could not drop database {}: {e}", self.name);
        }
    }
}

fn drop_database(admin: PgConnectOptions, name: &str) -> Result<(), sqlx::Error> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut conn = admin.connect().await?;
        sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .execute(&mut conn)
            .await?;
        Ok(())
    })
}

/// Drops every database named `mt_…` on the server of `server_url` (what
/// killed runs left behind). Returns how many.
pub async fn drop_leftovers(server_url: &str) -> Result<usize> {
    let base = postgres::parse(server_url, "DATABASE_URL")?;
    let at = postgres::address(&base);
    let mut conn = base
        .database("postgres")
        .connect()
        .await
        .map_err(DevstackError::pg(at.clone()))?;
    let names: Vec<(String,)> =
        sqlx::query_as("SELECT datname FROM pg_database WHERE datname LIKE 'mt\\_%'")
            .fetch_all(&mut conn)
            .await
            .map_err(DevstackError::pg(at.clone()))?;
    for (name,) in &names {
        sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .execute(&mut conn)
            .await
            .map_err(DevstackError::pg(format!("{at}: DROP DATABASE {name}")))?;
    }
    Ok(names.len())
}

/// Lowercase letters, digits and `_` only (a database name unquoted).
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(30)
        .collect()
}
