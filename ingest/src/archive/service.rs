//! The archiver process: connect, serve metrics, then archive batches from
//! the queue until shutdown, compacting closed hours and collecting garbage
//! on a timer. A batch in progress is finished before the process stops
//! (stopping anywhere else is safe too: see `archive::archiver`).

use std::future::Future;
use std::time::{Duration, Instant};

use chrono::Utc;

use crate::archive::config::ArchiverConfig;
use crate::archive::telemetry::{self, Committed};
use crate::error::IngestError;
use crate::session;

/// How long start-up waits for Postgres before giving up.
const DATABASE_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Runs the archiver until `shutdown` resolves.
pub async fn run(
    config: ArchiverConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), IngestError> {
    config.validate()?;
    // Polled once now so the signal handlers are installed before the slow
    // start-up (a SIGTERM while connecting would otherwise kill the process).
    tokio::pin!(shutdown);
    tokio::select! {
        biased;
        () = &mut shutdown => return Ok(()),
        () = std::future::ready(()) => {}
    }
    let store =
        archive::store::open(&config.url).map_err(|e| IngestError::Config(e.to_string()))?;
    session::serve_metrics(config.metrics_addr, "ARCHIVE_METRICS_ADDR").await?;
    telemetry::describe();
    telemetry::register();
    let pool = schema::connect(&config.database_url, 4, DATABASE_WAIT).await?;
    tracing::info!(url = %config.url, "archiver starting");
    let mut batches: u64 = 0;
    let mut compactions: u64 = 0;
    let compact_every = Duration::from_secs(config.compact_every_secs);
    let mut last_compaction = Instant::now();
    let mut backoff = Duration::from_millis(100);
    let mut reclaim = archive::reclaim::Reclaim::default();
    loop {
        let started = Instant::now();
        let crash = config.crash_after_write > 0 && batches + 1 == config.crash_after_write;
        let full = match archive::archiver::archive_batch(&pool, &store, config.max_batch, crash)
            .await
        {
            Ok(batch) => {
                backoff = Duration::from_millis(100);
                if batch.rows > 0 {
                    batches += 1;
                    if batch.committed {
                        let committed = Committed {
                            files: batch.files,
                            rows: batch.rows,
                            bytes: batch.bytes,
                        };
                        telemetry::record_batch(&committed, batch.commit_took, started.elapsed());
                        tracing::debug!(rows = batch.rows, files = batch.files, "batch archived");
                    } else {
                        telemetry::record_lost();
                        tracing::info!(
                            rows = batch.rows,
                            "another archiver committed these rows first; its files stand"
                        );
                    }
                }
                if batch.committed {
                    reclaim.taken(batch.rows);
                }
                // An empty batch read the queue empty: no count to pay for.
                let queued = match batch.rows {
                    0 => Ok(0),
                    _ => archive::manifest::queued(&pool).await,
                };
                if let Ok(queued) = queued {
                    telemetry::record_lag(queued);
                }
                let full = batch.rows as usize >= config.max_batch;
                if reclaim.due(!full) {
                    match archive::reclaim::vacuum_queue(&pool).await {
                        Ok(took) => {
                            reclaim.done();
                            telemetry::record_vacuum(took);
                        }
                        Err(e) => {
                            telemetry::record_error();
                            tracing::warn!(error = %e, "vacuum of archive_queue failed; trying again after the next batch");
                        }
                    }
                }
                full
            }
            Err(e) => {
                telemetry::record_error();
                tracing::warn!(error = %e, retry_in = ?backoff, "archive batch failed; retrying");
                let wait = backoff;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                tokio::select! {
                    () = &mut shutdown => return Ok(()),
                    () = tokio::time::sleep(wait) => continue,
                }
            }
        };
        if !compact_every.is_zero() && last_compaction.elapsed() >= compact_every {
            last_compaction = Instant::now();
            let crash =
                config.crash_in_compaction > 0 && compactions + 1 == config.crash_in_compaction;
            match archive::compact::compact_due(&pool, &store, Utc::now(), config.policy(), crash)
                .await
            {
                Ok(done) => {
                    compactions += done.len() as u64;
                    let swapped = done.iter().filter(|c| c.swapped).count() as u64;
                    telemetry::record_compactions(swapped);
                    if swapped > 0 {
                        tracing::info!(hours = swapped, "hours compacted");
                    }
                }
                Err(e) => {
                    telemetry::record_error();
                    tracing::warn!(error = %e, "compaction failed; trying again next time");
                }
            }
            if let Err(e) = archive::verify::gc(&pool, &store, config.grace(), Utc::now()).await {
                tracing::warn!(error = %e, "gc failed; trying again next time");
            }
        }
        if full {
            continue;
        }
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = tokio::time::sleep(config.linger()) => {}
        }
    }
}
