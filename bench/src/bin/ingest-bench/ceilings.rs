//! The three ceilings ingest is measured against, each in the same run:
//! (a) the broker alone, (b) raw COPY into an unindexed table, (c) ingest's
//! own transactions with no broker in front.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use chrono::{DateTime, SecondsFormat, Utc};
use ingest::batch::{split, Decoded, RawMessage};
use ingest::offsets::ConsumerKey;
use ingest::store::{commit_batch, Outcome, Partitions, Writes};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use sqlx::PgPool;
use usage_contract::UsageEvent;

use crate::{Args, PARTITIONS};

const COPY: &str = "COPY request_log_raw (request_id, tenant_id, api_key_id, model, \
    model_version, priority, started_at, first_token_at, finished_at, prompt_tokens, \
    cached_tokens, completion_tokens, gpu_seconds, preempted_gpu_seconds, finish_reason, ttft_ms, \
    tpot_ms, replica_id, gateway_id, stream, content_hash, kafka_partition, kafka_offset) \
    FROM STDIN";

/// Where (b) and (c) put event `i`: the events are spread over the
/// partitions in turn, so partition `i % PARTITIONS` at offset
/// `i / PARTITIONS`.
fn place(i: usize) -> (i32, i64) {
    (i as i32 % PARTITIONS, i as i64 / i64::from(PARTITIONS))
}

/// Which of `streams` readers or connections takes `partition`, as a group
/// of that many ingest processes would share them.
fn share_of(partition: i32, streams: i32) -> i32 {
    partition % streams
}

/// Ceiling (c): every transaction ingest would run for `events`, with the
/// broker and the decoding taken away. The events are spread over the
/// partitions in turn; each of `streams` connections takes its share of the
/// partitions (as `streams` ingest processes would), decoded into batches of
/// `max_batch` up front, and only the commits (day partitions included, as
/// ingest does) are timed, written as `writes` says, into `pool`'s fresh
/// database.
pub(crate) async fn transactions_alone(
    pool: &PgPool,
    topic: &str,
    events: &[UsageEvent],
    args: &Args,
    writes: Writes,
) -> Result<Duration> {
    let (max_batch, streams) = (args.max_batch, args.processes);
    let now = Utc::now();
    let mut shares: Vec<Vec<RawMessage>> = (0..streams).map(|_| Vec::new()).collect();
    for (i, e) in events.iter().enumerate() {
        let (partition, offset) = place(i);
        shares[share_of(partition, streams) as usize].push(RawMessage {
            partition,
            offset,
            payload: e.to_json(),
            decoded: None,
        });
    }
    let key = ConsumerKey {
        group: "ingest-bench-transactions".into(),
        topic: topic.into(),
    };
    let streams: Vec<Vec<_>> = shares
        .iter()
        .map(|share| share.chunks(max_batch).map(|b| split(b, now)).collect())
        .collect();
    drop(shares);
    let started = Instant::now();
    let commits = streams
        .into_iter()
        .map(|batches| commit_in_turn(pool, &key, batches, writes));
    futures::future::try_join_all(commits).await?;
    let took = started.elapsed();
    let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM request_log")
        .fetch_one(pool)
        .await?;
    ensure!(
        rows == events.len() as i64,
        "ceiling (c) stored {rows} rows"
    );
    // As after (b): don't leave ingest to pay for this run's checkpoint.
    let _ = sqlx::query("CHECKPOINT").execute(pool).await;
    // Its backends are not needed while ingest is measured.
    pool.close().await;
    Ok(took)
}

/// One connection's part of ceiling (c): its batches, one after another.
async fn commit_in_turn(
    pool: &PgPool,
    key: &ConsumerKey,
    batches: Vec<Decoded>,
    writes: Writes,
) -> Result<()> {
    // A partition not in here yet has no stored offset (`None`).
    let mut stored: BTreeMap<i32, Option<i64>> = BTreeMap::new();
    let mut partitions = Partitions::default();
    for decoded in batches {
        let next = decoded.next_offsets.clone();
        partitions
            .ensure(pool, decoded.firsts.iter().map(|c| &c.event))
            .await?;
        match commit_batch(pool, key, &stored, decoded, writes).await? {
            Outcome::Committed(counts) => ensure!(
                counts.dead_lettered == 0 && counts.duplicates == 0,
                "ceiling (c) counted {counts:?}"
            ),
            Outcome::Stale { .. } => bail!("ceiling (c): offsets moved under the bench"),
        }
        stored.extend(next.into_iter().map(|(p, o)| (p, Some(o))));
    }
    Ok(())
}

/// Ceiling (a): all N messages read from the broker and copied, as ingest does.
pub(crate) fn broker_read(brokers: &str, topic: &str, n: usize, readers: i32) -> Result<Duration> {
    let total = std::sync::atomic::AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..readers)
            .map(|r| {
                let total = &total;
                scope.spawn(move || read_partitions(brokers, topic, n, r, readers, total, started))
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| bail!("a broker reader panicked"))
        })
    })?;
    Ok(started.elapsed())
}

/// One reader of [`broker_read`]: partitions `r`, `r + readers`, … until
/// all readers together have read `n`.
fn read_partitions(
    brokers: &str,
    topic: &str,
    n: usize,
    r: i32,
    readers: i32,
    total: &std::sync::atomic::AtomicUsize,
    started: Instant,
) -> Result<()> {
    use std::sync::atomic::Ordering::Relaxed;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "ingest-bench-read")
        .set("enable.auto.commit", "false")
        .set("fetch.max.bytes", "67108864")
        .set("max.partition.fetch.bytes", "16777216")
        .set("fetch.wait.max.ms", "50")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in (0..PARTITIONS).filter(|p| share_of(*p, readers) == r) {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut chunk = Vec::with_capacity(1000);
    while total.load(Relaxed) < n {
        let late = started.elapsed() > Duration::from_secs(600);
        ensure!(
            !late,
            "broker read: only {} of {n} in 10 minutes",
            total.load(Relaxed)
        );
        if let Some(m) = consumer.poll(Duration::from_millis(10)) {
            chunk.push(m?.payload().map(<[u8]>::to_vec).unwrap_or_default());
            if chunk.len() == 1000 {
                total.fetch_add(chunk.len(), Relaxed);
                std::hint::black_box(&mut chunk).clear();
            }
        } else if !chunk.is_empty() {
            total.fetch_add(chunk.len(), Relaxed);
            chunk.clear();
        }
    }
    Ok(())
}

/// Writes each value followed by a tab: COPY's text format.
macro_rules! tsv {
    ($buf:ident: $($value:expr),+) => { $( write!($buf, "{}\t", $value)?; )+ };
}

/// Ceiling (b): the same rows, formatted and COPYed into `request_log_raw`
/// (no indexes), on `streams` connections at once, each with its share of
/// the partitions, as ingest's processes would split them.
pub(crate) async fn copy_raw(
    pool: &PgPool,
    events: &[UsageEvent],
    hashes: &[[u8; 32]],
    streams: i32,
) -> Result<Duration> {
    let create = "CREATE TABLE request_log_raw (LIKE request_log INCLUDING DEFAULTS)";
    sqlx::query(create).execute(pool).await?;
    let started = Instant::now();
    let copies = (0..streams).map(|r| copy_share(pool, events, hashes, r, streams));
    let rows: u64 = futures::future::try_join_all(copies)
        .await?
        .into_iter()
        .sum();
    let took = started.elapsed();
    ensure!(rows == events.len() as u64, "COPY wrote {rows} rows");
    sqlx::query("DROP TABLE request_log_raw")
        .execute(pool)
        .await?;
    // Don't leave ingest to pay for the COPY's checkpoint.
    let _ = sqlx::query("CHECKPOINT").execute(pool).await;
    Ok(took)
}

/// One connection's COPY of [`copy_raw`]: the events of partitions `r`,
/// `r + streams`, …
async fn copy_share(
    pool: &PgPool,
    events: &[UsageEvent],
    hashes: &[[u8; 32]],
    r: i32,
    streams: i32,
) -> Result<u64> {
    let mut conn = pool.acquire().await?;
    let ts = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Millis, true);
    let opt = |v: Option<String>| v.unwrap_or_else(|| "\\N".into());
    let mut copy = conn.copy_in_raw(COPY).await?;
    let mut buf = String::with_capacity(4 << 20);
    let mine = events
        .iter()
        .zip(hashes)
        .enumerate()
        .filter(|(i, _)| share_of(place(*i).0, streams) == r);
    for (i, (e, hash)) in mine {
        let (partition, offset) = place(i);
        let first = opt(e.first_token_at.map(ts));
        let (ttft, tpot) = (
            opt(e.ttft_ms.map(|v| v.to_string())),
            opt(e.tpot_ms.map(|v| v.to_string())),
        );
        tsv! {
            buf: e.request_id.as_uuid(), e.tenant_id, e.api_key_id, e.model, e.model_version,
            e.priority, ts(e.started_at), first, ts(e.finished_at), e.prompt_tokens,
            e.cached_tokens, e.completion_tokens, e.gpu_seconds, e.preempted_gpu_seconds,
            e.finish_reason.as_str(), ttft, tpot, e.replica_id, e.gateway_id, e.stream
        }
        buf.push_str("\\\\x");
        for b in hash {
            write!(buf, "{b:02x}")?;
        }
        writeln!(buf, "\t{partition}\t{offset}")?;
        if buf.len() >= 4 << 20 {
            copy.send(buf.as_bytes()).await?;
            buf.clear();
        }
    }
    if !buf.is_empty() {
        copy.send(buf.as_bytes()).await?;
    }
    Ok(copy.finish().await?)
}
