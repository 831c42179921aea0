//! The ingest process: connect, serve metrics, and keep a consumer-group
//! session running until shutdown. A fenced session (zombie) is replaced by
//! a fresh one that rejoins the group.

use std::future::Future;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::sync::mpsc;

use crate::batcher::{BatchSettings, Batcher, Stopped};
use crate::config::IngestConfig;
use crate::consumer::{ConsumerSettings, ConsumerThread};
use crate::error::IngestError;
use crate::offsets::ConsumerKey;
use crate::offsets::Ledger;
use crate::telemetry;

/// How long start-up waits for Postgres before giving up.
const DATABASE_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Runs ingest until `shutdown` resolves; then commits what it holds and
/// leaves the group.
pub async fn run(
    config: IngestConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), IngestError> {
    config.validate()?;
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| IngestError::Metrics(e.to_string()))?;
    telemetry::describe();
    let listener = tokio::net::TcpListener::bind(config.metrics_addr)
        .await
        .map_err(|e| {
            IngestError::Config(format!("INGEST_METRICS_ADDR {}: {e}", config.metrics_addr))
        })?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || std::future::ready(prometheus.render())),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });

    let pool = schema::connect(&config.database_url, 8, DATABASE_WAIT).await?;
    let key = ConsumerKey {
        group: config.group.clone(),
        topic: config.topic.clone(),
    };
    let batch = BatchSettings {
        max_batch: config.max_batch,
        linger: config.linger(),
    };
    tokio::pin!(shutdown);
    loop {
        let (feed_tx, feed_rx) = mpsc::channel(16);
        let consumer = ConsumerThread::spawn(
            ConsumerSettings {
                brokers: config.kafka_brokers.clone(),
                key: key.clone(),
                ledger: Ledger::Ingest,
                revoke_timeout: Duration::from_secs(30),
                chunk: 1000.min(config.max_batch),
                predecode: true,
            },
            pool.clone(),
            feed_tx,
        )?;
        let batcher = Batcher::new(
            pool.clone(),
            key.clone(),
            batch,
            consumer.watermarks.clone(),
        );
        let mut session = tokio::spawn(batcher.run(feed_rx));
        let stopped = tokio::select! {
            stopped = &mut session => stopped,
            () = &mut shutdown => {
                tracing::info!("shutting down: committing what is held, leaving the group");
                consumer.request_stop();
                let stopped = session.await;
                let _ = tokio::task::spawn_blocking(move || consumer.join()).await;
                tracing::info!(?stopped, "ingest stopped");
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
                tracing::error!(error = %e, "batcher task failed; restarting the session");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
