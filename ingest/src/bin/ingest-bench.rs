//! `ingest-bench`: how fast ingest moves usage events from Kafka into
//! Postgres, next to three ceilings it cannot beat on this machine, and how soon
//! an event is visible. Run it with `scripts/bench-ingest.sh [flags]`.
//!
//! One run, on a fresh database `bench_<random>` and a fresh 4-partition
//! topic `bench.<random>`:
//! 1. N events of the five reference tenants are produced (idempotent,
//!    acks=all, lz4, linger 5 ms); the produce rate is informational;
//! 2. ceiling (a): plain consumers read (and copy) all N from the broker;
//! 3. ceiling (b): COPY of the same N rows (formatting included) into
//!    `request_log_raw`, a plain copy of request_log without indexes;
//!    and (c), what ingest's design itself allows with no broker in front:
//!    the same N events, decoded beforehand, committed batch by batch with
//!    ingest's own `store::commit_batch` (dedupe, hourly, offsets: every
//!    transaction ingest runs) into a second fresh database;
//!    each with as many readers / connections as `--processes`, every one on
//!    its share of the partitions, as that many ingest processes would be;
//! 4. the real `ingest` binary runs as `--processes` processes of one
//!    consumer group, timed from their start until
//!    its offsets in Postgres cover all N, with its peak RSS, CPU time and
//!    commit times (from its `/metrics`); request_log and usage_hourly are
//!    then checked against N;
//! 5. freshness: M more events at a fixed rate into the same running ingest,
//!    produce → visible in request_log, as percentiles.

#![allow(clippy::print_stdout, reason = "a benchmark prints its report")]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write as _};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use clap::Parser;
use ingest::batch::{split, Decoded, RawMessage};
use ingest::offsets::ConsumerKey;
use ingest::store::{commit_batch, Outcome, Partitions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use rust_decimal::Decimal;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgPool};
use usage_contract::FinishReason as F;
use usage_contract::{RequestId, UsageEvent};

const PARTITIONS: i32 = 4;
const TENANTS: [(&str, i16); 5] = [
    ("acme-corp", 5),
    ("medai-labs", 4),
    ("finserv-team", 3),
    ("research-squad", 2),
    ("codegen-platform", 1),
];
const MODELS: [&str; 2] = ["llama-3.1-8b", "llama-3.1-70b"];
/// The freshness producer lingers 20 ms, not 5: at a steady 2000/s, librdkafka
/// with linger 5 ms busy-polls (measured here: ~70% of a core, against 10-20%
/// at 20 ms), which on a small machine takes CPU from the ingest being measured.
const FRESH_LINGER_MS: &str = "20";
const COPY: &str = "COPY request_log_raw (request_id, tenant_id, api_key_id, model, \
    model_version, priority, started_at, first_token_at, finished_at, prompt_tokens, \
    cached_tokens, completion_tokens, gpu_seconds, preempted_gpu_seconds, finish_reason, ttft_ms, \
    tpot_ms, replica_id, gateway_id, stream, content_hash, kafka_partition, kafka_offset) \
    FROM STDIN";

/// Ingest throughput against the broker-read and COPY ceilings, and freshness.
#[derive(Parser)]
struct Args {
    /// Events produced and ingested in bulk.
    #[arg(long, default_value_t = 200_000)]
    events: usize,
    /// Events produced at `--rate` afterwards, for produce → visible latency.
    #[arg(long, default_value_t = 20_000)]
    fresh_events: usize,
    /// Events per second during the freshness phase.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
    rate: u32,
    /// Passed to ingest as INGEST_MAX_BATCH (default: what ingest would use).
    #[arg(long)]
    max_batch: Option<usize>,
    /// Passed to ingest as INGEST_LINGER_MS (default: what ingest would use).
    #[arg(long)]
    linger_ms: Option<u64>,
    /// Keep the bench database afterwards.
    #[arg(long)]
    keep: bool,
    /// The server to create the bench database on (its database name is not used).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    kafka_brokers: String,
    /// Ingest processes sharing the topic's partitions (one consumer group);
    /// ceilings (a) and (c) use as many readers and connections.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=4))]
    processes: i32,
    /// How the bulk events' times (and so their request ids) are ordered.
    #[arg(long, value_enum, default_value_t = Order::Arrival)]
    order: Order,
}

/// The order of the bulk events' request ids on the topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Order {
    /// As a gateway emits them: spread evenly over the last 4 hours, each
    /// started up to 20 s before its place in the stream (requests of
    /// different lengths finish out of order), so ids arrive almost sorted.
    Arrival,
    /// Each at a random time in the last 4 hours (a pessimistic order: every
    /// insert lands at a random place in the primary key).
    Random,
}

/// Ingest's own settings as it would read them from this environment.
#[derive(Parser)]
struct IngestSettings {
    #[command(flatten)]
    config: ingest::IngestConfig,
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    let ingest = IngestSettings::try_parse_from(["ingest"])?.config;
    args.max_batch.get_or_insert(ingest.max_batch);
    args.linger_ms.get_or_insert(ingest.linger_ms);
    let mut rng = StdRng::from_os_rng();
    let suffix = format!("{:08x}", rng.random::<u32>());
    let base: PgConnectOptions = args.database_url.parse().context("DATABASE_URL")?;
    let db = format!("bench_{suffix}");
    // The second database takes ceiling (c)'s rows, so that the real
    // ingest meets an empty request_log in the first.
    let tx_db = format!("{db}_tx");
    let mut admin = base.clone().database("postgres").connect().await?;
    for name in [&db, &tx_db] {
        let create = format!("CREATE DATABASE {name}");
        sqlx::query(&create).execute(&mut admin).await?;
    }
    let url = |name: &str| base.clone().database(name).to_url_lossy().to_string();
    let result = run(&args, [&url(&db), &url(&tx_db)], &suffix, &mut rng).await;
    for name in [&db, &tx_db] {
        if args.keep {
            println!("kept database {name}");
        } else {
            let drop = format!("DROP DATABASE {name} WITH (FORCE)");
            sqlx::query(&drop).execute(&mut admin).await?;
        }
    }
    result
}

/// `urls`: the database ingest writes to, and the one for ceiling (c).
async fn run(args: &Args, urls: [&str; 2], suffix: &str, rng: &mut StdRng) -> Result<()> {
    let (n, load) = (args.events, std::fs::read_to_string("/proc/loadavg")?);
    let [url, tx_url] = urls;
    let pool = bench_database(url).await?;
    let topic = format!("bench.{suffix}");
    usage_contract::topic::create(&args.kafka_brokers, &topic, PARTITIONS).await?;
    let now_ms = Utc::now().timestamp_millis();
    let mut events = Vec::with_capacity(n);
    const SPAN_MS: i64 = 4 * 3_600_000;
    for i in 0..n {
        let ago = match args.order {
            Order::Arrival => SPAN_MS - SPAN_MS * i as i64 / n as i64 + rng.random_range(0..20_000),
            Order::Random => rng.random_range(60_000..SPAN_MS),
        };
        events.push(event(rng, i, millis(now_ms - ago)?));
    }
    let hashes: Vec<[u8; 32]> = events.iter().map(UsageEvent::content_hash).collect();

    println!("producing {n} events to {topic}");
    let started = Instant::now();
    let bulk_producer = producer(&args.kafka_brokers, "5")?;
    let mut acks = Vec::with_capacity(n);
    for e in &events {
        acks.push(send(&bulk_producer, &topic, &e.tenant_id, &e.to_json()).await?);
    }
    delivered(acks).await?;
    drop(bulk_producer);
    let produce = started.elapsed();
    println!("ceiling (a): reading them back from the broker");
    let read = broker_read(&args.kafka_brokers, &topic, n, args.processes)?;
    println!("ceiling (b): COPY into request_log_raw");
    let copy = copy_raw(&pool, &events, &hashes, args.processes).await?;
    drop(hashes);
    println!("ceiling (c): ingest's transactions alone, into a second database");
    let max_batch = args.max_batch.unwrap_or(5000).max(1);
    let transactions =
        transactions_alone(tx_url, &topic, &events, max_batch, args.processes).await?;
    drop(events);

    println!("ingest: until its offsets cover all {n} events");
    let mut ingest = Ingests::start(args, url, &topic, suffix)?;
    let bulk = wait_ingested(&pool, &mut ingest, n).await?;
    let metrics = ingest.scrape();
    let checks = sqlx::query_as(
        "SELECT (SELECT count(*) FROM request_log),
                (SELECT coalesce(sum(requests), 0)::bigint FROM usage_hourly),
                (SELECT count(*) FROM dead_letters)",
    )
    .fetch_one(&pool)
    .await?;
    println!("freshness: {} events at {}/s", args.fresh_events, args.rate);
    let fresh = freshness(args, &topic, &pool, &mut ingest, rng).await;
    let hwm_kib = ingest.max_kib("VmHWM:");
    ingest.stop().await;
    let fresh = fresh?;
    let measured = Measured {
        load,
        produce,
        read,
        copy,
        transactions,
        bulk,
        metrics,
        checks,
        hwm_kib,
        fresh,
    };
    report(args, &measured)
}

/// A fresh bench database with its schema and the five reference tenants.
async fn bench_database(url: &str) -> Result<PgPool> {
    let pool = schema::connect(url, 4, Duration::from_secs(10)).await?;
    sqlx::query(
        "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode)
         SELECT t, t, 'standard', p, 'per_token' FROM UNNEST($1::text[], $2::smallint[]) x(t, p)",
    )
    .bind(TENANTS.map(|t| t.0))
    .bind(TENANTS.map(|t| t.1))
    .execute(&pool)
    .await?;
    Ok(pool)
}

/// Ceiling (c): every transaction ingest would run for `events`, with the
/// broker and the decoding taken away. The events are spread over the
/// partitions in turn; each of `streams` connections takes its share of the
/// partitions (as `streams` ingest processes would), decoded into batches of
/// `max_batch` up front, and only the commits (day partitions included, as
/// ingest does) are timed.
async fn transactions_alone(
    url: &str,
    topic: &str,
    events: &[UsageEvent],
    max_batch: usize,
    streams: i32,
) -> Result<Duration> {
    let pool = bench_database(url).await?;
    let now = Utc::now();
    let mut shares: Vec<Vec<RawMessage>> = (0..streams).map(|_| Vec::new()).collect();
    for (i, e) in events.iter().enumerate() {
        let partition = i as i32 % PARTITIONS;
        shares[(partition % streams) as usize].push(RawMessage {
            partition,
            offset: i as i64 / i64::from(PARTITIONS),
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
        .map(|batches| commit_in_turn(&pool, &key, batches));
    futures::future::try_join_all(commits).await?;
    let took = started.elapsed();
    let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM request_log")
        .fetch_one(&pool)
        .await?;
    ensure!(
        rows == events.len() as i64,
        "ceiling (c) stored {rows} rows"
    );
    // As after (b): don't leave ingest to pay for this run's checkpoint.
    let _ = sqlx::query("CHECKPOINT").execute(&pool).await;
    pool.close().await;
    Ok(took)
}

/// One connection's part of ceiling (c): its batches, one after another.
async fn commit_in_turn(pool: &PgPool, key: &ConsumerKey, batches: Vec<Decoded>) -> Result<()> {
    // A partition not in here yet has no stored offset (`None`).
    let mut stored: BTreeMap<i32, Option<i64>> = BTreeMap::new();
    let mut partitions = Partitions::default();
    for decoded in batches {
        let next = decoded.next_offsets.clone();
        partitions
            .ensure(pool, decoded.firsts.iter().map(|c| &c.event))
            .await?;
        match commit_batch(pool, key, &stored, decoded).await? {
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

/// Everything the report is made of.
struct Measured {
    load: String,
    produce: Duration,
    read: Duration,
    copy: Duration,
    transactions: Duration,
    bulk: Bulk,
    /// `/metrics` of each ingest process.
    metrics: Vec<String>,
    /// request_log rows, usage_hourly requests, dead letters.
    checks: (i64, i64, i64),
    hwm_kib: u64,
    fresh: Fresh,
}

/// Prints the table; fails if ingest's result is wrong.
fn report(args: &Args, r: &Measured) -> Result<()> {
    let n = args.events;
    let secs = |d: Duration| d.as_secs_f64();
    let (read_s, copy_s, total_s) = (secs(r.read), secs(r.copy), secs(r.bulk.total));
    let tx_s = secs(r.transactions);
    let rate = |s: f64| n as f64 / s;
    let (read_r, copy_r, total_r) = (rate(read_s), rate(copy_s), rate(total_s));
    let tx_r = rate(tx_s);
    let steady_s = secs(r.bulk.total - r.bulk.first);
    let steady_r = (n as i64 - r.bulk.at_first) as f64 / steady_s;
    let (vs_read, vs_copy, vs_tx) = (steady_r / read_r, steady_r / copy_r, steady_r / tx_r);
    let tx_vs_copy = tx_r / copy_r;
    let (produce_r, first_s, at_first) =
        (rate(secs(r.produce)), secs(r.bulk.first), r.bulk.at_first);
    let (rss, hwm) = (
        r.bulk.max_rss_kib as f64 / 1024.0,
        r.hwm_kib as f64 / 1024.0,
    );
    let (cpu, cpu_pct) = (r.bulk.cpu_s, 100.0 * r.bulk.cpu_s / total_s);
    // Counters add up over the processes; of quantiles, the worst is shown.
    let sum = |name: &str| r.metrics.iter().map(|t| metric(t, name)).sum::<f64>();
    let worst = |name: &str| {
        r.metrics
            .iter()
            .map(|t| metric(t, name))
            .fold(f64::NAN, f64::max)
    };
    let (batches, commit_s) = (
        sum("ingest_commit_seconds_count"),
        sum("ingest_commit_seconds_sum"),
    );
    let mean_batch = sum("ingest_batch_size_sum") / batches;
    let procs = args.processes;
    let commit_pct = 100.0 * commit_s / steady_s / f64::from(procs);
    let commit_mean = 1000.0 * commit_s / batches;
    let commit_p50 = 1000.0 * worst("ingest_commit_seconds{quantile=\"0.5\"}");
    let commit_p99 = 1000.0 * worst("ingest_commit_seconds{quantile=\"0.99\"}");
    let (rows, requests, dead) = r.checks;
    let correct = rows == n as i64 && requests == n as i64 && dead == 0;
    let ok = if correct { "yes" } else { "NO" };
    let mut fresh = r.fresh.latencies_ms.clone();
    fresh.sort_by(f64::total_cmp);
    let pct = |q: f64| {
        let i = ((fresh.len().max(1) - 1) as f64 * q).round() as usize;
        fresh.get(i).copied().unwrap_or(f64::NAN)
    };
    let (p50, p99, max, fresh_n, per_s) = (pct(0.5), pct(0.99), pct(1.0), fresh.len(), args.rate);
    let own_cpu = 100.0 * r.fresh.cpu_s / r.fresh.secs;
    let cores = std::thread::available_parallelism().map_or(0, |c| c.get());
    let (max_batch, linger_ms) = (args.max_batch.unwrap_or(0), args.linger_ms.unwrap_or(0));
    let load = r.load.split_whitespace().next().unwrap_or("?");
    let order = args.order;
    println!(
        r#"
== ingest benchmark: {n} events, {PARTITIONS} partitions, {cores} cores (nproc), load {load} at start
   request ids in {order:?} order (--order)
   ingest: {procs} process(es) in one group (--processes), INGEST_MAX_BATCH={max_batch}, INGEST_LINGER_MS={linger_ms}
   produce (idempotent, acks=all, lz4, linger 5 ms): {produce_r:.0} events/s (informational)

                                            seconds    events/s   ingest/ceiling
   (a) broker read ceiling                {read_s:>9.2} {read_r:>11.0} {vs_read:>16.2}
   (b) raw COPY ceiling, no indexes       {copy_s:>9.2} {copy_r:>11.0} {vs_copy:>16.2}
   (c) ingest's transactions alone        {tx_s:>9.2} {tx_r:>11.0} {vs_tx:>16.2}
   ingest, process start -> all committed {total_s:>9.2} {total_r:>11.0}
   ingest, first commit -> all committed  {steady_s:>9.2} {steady_r:>11.0}
   (the first commit came {first_s:.2} s after start, covering {at_first} events;
    ingest/ceiling uses the first-commit rate)
   (a), (b), (c): {procs} reader(s) / connection(s), each on its share of the partitions;
   (c) is (b) x {tx_vs_copy:.2}: ingest's own transactions for these events, batches of
    {max_batch} decoded beforehand, on {procs} connection(s), with no broker

   ingest RSS (largest process): max {rss:.1} MiB sampled while ingesting, VmHWM {hwm:.1} MiB at the end
   ingest CPU (all processes): {cpu:.2} s user+sys until all committed ({cpu_pct:.0}% of one core)
   postgres commits: {batches:.0} of {mean_batch:.0} messages on average, {commit_s:.2} s in
     total ({commit_pct:.0}% of the first-commit span per process); per batch mean
     {commit_mean:.1} ms, p50 {commit_p50:.1} ms, p99 {commit_p99:.1} ms (worst process)
   correct: {ok} (request_log {rows} rows, usage_hourly {requests} requests, {dead} dead
     letters; expected {n}, {n}, 0)

   freshness, {fresh_n} events at {per_s}/s (producer linger {FRESH_LINGER_MS} ms), produce ->
   visible in request_log: p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms
   (an order-based approximation across the {PARTITIONS} partitions: event i counts as
    visible at the first ~10 ms poll where request_log holds i+1 of the new events;
    this load generator used {own_cpu:.0}% of one core meanwhile)"#
    );
    ensure!(correct, "ingest's result is wrong (see above)");
    Ok(())
}

fn millis(ms: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms).context("time out of range")
}

/// A valid v1 event of tenant `i % 5`, like the fault drill's.
fn event(rng: &mut StdRng, i: usize, started_at: DateTime<Utc>) -> UsageEvent {
    let (tenant, priority) = TENANTS[i % TENANTS.len()];
    let prompt = rng.random_range(1..8_000);
    UsageEvent {
        schema_version: 1,
        request_id: RequestId::at(started_at),
        tenant_id: tenant.into(),
        api_key_id: format!("key_{tenant}"),
        model: MODELS[i % 2].into(),
        model_version: "2026.10".into(),
        priority,
        started_at,
        first_token_at: None,
        finished_at: started_at + TimeDelta::milliseconds(rng.random_range(50..20_000)),
        prompt_tokens: prompt,
        cached_tokens: rng.random_range(0..=prompt),
        completion_tokens: rng.random_range(0..2_000),
        gpu_seconds: Decimal::new(rng.random_range(1..50_000_000), 6),
        preempted_gpu_seconds: Decimal::new(rng.random_range(0..1_000), 6),
        finish_reason: [F::Stop, F::Length, F::Cancelled, F::Error][rng.random_range(0..4)],
        ttft_ms: Some(120),
        tpot_ms: Some(8),
        replica_id: "r0".into(),
        gateway_id: "gw-bench".into(),
        stream: false,
    }
}

/// The gateway relay's producer settings, with the given linger.
fn producer(brokers: &str, linger_ms: &str) -> Result<FutureProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", linger_ms)
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .create()?)
}

/// Queues one message (waiting while librdkafka's queue is full).
async fn send(p: &FutureProducer, topic: &str, key: &str, body: &[u8]) -> Result<DeliveryFuture> {
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

async fn delivered(acks: Vec<DeliveryFuture>) -> Result<()> {
    for ack in acks {
        ack.await
            .context("delivery cancelled")?
            .map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// Ceiling (a): all N messages read from the broker and copied, as ingest does.
fn broker_read(brokers: &str, topic: &str, n: usize, readers: i32) -> Result<Duration> {
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
    for p in (r..PARTITIONS).step_by(readers as usize) {
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

/// Ceiling (b): the same rows in one COPY (text format, 10k rows per send).
/// Ceiling (b): the same rows, formatted and COPYed into `request_log_raw`
/// (no indexes), on `streams` connections at once, each with its share of
/// the partitions, as ingest's processes would split them.
async fn copy_raw(
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
        .filter(|(i, _)| *i as i32 % PARTITIONS % streams == r);
    for (i, (e, hash)) in mine {
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
        writeln!(buf, "\t{}\t{i}", i as i32 % PARTITIONS)?;
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

/// The real ingest binary, next to this one, as `--processes` child
/// processes of one consumer group.
struct Ingests {
    procs: Vec<Ingest>,
    group: String,
    started: Instant,
}

impl Ingests {
    fn start(args: &Args, url: &str, topic: &str, suffix: &str) -> Result<Self> {
        let group = format!("bench-{suffix}");
        let started = Instant::now();
        let procs = (0..args.processes)
            .map(|i| Ingest::start(args, url, topic, &group, &format!("{suffix}-{i}")))
            .collect::<Result<_>>()?;
        Ok(Self {
            procs,
            group,
            started,
        })
    }

    fn check_running(&mut self) -> Result<()> {
        self.procs.iter_mut().try_for_each(Ingest::check_running)
    }

    fn scrape(&self) -> Vec<String> {
        let text = |p: &Ingest| p.scrape().unwrap_or_default();
        self.procs.iter().map(text).collect()
    }

    /// The largest value of a `/proc/<pid>/status` field among the processes.
    fn max_kib(&self, field: &str) -> u64 {
        let kib = |p: &Ingest| proc_kib(p.pid, field).unwrap_or(0);
        self.procs.iter().map(kib).max().unwrap_or(0)
    }

    /// CPU seconds of all the processes together.
    fn cpu_seconds(&self) -> f64 {
        let cpu = |p: &Ingest| cpu_seconds(p.pid).unwrap_or(f64::NAN);
        self.procs.iter().map(cpu).sum()
    }

    async fn stop(self) {
        for p in self.procs {
            p.stop().await;
        }
    }
}

/// One ingest process.
struct Ingest {
    child: tokio::process::Child,
    pid: u32,
    metrics_addr: std::net::SocketAddr,
    log: PathBuf,
}

impl Ingest {
    fn start(args: &Args, url: &str, topic: &str, group: &str, name: &str) -> Result<Self> {
        let bin = std::env::current_exe()?.with_file_name("ingest");
        let metrics_addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let log = std::env::temp_dir().join(format!("ingest-bench-{name}.log"));
        let out = std::fs::File::create(&log)?;
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.env("DATABASE_URL", url)
            .env("KAFKA_BROKERS", &args.kafka_brokers)
            .env("INGEST_TOPIC", topic)
            .env("INGEST_GROUP", group)
            .env("INGEST_METRICS_ADDR", metrics_addr.to_string())
            .env("RUST_LOG", "info,rdkafka=warn")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true);
        if let (Some(batch), Some(linger)) = (args.max_batch, args.linger_ms) {
            cmd.env("INGEST_MAX_BATCH", batch.to_string());
            cmd.env("INGEST_LINGER_MS", linger.to_string());
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let pid = child.id().context("ingest has no pid")?;
        Ok(Self {
            child,
            pid,
            metrics_addr,
            log,
        })
    }

    fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "ingest exited with {status}; its log: {}",
                self.log.display()
            );
        }
        Ok(())
    }

    /// `/metrics`, over a plain HTTP/1.1 request.
    fn scrape(&self) -> Result<String> {
        let mut s = std::net::TcpStream::connect(self.metrics_addr)?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    }

    /// SIGTERM (ingest commits what it holds), SIGKILL after 30 s. The log
    /// is kept only if ingest did not stop cleanly.
    async fn stop(mut self) {
        let pid = self.pid.to_string();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(Ok(status)) if status.success() => {
                let _ = std::fs::remove_file(&self.log);
            }
            Ok(_) => println!(
                "ingest did not stop cleanly; its log: {}",
                self.log.display()
            ),
            Err(_) => {
                let _ = self.child.kill().await;
                println!(
                    "ingest ignored SIGTERM for 30 s; its log: {}",
                    self.log.display()
                );
            }
        }
    }
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS:`, `VmHWM:`).
fn proc_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix(field))?;
    line.trim().trim_end_matches("kB").trim().parse().ok()
}

/// User + system CPU seconds of a process (Linux clock ticks are 1/100 s).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

/// A sample's value from Prometheus text (`name` may include labels); NaN if absent.
fn metric(text: &str, name: &str) -> f64 {
    let value = |l: &str| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok();
    text.lines().find_map(value).unwrap_or(f64::NAN)
}

struct Bulk {
    total: Duration,
    first: Duration,
    at_first: i64,
    max_rss_kib: u64,
    cpu_s: f64,
}

/// Polls the group's offsets in Postgres every 50 ms until they cover all N.
async fn wait_ingested(pool: &PgPool, ingest: &mut Ingests, n: usize) -> Result<Bulk> {
    let (mut first, mut max_rss_kib) = (None, 0);
    let query = "SELECT coalesce(sum(next_offset), 0)::bigint FROM consumer_offsets
                 WHERE consumer_group = $1";
    loop {
        ingest.check_running()?;
        max_rss_kib = max_rss_kib.max(ingest.max_kib("VmRSS:"));
        let done: i64 = sqlx::query_scalar(query)
            .bind(&ingest.group)
            .fetch_one(pool)
            .await?;
        let now = ingest.started.elapsed();
        if done > 0 && first.is_none() {
            first = Some((now, done));
        }
        if done >= n as i64 {
            let (first, at_first) = first.unwrap_or((now, done));
            let cpu_s = ingest.cpu_seconds();
            return Ok(Bulk {
                total: now,
                first,
                at_first,
                max_rss_kib,
                cpu_s,
            });
        }
        let late = now > Duration::from_secs(1800);
        ensure!(!late, "ingest committed only {done} of {n} in 30 minutes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Fresh {
    latencies_ms: Vec<f64>,
    /// How long the phase took, and the CPU this process used meanwhile.
    secs: f64,
    cpu_s: f64,
}

/// M events at a fixed rate, started_at = now, one send each, while
/// [`poll_visible`] watches request_log.
async fn freshness(
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
