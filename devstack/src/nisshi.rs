//! The Kafka-compatible broker of the local stack, Nisshi (from
//! crates.io): its binary, built once into a cache outside the checkout
//! and never rebuilt, and a [`PrivateBroker`] for each test that stops,
//! kills or restarts the broker.
//!
//! A broker keeps its log in a Postgres database (`--storage-engine
//! postgres://…`): a private broker gets a fresh database on the shared
//! server, so a SIGKILL and restart keeps every acknowledged record, as a
//! real Kafka's disk would.

use std::path::PathBuf;
use std::time::Duration;

use crate::cached_install::{self, CachedCrate};
use crate::database::Database;
use crate::error::{DevstackError, Result};
use crate::health::{free_port, wait_tcp};
use crate::process::{Service, Spec};

/// The Nisshi version the stack runs (`NISSHI_VERSION` overrides it).
pub const DEFAULT_VERSION: &str = "0.8.1";

/// The cached broker binary, building it first if it is not there (about
/// 17 minutes on 2 cores).
pub fn ensure_binary() -> Result<PathBuf> {
    let version = std::env::var("NISSHI_VERSION").unwrap_or_else(|_| DEFAULT_VERSION.into());
    cached_install::ensure(CachedCrate {
        krate: "nisshi",
        version: &version,
        install_args: &[
            "--ignore-rust-version",
            "--no-default-features",
            "--features",
            "dynostore,postgres",
        ],
        what: "the broker",
        takes: "about 17 minutes",
    })
}

/// The command of a broker listening on `127.0.0.1:port`, keeping its log
/// in `storage_url`, running in `dir` (Nisshi reads a `.env` file from its
/// working directory, so it must not be the checkout).
pub fn broker_spec(
    name: &str,
    bin: PathBuf,
    storage_url: &str,
    port: u16,
    dir: &std::path::Path,
    log: PathBuf,
) -> Spec {
    let listener = format!("tcp://127.0.0.1:{port}");
    Spec::new(name, bin, log)
        .args(["broker", "--storage-engine", storage_url, "--listener-url"])
        .args([
            listener.as_str(),
            "--advertised-listener-url",
            listener.as_str(),
        ])
        .envs([
            ("NO_COLOR", "1".to_owned()),
            (
                "RUST_LOG",
                std::env::var("NISSHI_RUST_LOG").unwrap_or_else(|_| "warn".into()),
            ),
        ])
        .cwd(dir)
}

/// Nisshi's storage URL for a database URL (`postgres://…`): it wants a
/// password in the URL and no TLS.
pub fn storage_url(database_url: &str) -> String {
    let with_password = match database_url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((user, host)) if !user.contains(':') => {
                format!("{scheme}://{user}:postgres@{host}")
            }
            _ => database_url.to_owned(),
        },
        None => database_url.to_owned(),
    };
    if with_password.contains("sslmode=") {
        with_password
    } else if with_password.contains('?') {
        format!("{with_password}&sslmode=disable")
    } else {
        format!("{with_password}?sslmode=disable")
    }
}

/// A broker of one test's own, on a free port, its log in a fresh
/// database on the shared Postgres; killed and its database dropped when
/// the handle is dropped.
pub struct PrivateBroker {
    service: Service,
    port: u16,
    /// Dropped after the broker (field order) so the broker never sees its
    /// database vanish under it.
    _storage: Database,
    _dir: tempfile::TempDir,
}

impl PrivateBroker {
    /// Starts a broker, its log on the shared Postgres, and waits until it
    /// accepts connections.
    pub async fn start() -> Result<Self> {
        Self::start_on(&crate::postgres::shared_url()).await
    }

    /// Starts a broker keeping its log in a fresh database on the server of
    /// `server_url` (a [`PrivatePostgres`](crate::PrivatePostgres), so that
    /// crashing that server crashes the broker's storage too).
    pub async fn start_on(server_url: &str) -> Result<Self> {
        let bin = ensure_binary()?;
        let storage = Database::empty_on(server_url, "broker").await?;
        let dir = tempfile::Builder::new()
            .prefix("meterline-nisshi-")
            .tempdir()
            .map_err(DevstackError::io(
                "a temporary directory for a private broker",
            ))?;
        let port = free_port()?;
        let spec = broker_spec(
            "private broker",
            bin,
            &storage_url(&storage.url),
            port,
            dir.path(),
            dir.path().join("nisshi.log"),
        );
        let mut broker = Self {
            service: Service::spawn(spec)?,
            port,
            _storage: storage,
            _dir: dir,
        };
        broker.wait_ready().await?;
        Ok(broker)
    }

    /// Its address, for a service's `KAFKA_BROKERS`.
    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGKILL: what it acknowledged is in its database; what it had not
    /// is lost to the producer, which must resend.
    pub async fn kill9(&mut self) {
        self.service.kill9().await;
    }

    /// SIGTERM and wait (SIGKILL after 10 s): the broker is down until
    /// [`restart`](Self::restart).
    pub async fn stop(&mut self) {
        self.service.terminate(Duration::from_secs(10)).await;
    }

    /// Starts it again on the same port and storage, waiting until it
    /// accepts connections.
    pub async fn restart(&mut self) -> Result<()> {
        self.service.restart()?;
        self.wait_ready().await
    }

    /// Its log so far.
    pub fn log_tail(&self) -> String {
        self.service.log_tail()
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let addr = self.brokers();
        wait_tcp(
            "private broker",
            &addr,
            Some(&mut self.service),
            Duration::from_secs(60),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_urls_carry_a_password_and_no_tls() {
        assert_eq!(
            storage_url("postgres://postgres@127.0.0.1:5432/mt_broker_1"),
            "postgres://postgres:postgres@127.0.0.1:5432/mt_broker_1?sslmode=disable"
        );
        assert_eq!(
            storage_url("postgres://u:p@db:5432/x?application_name=a"),
            "postgres://u:p@db:5432/x?application_name=a&sslmode=disable"
        );
    }
}
