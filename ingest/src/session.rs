//! What ingest and the archiver share as processes: the admin commands'
//! JSON output, the Prometheus endpoint, and the consumer-group session
//! loop — a consumer thread feeding one task that commits what it is fed, replaced by a fresh
//! session (rejoining the group) whenever the task is fenced out as a
//! zombie, until shutdown, when the task commits what it holds.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::mpsc;

use crate::batcher::Stopped;
use crate::consumer::{ConsumerSettings, ConsumerThread, Feed, HighWatermarks};
use crate::error::IngestError;

/// Installs the Prometheus recorder ([`crate::telemetry::install`]: real
/// histograms) and serves it at `addr` (`setting` names the address in
/// errors). Describe metrics after this.
pub async fn serve_metrics(addr: SocketAddr, setting: &str) -> Result<(), IngestError> {
    let prometheus =
        crate::telemetry::install().map_err(|e| IngestError::Metrics(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| IngestError::Config(format!("{setting} {addr}: {e}")))?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || std::future::ready(prometheus.render())),
    );
    // Metrics outlive the consumer session; the process exit ends them.
    let settings = serving::HttpSettings::default();
    tokio::spawn(async move {
        if let Err(e) = serving::serve(listener, app, settings, std::future::pending()).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok(())
}

/// Runs sessions until `shutdown` resolves. `start` builds a session's task
/// from its feed and the consumer's high watermarks; `name` is for logs.
pub async fn run<F, Fut>(
    name: &'static str,
    settings: ConsumerSettings,
    pool: PgPool,
    shutdown: impl Future<Output = ()>,
    mut start: F,
) -> Result<(), IngestError>
where
    F: FnMut(mpsc::Receiver<Feed>, HighWatermarks) -> Fut,
    Fut: Future<Output = Stopped> + Send + 'static,
{
    tokio::pin!(shutdown);
    loop {
        let (feed_tx, feed_rx) = mpsc::channel(16);
        let consumer = ConsumerThread::spawn(settings.clone(), pool.clone(), feed_tx)?;
        let mut session = tokio::spawn(start(feed_rx, consumer.watermarks.clone()));
        let stopped = tokio::select! {
            stopped = &mut session => stopped,
            () = &mut shutdown => {
                tracing::info!("{name} shutting down: committing what is held, leaving the group");
                consumer.request_stop();
                let stopped = session.await;
                let _ = tokio::task::spawn_blocking(move || consumer.join()).await;
                tracing::info!(?stopped, "{name} stopped");
                return Ok(());
            }
        };
        let _ = tokio::task::spawn_blocking(move || consumer.join()).await;
        match stopped {
            Ok(Stopped::Fenced(partitions)) => {
                tracing::warn!(?partitions, "fenced out of partitions; rejoining the group");
            }
            Ok(Stopped::Drained) => return Ok(()),
            Err(e) => {
                tracing::error!(error = %e, "{name} task failed; restarting the session");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// An admin command's answer: one JSON line on stdout (logs go to stderr).
#[expect(clippy::print_stdout, reason = "the admin commands print their answer")]
pub fn println_json(value: &impl serde::Serialize) -> Result<(), serde_json::Error> {
    println!("{}", serde_json::to_string(value)?);
    Ok(())
}
