//! Produce → visible latency at a fixed rate, into the running ingest.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use chrono::Utc;
use rand::rngs::StdRng;
use sqlx::PgPool;
use usage_contract::RequestId;

use crate::processes::{cpu_seconds, Ingests};
use crate::{delivered, event, millis, producer, send, Args, FRESH_LINGER_MS};

pub(crate) struct Fresh {
    pub(crate) latencies_ms: Vec<f64>,
    /// How long the phase took, and the CPU this process used meanwhile.
    pub(crate) secs: f64,
    pub(crate) cpu_s: f64,
}

/// M events at a fixed rate, started_at = now, one send each, while
/// [`poll_visible`] watches request_log.
pub(crate) async fn freshness(
    args: &Args,
    topic: &str,
    pool: &PgPool,
    ingest: &mut Ingests,
    rng: &mut StdRng,
) -> Result<Fresh> {
    let (m, rate) = (args.fresh_events, f64::from(args.rate));
    let cpu_before = cpu_seconds(std::process::id()).unwrap_or(f64::NAN);
    let producer = producer(&args.kafka_brokers, FRESH_LINGER_MS)?;
    // Every bulk event started at least a minute ago: only new ids are >= this bound.
    let since = RequestId::lower_bound_at(Utc::now());
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(m as f64 / rate + 120.0);
    let poller = tokio::spawn(poll_visible(pool.clone(), since, m as i64, deadline));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let (mut sent, mut acks) = (Vec::with_capacity(m), Vec::with_capacity(m));
    for i in 0..m {
        tick.tick().await;
        let e = event(rng, i, millis(Utc::now().timestamp_millis())?);
        sent.push(Instant::now());
        acks.push(send(&producer, topic, &e.tenant_id, &e.to_json()).await?);
    }
    delivered(acks).await?;
    ingest.check_running()?;
    let samples = poller.await??;
    let secs = started.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds(std::process::id()).unwrap_or(f64::NAN) - cpu_before;
    let (mut polls, mut at) = (samples.iter(), None);
    let mut latencies = Vec::with_capacity(m);
    for (i, sent) in sent.iter().enumerate() {
        while at.is_none_or(|(_, count)| count < i as i64 + 1) {
            at = polls.next().copied();
            ensure!(at.is_some(), "event {i} never became visible");
        }
        if let Some((t, _)) = at {
            latencies.push(t.saturating_duration_since(*sent).as_secs_f64() * 1000.0);
        }
    }
    Ok(Fresh {
        latencies_ms: latencies,
        secs,
        cpu_s,
    })
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
