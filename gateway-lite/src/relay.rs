//! The relay: outbox → Kafka. Publishes with the idempotent producer
//! (`enable.idempotence=true`, `acks=all`), keyed by tenant, and marks an
//! event published only after the broker acknowledged it. A crash between the ack and
//! the "published" mark reaching the disk (it is flushed with the next
//! append, or when the relay goes quiet) re-sends; ingest's request-id
//! dedupe makes that harmless.
//! While Kafka is away the outbox grows and the gateway keeps serving.

use std::time::Duration;

use metrics::{counter, gauge};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::ClientConfig;
use tokio::sync::watch;

use crate::outbox::Outbox;

/// Entries published per round.
const ROUND: usize = 2000;

pub fn producer(brokers: &str) -> Result<FutureProducer, rdkafka::error::KafkaError> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .set("message.timeout.ms", "30000")
        .create()
}

/// Publishes until `stop` turns true and the outbox is empty (or, when the
/// broker is away at shutdown, until the grace period is over: what is left
/// stays in the outbox for the next start).
pub async fn run(
    outbox: Outbox,
    producer: FutureProducer,
    topic: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let entries = match outbox.peek(ROUND) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the outbox");
                tokio::time::sleep(backoff).await;
                continue;
            }
        };
        if entries.is_empty() {
            if *stop.borrow() {
                producer.flush(Duration::from_secs(5)).ok();
                sync_removals(&outbox).await;
                return;
            }
            tokio::select! {
                () = outbox.committed.notified() => {}
                _ = stop.changed() => {}
                () = tokio::time::sleep(Duration::from_millis(500)) => {
                    // Quiet for a while: put the "published" mark on disk
                    // now rather than with the next append.
                    sync_removals(&outbox).await;
                }
            }
            continue;
        }
        // Enqueue the whole round first (send_result does not wait), then
        // collect the acknowledgements: one round trip per round, not per event.
        let mut pending = Vec::with_capacity(entries.len());
        for e in &entries {
            let record = FutureRecord::to(&topic).key(&e.key).payload(&e.payload);
            pending.push((e.seq, producer.send_result(record).map_err(|(err, _)| err)));
        }
        let mut acked = Vec::with_capacity(entries.len());
        let mut failed = 0usize;
        for (seq, queued) in pending {
            let outcome = match queued {
                Ok(delivery) => match delivery.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((err, _))) => Err(err.to_string()),
                    Err(_) => Err("delivery cancelled".to_owned()),
                },
                Err(err) => Err(err.to_string()),
            };
            match outcome {
                Ok(()) => acked.push(seq),
                Err(e) => {
                    failed += 1;
                    if failed == 1 {
                        tracing::warn!(error = %e, "publish failed; the event stays in the outbox");
                    }
                }
            }
        }
        if let Err(e) = outbox.remove(&acked) {
            tracing::error!(error = %e, "cannot mark events published; they will be re-sent");
        }
        counter!("gateway_relay_published_total").increment(acked.len() as u64);
        if failed > 0 {
            counter!("gateway_relay_errors_total").increment(failed as u64);
            if *stop.borrow() {
                sync_removals(&outbox).await;
                tracing::warn!(
                    left = failed,
                    "broker unavailable at shutdown; events stay in the outbox"
                );
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        } else {
            backoff = Duration::from_millis(100);
        }
    }
}

async fn sync_removals(outbox: &Outbox) {
    if let Err(e) = outbox.sync_removals().await {
        tracing::warn!(error = %e, "cannot flush the published mark; those events may be re-sent");
    }
}

/// Sets the age of the oldest waiting event (read at every scrape, so it
/// keeps growing while a publish is stuck).
pub fn report_age(outbox: &Outbox) {
    let age = outbox
        .peek(1)
        .ok()
        .and_then(|e| e.first().map(|e| e.enqueued_at_ms))
        .map_or(0, |oldest| chrono::Utc::now().timestamp_millis() - oldest);
    gauge!("gateway_outbox_age_seconds").set(age.max(0) as f64 / 1000.0);
}
