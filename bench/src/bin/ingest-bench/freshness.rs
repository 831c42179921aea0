//! Produce → visible latency at a fixed rate, into the running ingest.
//!
//! When an event became visible is known per batch: every row a batch
//! inserts has the same `ingested_at` (its transaction's start), and batches
//! of one ingest process commit in the order they start. So the batches,
//! ordered by `ingested_at`, with their row counts, say at which running
//! total of new rows each one became visible, and ~10 ms polls of that total
//! say when. With several processes, batches that overlap are taken in the
//! order they started.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use bench::procfs::cpu_seconds;
use bench::produce::{delivered, producer, send};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use rand::rngs::StdRng;
use rand::Rng;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use sqlx::PgPool;
use usage_contract::{RequestId, UsageEvent};
use uuid::Uuid;

use crate::processes::Ingests;
use crate::{Args, FRESH_LINGER_MS, PARTITIONS};

pub(crate) struct Fresh {
    pub(crate) latencies_ms: Vec<f64>,
    /// Per event, from its send (its `started_at`) to its row's insert
    /// (`ingested_at`, before its batch commits): the broker, the consumer
    /// and the batch's linger.
    pub(crate) inserted_ms: Vec<f64>,
    /// Per event, from its send to a bare consumer of the topic receiving
    /// it, watching beside ingest: the broker alone.
    pub(crate) broker_ms: Vec<f64>,
    /// How long the phase took, and the CPU this process used meanwhile.
    pub(crate) secs: f64,
    pub(crate) cpu_s: f64,
}

/// M events at a fixed rate, one send each, while [`poll_visible`] watches
/// request_log. The events are the workload generator's (seed drawn from
/// `rng`), each moved to start at the moment it is sent ([`at`]).
pub(crate) async fn freshness(
    args: &Args,
    topic: &str,
    pool: &PgPool,
    ingest: &mut Ingests,
    rng: &mut StdRng,
) -> Result<Fresh> {
    let (m, rate) = (args.fresh_events, f64::from(args.rate));
    let cpu_before = cpu_seconds(std::process::id()).unwrap_or(f64::NAN);
    let producer = producer(&args.kafka_brokers, FRESH_LINGER_MS, "lz4")?;
    // Every bulk event started at least a minute ago: only new ids are >= this bound.
    let since = RequestId::lower_bound_at(Utc::now());
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(m as f64 / rate + 120.0);
    let poller = tokio::spawn(poll_visible(pool.clone(), since, m as i64, deadline));
    let watcher = watch_broker(&args.kafka_brokers, topic, m, deadline)?;
    let to = Utc::now();
    let mut events =
        workload::Generator::reference(rng.random(), to - TimeDelta::hours(1), to, m as u64)?;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let (mut sent, mut acks) = (Vec::with_capacity(m), Vec::with_capacity(m));
    for _ in 0..m {
        tick.tick().await;
        let Some(e) = events.next() else {
            bail!("the workload gave fewer than {m} events");
        };
        let e = at(e, Utc::now().duration_trunc(TimeDelta::milliseconds(1))?);
        sent.push((e.request_id.as_uuid(), Instant::now()));
        acks.push(send(&producer, topic, &e.tenant_id, &e.to_json()).await?);
    }
    delivered(acks).await?;
    ingest.check_running()?;
    let samples = poller.await??;
    let secs = started.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds(std::process::id()).unwrap_or(f64::NAN) - cpu_before;
    let visible = batch_visibility(pool, since, &samples).await?;
    let received = tokio::task::spawn_blocking(move || watcher.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the broker watcher panicked"))??;
    let broker_ms = sent
        .iter()
        .filter_map(|(id, sent)| Some(received.get(id)?.saturating_duration_since(*sent)))
        .map(|d| d.as_secs_f64() * 1000.0)
        .collect();
    let mut latencies = Vec::with_capacity(m);
    for (id, sent) in &sent {
        let Some(at) = visible.get(id) else {
            bail!("event {id} is not in request_log");
        };
        latencies.push(at.saturating_duration_since(*sent).as_secs_f64() * 1000.0);
    }
    // Both clocks are this machine's.
    let inserted_ms: Vec<f64> = sqlx::query_scalar(
        "SELECT (extract(epoch FROM ingested_at - started_at) * 1000)::float8
         FROM request_log WHERE request_id >= $1",
    )
    .bind(since)
    .fetch_all(pool)
    .await?;
    Ok(Fresh {
        latencies_ms: latencies,
        inserted_ms,
        broker_ms,
        secs,
        cpu_s,
    })
}

/// Event `e` as if it had started at `started_at`: the same tenant, model
/// and figures, its times shifted by the same amount, and a request id of
/// that instant (so the freshness phase tells it from the bulk load's).
fn at(mut e: UsageEvent, started_at: DateTime<Utc>) -> UsageEvent {
    let shift = started_at - e.started_at;
    e.started_at = started_at;
    e.first_token_at = e.first_token_at.map(|t| t + shift);
    e.finished_at += shift;
    e.request_id = RequestId::at(started_at);
    e
}

/// When each new request became visible: its batch's place in the running
/// total of new rows, found in the polls' `samples`.
async fn batch_visibility(
    pool: &PgPool,
    since: Uuid,
    samples: &[(Instant, i64)],
) -> Result<HashMap<Uuid, Instant>> {
    let rows: Vec<(Uuid, DateTime<Utc>)> = sqlx::query_as(
        "SELECT request_id, ingested_at FROM request_log WHERE request_id >= $1
         ORDER BY ingested_at",
    )
    .bind(since)
    .fetch_all(pool)
    .await?;
    let mut at_batch: HashMap<DateTime<Utc>, Instant> = HashMap::new();
    let mut polls = samples.iter();
    let mut poll = polls.next();
    for (i, (_, batch)) in rows.iter().enumerate() {
        let last_of_batch = rows.get(i + 1).is_none_or(|(_, next)| next != batch);
        if !last_of_batch {
            continue;
        }
        // The batch is visible at the first poll that counted all rows so far.
        while poll.is_some_and(|(_, count)| *count < i as i64 + 1) {
            poll = polls.next();
        }
        let Some((t, _)) = poll else {
            bail!("no poll saw the batch started at {batch}");
        };
        at_batch.insert(*batch, *t);
    }
    Ok(rows
        .iter()
        .filter_map(|(id, batch)| Some((*id, *at_batch.get(batch)?)))
        .collect())
}

/// (time, count of new request_log rows), every ~10 ms until all M are there.
async fn poll_visible(
    pool: PgPool,
    since: uuid::Uuid,
    m: i64,
    deadline: Instant,
) -> Result<Vec<(Instant, i64)>> {
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let query = "SELECT count(*) FROM request_log WHERE request_id >= $1";
    loop {
        tick.tick().await;
        let count: i64 = sqlx::query_scalar(query)
            .bind(since)
            .fetch_one(&pool)
            .await?;
        samples.push((Instant::now(), count));
        if count >= m {
            return Ok(samples);
        }
        let late = Instant::now() > deadline;
        ensure!(!late, "only {count} of {m} fresh events visible in time");
    }
}

/// A bare consumer of `topic` from its current end, on its own thread:
/// when each of the next `m` events arrived, by request id.
fn watch_broker(
    brokers: &str,
    topic: &str,
    m: usize,
    deadline: Instant,
) -> Result<std::thread::JoinHandle<Result<HashMap<Uuid, Instant>>>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "ingest-bench-fresh-watch")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "50")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        let (_, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        tpl.add_partition_offset(topic, p, Offset::Offset(high))?;
    }
    consumer.assign(&tpl)?;
    Ok(std::thread::spawn(move || {
        let mut received = HashMap::with_capacity(m);
        while received.len() < m && Instant::now() < deadline {
            let Some(message) = consumer.poll(Duration::from_millis(10)) else {
                continue;
            };
            let at = Instant::now();
            let event: serde_json::Value =
                serde_json::from_slice(message?.payload().unwrap_or_default())?;
            let id: RequestId = serde_json::from_value(event["request_id"].clone())?;
            received.insert(id.as_uuid(), at);
        }
        Ok(received)
    }))
}
