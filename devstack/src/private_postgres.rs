//! A Postgres cluster of one test's own, for the tests that crash Postgres
//! (a [`Cluster`] in a temporary directory, run as a [`Service`]).

use std::time::Duration;

use crate::database::Database;
use crate::error::{DevstackError, Result};
use crate::health::free_port;
use crate::postgres::Cluster;
use crate::process::{self, Service};

/// A Postgres cluster of one test's own, for tests that crash Postgres:
/// in a temporary directory, on a free port, its postmaster in its own
/// process group (so [`kill_all`](Self::kill_all) takes every backend, the
/// WAL writer and the checkpointer at once, as a power loss would), and
/// started again on the same data by [`restart`](Self::restart). Removed
/// when dropped.
pub struct PrivatePostgres {
    cluster: Cluster,
    service: Service,
    /// Holds the cluster's files; dropped after the server is killed.
    _dir: tempfile::TempDir,
}

impl PrivatePostgres {
    /// Creates and starts a cluster with `settings` (`name=value`).
    pub async fn start(settings: &[&str]) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("meterline-pg-")
            .tempdir()
            .map_err(DevstackError::io(
                "a temporary directory for a private Postgres",
            ))?;
        let cluster = Cluster::init(dir.path(), free_port()?, settings)?;
        let mut service = Service::spawn(cluster.spec("private postgres"))?;
        cluster
            .wait_ready(Some(&mut service), Duration::from_secs(60))
            .await?;
        Ok(Self {
            cluster,
            service,
            _dir: dir,
        })
    }

    /// A URL for `database` on this cluster.
    pub fn url(&self, database: &str) -> String {
        self.cluster.url(database)
    }

    /// The port the cluster listens on.
    pub fn port(&self) -> u16 {
        self.cluster.port
    }

    /// A fresh database with Meterline's migrations applied.
    pub async fn migrated_database(&self, name: &str) -> Result<Database> {
        Database::fresh_on(&self.cluster.url("postgres"), name).await
    }

    /// SIGKILL to the postmaster's whole process group; returns when no
    /// process of the cluster is left.
    pub async fn kill_all(&mut self) {
        self.service.kill9().await;
    }

    /// Starts the server again on the same data (crash recovery runs) and
    /// waits until it accepts connections.
    ///
    /// A killed server's backends can still be attached to its shared
    /// memory for a moment after the last of them is gone from the process
    /// group; the new postmaster then refuses to start ("pre-existing
    /// shared memory block … is still in use"). That refusal is retried for
    /// up to 5 s; any other failure is returned.
    pub async fn restart(&mut self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            self.service.restart()?;
            let ready = self
                .cluster
                .wait_ready(Some(&mut self.service), Duration::from_secs(60))
                .await;
            let busy = ready.is_err()
                && self.service.exited().is_some()
                && self.log_tail().contains("pre-existing shared memory block");
            if !busy || tokio::time::Instant::now() > deadline {
                return ready;
            }
            // Reap the refused postmaster before starting another.
            self.service.kill9().await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The server's log so far.
    pub fn log_tail(&self) -> String {
        process::log_tail(&self.cluster.log(), 40)
    }
}
