//! A fresh database for one benchmark run, dropped at the end.
//!
//! This moves to the `devstack` crate, which provides fresh databases for
//! tests, benchmarks and the demo; until then the benchmarks share this copy.

use std::time::Duration;

use anyhow::{Context, Result};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

/// A database this run created; [`FreshDatabase::finish`] drops it.
pub struct FreshDatabase {
    server: PgConnectOptions,
    name: String,
    url: String,
}

impl FreshDatabase {
    /// Creates database `name` on the server `server_url` points at (the
    /// database named in `server_url` is not used). Fails if it exists.
    pub async fn create(server_url: &str, name: &str) -> Result<Self> {
        let server: PgConnectOptions = server_url.parse().context("DATABASE_URL")?;
        let mut admin = admin(&server).await?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .with_context(|| format!("create database {name}"))?;
        admin.close().await?;
        let url = server.clone().database(name).to_url_lossy().to_string();
        Ok(Self {
            server,
            name: name.to_owned(),
            url,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The URL of this database (what a service's `DATABASE_URL` is set to).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A pool of 4 connections once the schema is applied: the start-up
    /// connection every service uses (`schema::connect`).
    pub async fn connect(&self) -> Result<PgPool> {
        Ok(schema::connect(&self.url, 4, Duration::from_secs(10)).await?)
    }

    /// Drops the database (closing any connection still on it), or with
    /// `keep` leaves it and prints its name.
    #[expect(clippy::print_stdout, reason = "a benchmark prints its report")]
    pub async fn finish(self, keep: bool) -> Result<()> {
        if keep {
            println!("kept database {}", self.name);
            return Ok(());
        }
        let mut admin = admin(&self.server).await?;
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ))
        .execute(&mut admin)
        .await
        .with_context(|| format!("drop database {}", self.name))?;
        admin.close().await?;
        Ok(())
    }
}

/// A connection to the server's `postgres` database.
async fn admin(server: &PgConnectOptions) -> Result<PgConnection> {
    server
        .clone()
        .database("postgres")
        .connect()
        .await
        .context("cannot reach Postgres: scripts/stack.sh up, or set DATABASE_URL")
}
