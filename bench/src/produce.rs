//! Producing usage events to a topic: one delivery future per message, so
//! that a benchmark queues all of them at full speed and then waits for
//! every acknowledgement.

use std::time::Duration;

use anyhow::{Context, Result};
use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

/// An idempotent producer with acks=all, as the gateway's relay, lingering
/// `linger_ms`, with `compression` (librdkafka's `compression.type`:
/// `none`, `lz4`, …) and room for a million queued messages.
pub fn producer(brokers: &str, linger_ms: u32, compression: &str) -> Result<FutureProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", linger_ms.to_string())
        .set("compression.type", compression)
        .set("queue.buffering.max.messages", "1000000")
        .create()?)
}

/// Queues one message (waiting while librdkafka's queue is full); the
/// future resolves when the broker acknowledged it.
pub async fn send(
    p: &FutureProducer,
    topic: &str,
    key: &str,
    body: &[u8],
) -> Result<DeliveryFuture> {
    loop {
        match p.send_result(FutureRecord::to(topic).key(key).payload(body)) {
            Ok(ack) => return Ok(ack),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

/// Waits for every acknowledgement; fails at the first message not delivered.
pub async fn delivered(acks: Vec<DeliveryFuture>) -> Result<()> {
    for ack in acks {
        ack.await
            .context("delivery cancelled")?
            .map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// [`send`]s every (key, body) to `topic`, then waits until all are [`delivered`].
pub async fn produce_all<K, B>(
    p: &FutureProducer,
    topic: &str,
    messages: impl IntoIterator<Item = (K, B)>,
) -> Result<()>
where
    K: AsRef<str>,
    B: AsRef<[u8]>,
{
    let mut acks = Vec::new();
    for (key, body) in messages {
        acks.push(send(p, topic, key.as_ref(), body.as_ref()).await?);
    }
    delivered(acks).await
}
