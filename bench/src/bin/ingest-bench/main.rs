//! `ingest-bench`: how fast ingest moves usage events from Kafka into
//! Postgres, next to three ceilings it cannot beat on this machine, and how soon
//! an event is visible. Run it with `scripts/bench-ingest.sh [flags]`, which
//! builds it and the `ingest` binary it starts (`cargo build --release -p bench
//! -p ingest`) and runs `target/release/ingest-bench`.
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
//!    consumer group, timed from their start until their offsets in Postgres
//!    cover all N, with peak RSS, CPU time and commit times (from their
//!    `/metrics`); request_log and usage_hourly are then checked against N;
//! 5. freshness: M more events at a fixed rate into the same running ingest,
//!    produce → visible in request_log, as percentiles.

#![allow(clippy::print_stdout, reason = "a benchmark prints its report")]

mod ceilings;
mod cpu_time;
mod freshness;
mod processes;
mod report;

use std::time::Instant;

use anyhow::{Context, Result};
use bench::database::FreshDatabase;
use bench::produce::{produce_all, producer};
use chrono::{DateTime, TimeDelta, Utc};
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rust_decimal::Decimal;
use sqlx::PgPool;
use usage_contract::FinishReason as F;
use usage_contract::{RequestId, UsageEvent};

use ceilings::{broker_read, copy_raw, transactions_alone};
use freshness::freshness;
use processes::{wait_ingested, Ingests};
use report::{report, Measured};

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
const FRESH_LINGER_MS: u32 = 20;

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
    #[arg(long = "max-batch")]
    max_batch_flag: Option<usize>,
    /// Passed to ingest as INGEST_LINGER_MS (default: what ingest would use).
    #[arg(long = "linger-ms")]
    linger_ms_flag: Option<u64>,
    /// INGEST_MAX_BATCH and INGEST_LINGER_MS as ingest runs with them: the
    /// flags, else ingest's defaults in this environment (set by `main`).
    #[arg(skip)]
    max_batch: usize,
    #[arg(skip)]
    linger_ms: u64,
    /// INGEST_SYNCHRONOUS_COMMIT as ingest runs with it (from this
    /// environment, which the ingest processes inherit).
    #[arg(skip = ingest::store::SynchronousCommit::On)]
    synchronous_commit: ingest::store::SynchronousCommit,
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
    let mut ingest = IngestSettings::try_parse_from(["ingest"])?.config;
    ingest.max_batch = args.max_batch_flag.unwrap_or(ingest.max_batch);
    ingest.linger_ms = args.linger_ms_flag.unwrap_or(ingest.linger_ms);
    // Ingest's own checks, so a bad flag fails here, naming the setting.
    ingest.validate()?;
    (args.max_batch, args.linger_ms) = (ingest.max_batch, ingest.linger_ms);
    args.synchronous_commit = ingest.synchronous_commit;
    let mut rng = StdRng::from_os_rng();
    let suffix = format!("{:08x}", rng.random::<u32>());
    let db = FreshDatabase::create(&args.database_url, &format!("bench_{suffix}")).await?;
    // The second database takes ceiling (c)'s rows, so that the real
    // ingest meets an empty request_log in the first.
    let tx_db = match FreshDatabase::create(&args.database_url, &format!("bench_{suffix}_tx")).await
    {
        Ok(tx_db) => tx_db,
        Err(e) => {
            db.finish(args.keep).await?;
            return Err(e);
        }
    };
    let result = run(&args, [&db, &tx_db], &suffix, &mut rng).await;
    for db in [db, tx_db] {
        db.finish(args.keep).await?;
    }
    result
}

/// `dbs`: the database ingest writes to, and the one for ceiling (c).
async fn run(args: &Args, dbs: [&FreshDatabase; 2], suffix: &str, rng: &mut StdRng) -> Result<()> {
    let (n, load) = (args.events, std::fs::read_to_string("/proc/loadavg")?);
    let [db, tx_db] = dbs;
    let pool = bench_database(db).await?;
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
    let bulk_producer = producer(&args.kafka_brokers, 5, "lz4")?;
    let messages = events.iter().map(|e| (&e.tenant_id, e.to_json()));
    produce_all(&bulk_producer, &topic, messages).await?;
    drop(bulk_producer);
    let produce = started.elapsed();
    println!("ceiling (a): reading them back from the broker");
    let read = broker_read(&args.kafka_brokers, &topic, n, args.processes)?;
    println!("ceiling (b): COPY into request_log_raw");
    let copy = copy_raw(&pool, &events, &hashes, args.processes).await?;
    drop(hashes);
    println!("ceiling (c): ingest's transactions alone, into a second database");
    let transactions = transactions_alone(
        tx_db,
        &topic,
        &events,
        args.max_batch,
        args.processes,
        args.synchronous_commit,
    )
    .await?;
    drop(events);

    println!("ingest: until its offsets cover all {n} events");
    let mut ingest = Ingests::start(args, db.url(), &topic, suffix)?;
    let bulk = wait_ingested(&pool, &mut ingest, n, db.name()).await?;
    let metrics = ingest.scrape().await;
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

/// The fresh bench database's pool, with its schema and the five reference
/// tenants.
async fn bench_database(db: &FreshDatabase) -> Result<PgPool> {
    let pool = db.connect().await?;
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
