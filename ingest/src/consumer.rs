//! The Kafka side: a classic consumer-group member on its own thread.
//!
//! librdkafka's poll blocks, so it runs off the async workers and hands
//! what it reads to the batcher over a bounded channel ([`Feed`]). Where a
//! partition starts is decided here, on assignment, from the offsets in
//! Postgres, passed in the assignment list itself (a `seek` right after
//! `assign` fails in librdkafka). On revoke, the thread waits until the
//! batcher has committed or dropped what it holds for those partitions.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::message::Message;
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, ClientContext};
use sqlx::PgPool;
use tokio::sync::mpsc;

use crate::batch::{prepare, RawMessage};
use crate::offsets::{self, ConsumerKey, Ledger};

/// What the consumer thread tells the batcher, in the order it happened.
#[derive(Debug)]
pub enum Feed {
    Messages(Vec<RawMessage>),
    /// Partitions now owned, with the stored offset each starts from.
    Assigned(BTreeMap<i32, Option<i64>>),
    /// Partitions taken away: commit or drop what is held for them, then ack.
    Revoked(Vec<i32>, std::sync::mpsc::SyncSender<()>),
}

/// Broker high watermarks per partition, from librdkafka's statistics.
pub type HighWatermarks = Arc<Mutex<HashMap<i32, i64>>>;

/// Settings the consumer thread needs.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    pub brokers: String,
    pub key: ConsumerKey,
    /// Where the start offsets are read from on assignment.
    pub ledger: Ledger,
    /// How long a revoke waits for the batcher before letting go anyway
    /// (the offsets CAS keeps a late commit harmless).
    pub revoke_timeout: Duration,
    /// Messages handed over per channel send, at most.
    pub chunk: usize,
    /// Decode and validate each message on the consumer thread, so that
    /// work overlaps the batcher's wait on Postgres.
    pub predecode: bool,
}

struct Context {
    pool: PgPool,
    key: ConsumerKey,
    ledger: Ledger,
    runtime: tokio::runtime::Handle,
    feed: mpsc::Sender<Feed>,
    stop: Arc<AtomicBool>,
    revoke_timeout: Duration,
    watermarks: HighWatermarks,
}

impl ClientContext for Context {
    fn stats(&self, statistics: Statistics) {
        if let Some(topic) = statistics.topics.get(&self.key.topic) {
            if let Ok(mut marks) = self.watermarks.lock() {
                for (p, s) in &topic.partitions {
                    if *p >= 0 && s.hi_offset >= 0 {
                        marks.insert(*p, s.hi_offset);
                    }
                }
            }
        }
    }
}

impl ConsumerContext for Context {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => self.assign(consumer, tpl),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => self.revoke(consumer, tpl),
            other => {
                tracing::error!(error = ?other, "rebalance failed; dropping the assignment");
                if let Err(e) = consumer.unassign() {
                    tracing::warn!(error = %e, "unassign failed");
                }
            }
        }
    }
}

impl Context {
    fn assign(&self, consumer: &BaseConsumer<Self>, tpl: &mut TopicPartitionList) {
        let partitions: Vec<i32> = tpl
            .elements_for_topic(&self.key.topic)
            .iter()
            .map(|e| e.partition())
            .collect();
        let stored = self.load_offsets(&partitions);
        for (&p, &next) in &stored {
            let offset = next.map_or(Offset::Beginning, Offset::Offset);
            if let Err(e) = tpl.set_partition_offset(&self.key.topic, p, offset) {
                tracing::error!(partition = p, error = %e, "cannot set start offset");
            }
        }
        tracing::info!(
            ?stored,
            "partitions assigned; starting at the offsets stored in postgres"
        );
        if self.feed.blocking_send(Feed::Assigned(stored)).is_err() {
            return;
        }
        if let Err(e) = consumer.assign(tpl) {
            tracing::error!(error = %e, "assign failed");
        }
    }

    /// Retries until Postgres answers: consuming from anywhere else than the
    /// stored offsets would be wrong, so waiting is the only safe choice.
    fn load_offsets(&self, partitions: &[i32]) -> BTreeMap<i32, Option<i64>> {
        let mut backoff = Duration::from_millis(100);
        loop {
            let result = self.runtime.block_on(offsets::load(
                &self.pool,
                self.ledger,
                &self.key,
                partitions,
            ));
            match result {
                Ok(stored) => return stored,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "cannot load offsets; retrying");
                    if self.stop.load(Ordering::Relaxed) {
                        // Shutting down: start nowhere; nothing will be consumed.
                        return partitions.iter().map(|&p| (p, None)).collect();
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    fn revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let partitions: Vec<i32> = tpl
            .elements_for_topic(&self.key.topic)
            .iter()
            .map(|e| e.partition())
            .collect();
        let (ack, acked) = std::sync::mpsc::sync_channel(1);
        if self
            .feed
            .blocking_send(Feed::Revoked(partitions.clone(), ack))
            .is_ok()
            && acked.recv_timeout(self.revoke_timeout).is_err()
        {
            tracing::warn!(?partitions, "batcher did not finish before revoke timeout");
        }
        tracing::info!(?partitions, "partitions revoked");
        if let Err(e) = consumer.unassign() {
            tracing::warn!(error = %e, "unassign failed");
        }
    }
}

/// A running consumer thread. Dropping it without [`ConsumerThread::stop`]
/// leaves the thread to notice the closed channel.
pub struct ConsumerThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    pub watermarks: HighWatermarks,
}

impl ConsumerThread {
    /// Joins the group and starts polling; what it reads arrives on `feed`.
    pub fn spawn(
        settings: ConsumerSettings,
        pool: PgPool,
        feed: mpsc::Sender<Feed>,
    ) -> KafkaResult<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let watermarks = HighWatermarks::default();
        let context = Context {
            pool,
            key: settings.key.clone(),
            ledger: settings.ledger,
            runtime: tokio::runtime::Handle::current(),
            feed: feed.clone(),
            stop: stop.clone(),
            revoke_timeout: settings.revoke_timeout,
            watermarks: watermarks.clone(),
        };
        let consumer: BaseConsumer<Context> = ClientConfig::new()
            .set("bootstrap.servers", &settings.brokers)
            .set("group.id", &settings.key.group)
            .set("group.protocol", "classic")
            .set("partition.assignment.strategy", "range")
            // Offsets live in Postgres; the broker's are never used.
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000")
            .set("statistics.interval.ms", "1000")
            .set("fetch.wait.max.ms", "50")
            // 8 MiB per partition per fetch, not librdkafka's 1 MiB: the
            // broker pays per fetch request (this one, Nisshi, a Postgres
            // query), so fewer, larger fetches are ~12% more events/s in
            // ingest-bench for ~30 MiB more resident memory.
            .set("max.partition.fetch.bytes", "8388608")
            .create_with_context(context)?;
        consumer.subscribe(&[settings.key.topic.as_str()])?;
        let thread_stop = stop.clone();
        let handle = std::thread::Builder::new()
            .name("kafka-consumer".into())
            .spawn(move || {
                poll_loop(
                    consumer,
                    feed,
                    thread_stop,
                    settings.chunk,
                    settings.predecode,
                )
            })
            .map_err(|e| {
                rdkafka::error::KafkaError::ClientCreation(format!("cannot start thread: {e}"))
            })?;
        Ok(Self {
            stop,
            handle: Some(handle),
            watermarks,
        })
    }

    /// Asks the thread to leave the group; its revoke flushes the batcher.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Stops and waits for the thread (blocking; call from `spawn_blocking`).
    pub fn join(mut self) {
        self.request_stop();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for ConsumerThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn poll_loop(
    consumer: BaseConsumer<Context>,
    feed: mpsc::Sender<Feed>,
    stop: Arc<AtomicBool>,
    chunk_size: usize,
    predecode: bool,
) {
    let mut chunk: Vec<RawMessage> = Vec::with_capacity(chunk_size);
    let mut chunk_started = Instant::now();
    let max_hold = Duration::from_millis(20);
    while !stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(50)) {
            None => {}
            Some(Ok(m)) => {
                if chunk.is_empty() {
                    chunk_started = Instant::now();
                }
                let payload = m.payload().map(<[u8]>::to_vec).unwrap_or_default();
                chunk.push(RawMessage {
                    partition: m.partition(),
                    offset: m.offset(),
                    decoded: predecode.then(|| prepare(&payload, chrono::Utc::now())),
                    payload,
                });
                if chunk.len() < chunk_size && chunk_started.elapsed() < max_hold {
                    continue;
                }
            }
            Some(Err(e)) => tracing::warn!(error = %e, "kafka poll error; librdkafka retries"),
        }
        if !chunk.is_empty() {
            let full = std::mem::replace(&mut chunk, Vec::with_capacity(chunk_size));
            if feed.blocking_send(Feed::Messages(full)).is_err() {
                return;
            }
        }
    }
    if !chunk.is_empty() {
        let _ = feed.blocking_send(Feed::Messages(chunk));
    }
    // Leaving the group runs the revoke callback, which lets the batcher
    // commit what it holds before the partitions go to someone else.
    consumer.unsubscribe();
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let _ = consumer.poll(Duration::from_millis(50));
        if consumer
            .assignment()
            .map(|a| a.count() == 0)
            .unwrap_or(true)
        {
            break;
        }
    }
    drop(consumer);
}
