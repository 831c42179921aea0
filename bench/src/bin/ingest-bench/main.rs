//! `ingest-bench`: how fast ingest moves usage events from Kafka into
//! Postgres, next to three ceilings it cannot beat on this machine, and how soon
//! an event is visible. Run it with `scripts/bench-ingest.sh [flags]`, which
//! builds it and the `ingest` binary it starts (`cargo build --release -p bench
//! -p ingest`) and runs `target/release/ingest-bench`.
//!
//! One run, on fresh databases `mt_ingest_bench_<random>` and fresh
//! 4-partition topics `ingest-bench.<random>` (all dropped at the end; the
//! databases kept with `--keep`), for each of ingest's write paths
//! `--paths` names (`INGEST_WRITE_PATH`: by default `unnest`, the earlier
//! statements, then `rows`, the current ones), so before and after come
//! from one run:
//! 1. N events of the five reference tenants, from the `workload` crate's
//!    generator (their shares, models, token and GPU-time shapes), started
//!    in the 4 hours up to a minute ago, are produced (idempotent, acks=all,
//!    lz4, linger 5 ms) in the arrival order `--order` picks; the produce
//!    rate is informational;
//! 2. ceiling (a): plain consumers read (and copy) all N from the broker;
//! 3. `--rounds` rounds of: ceiling (b), COPY of the same N rows
//!    (formatting included) into `request_log_raw`, a plain copy of
//!    request_log without indexes; then (c), what ingest's design itself
//!    allows with no broker in front, once per write path (in turn, the
//!    order reversed every other round): the same N events, decoded
//!    beforehand, committed batch by batch with ingest's own
//!    `store::commit_batch` (dedupe, hourly, offsets: every transaction
//!    ingest runs) into a fresh database; each (c) is compared with the
//!    (b) of its round, so the ratios come with their spread;
//!    each with as many readers / connections as `--processes`, every one on
//!    its share of the partitions, as that many ingest processes would be;
//! 4. for each write path, the real `ingest` binary runs as `--processes`
//!    processes of one consumer group on a fresh database (and, after the
//!    first path, a fresh topic with the same N events), timed from their
//!    start until their offsets in Postgres cover all N, with peak RSS, CPU
//!    time and commit times (from their `/metrics`); request_log and
//!    usage_hourly are then checked against N;
//! 5. freshness: M more events at a fixed rate into the same running ingest
//!    (the generator's too, each moved to start when it is sent), produce →
//!    visible in request_log, as percentiles.
//!
//! Arrival order (`--order`), the order the bulk events are on the topic,
//! and so the order in which their request ids (UUIDv7s of their start)
//! reach request_log's primary key: the generator yields them by start
//! time; `arrival` puts them in the order they finished, as a gateway
//! emits an event when its request ends (long requests arrive after
//! shorter ones that started later, so ids arrive almost sorted);
//! `random` shuffles them with this run's random generator (every insert
//! lands at a random place in the key). The events themselves are the
//! same either way; only their order differs.

#![allow(clippy::print_stdout, reason = "a benchmark prints its report")]

mod ceilings;
mod cpu_time;
mod freshness;
mod processes;
mod report;

use std::time::Instant;

use anyhow::{ensure, Result};
use bench::produce::{produce_all, producer};
use chrono::{TimeDelta, Utc};
use clap::Parser;
use devstack::{Database, Topic};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;
use usage_contract::UsageEvent;

use ceilings::{broker_read, copy_raw, transactions_alone};
use freshness::freshness;
use ingest::store::{WritePath, Writes};
use processes::{wait_ingested, Ingests};
use report::{report, Measured, PathRun, Round};

const PARTITIONS: i32 = 4;
/// The bulk events start within this span, ending [`BULK_MARGIN`] ago.
const BULK_SPAN: TimeDelta = TimeDelta::hours(4);
/// Every bulk event started at least this long before the freshness phase,
/// which tells its own events by ids at or after its start.
const BULK_MARGIN: TimeDelta = TimeDelta::minutes(1);
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
    /// Keep the bench databases afterwards (their names are printed).
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
    /// The order of the bulk events (and so of their request ids) on the topic.
    #[arg(long, value_enum, default_value_t = Order::Arrival)]
    order: Order,
    /// Ingest's write paths to measure (INGEST_WRITE_PATH), comma-separated:
    /// `unnest` (the earlier statements) and `rows` (the current ones).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "unnest,rows")]
    paths: Vec<WritePath>,
    /// Rounds of ceilings (b) and (c): each measures raw COPY, then every
    /// path's transactions on fresh databases.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Measure the ceilings only (no ingest processes, no freshness).
    #[arg(long)]
    ceilings_only: bool,
}

/// The order of the bulk events on the topic; the events are the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Order {
    /// As a gateway emits them: by the time each request finished, so ids
    /// (their start times) arrive almost sorted.
    Arrival,
    /// Shuffled (a pessimistic order: every insert lands at a random place
    /// in the primary key).
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
    ensure!(!args.paths.is_empty(), "--paths names no write path");
    let mut rng = StdRng::from_os_rng();
    let suffix = format!("{:08x}", rng.random::<u32>());
    run(&args, &suffix, &mut rng).await
}

/// A fresh bench database (dropped with its handle unless `--keep`), with
/// the five reference tenants.
async fn fresh(args: &Args, kept: &mut Vec<String>) -> Result<(Database, PgPool)> {
    let mut db = Database::fresh_on(&args.database_url, "ingest_bench").await?;
    if args.keep {
        db.keep();
        kept.push(db.name().to_owned());
    }
    let pool = bench_database(&db).await?;
    Ok((db, pool))
}

async fn run(args: &Args, suffix: &str, rng: &mut StdRng) -> Result<()> {
    let (n, load) = (args.events, std::fs::read_to_string("/proc/loadavg")?);
    let mut kept = Vec::new();
    // Deleted when dropped, at the end of the run (after ingest stopped).
    let topic = Topic::fresh(&args.kafka_brokers, "ingest-bench", PARTITIONS).await?;
    let events = bulk_events(n, args.order, rng)?;
    ensure!(
        events.len() == n,
        "the workload gave {} events",
        events.len()
    );
    let hashes: Vec<[u8; 32]> = events.iter().map(UsageEvent::content_hash).collect();

    println!("producing {n} events to {}", topic.name);
    let started = Instant::now();
    produce_to(args, &topic.name, &events).await?;
    let produce = started.elapsed();
    println!("ceiling (a): reading them back from the broker");
    let read = broker_read(&args.kafka_brokers, &topic.name, n, args.processes)?;

    let (_copy_db, copy_pool) = fresh(args, &mut kept).await?;
    let mut rounds = Vec::new();
    for round in 0..args.rounds {
        println!(
            "round {}: ceiling (b), COPY into request_log_raw",
            round + 1
        );
        let copy = copy_raw(&copy_pool, &events, &hashes, args.processes).await?;
        let mut paths = args.paths.clone();
        if round % 2 == 1 {
            paths.reverse();
        }
        let mut transactions = Vec::new();
        for path in paths {
            println!(
                "round {}: ceiling (c), ingest's transactions alone ({path:?})",
                round + 1
            );
            let (_db, pool) = fresh(args, &mut kept).await?;
            let writes = Writes {
                synchronous_commit: args.synchronous_commit,
                path,
            };
            let took = transactions_alone(&pool, &topic.name, &events, args, writes).await?;
            transactions.push((path, took));
        }
        rounds.push(Round { copy, transactions });
    }
    copy_pool.close().await;
    drop(hashes);

    let mut runs = Vec::new();
    let mut topics = vec![topic];
    let paths = if args.ceilings_only {
        &[][..]
    } else {
        &args.paths[..]
    };
    for (i, &path) in paths.iter().enumerate() {
        if i > 0 {
            let topic = Topic::fresh(&args.kafka_brokers, "ingest-bench", PARTITIONS).await?;
            println!("producing the same {n} events to {}", topic.name);
            produce_to(args, &topic.name, &events).await?;
            topics.push(topic);
        }
        let topic = topics[i].name.clone();
        let (db, pool) = fresh(args, &mut kept).await?;
        println!("ingest ({path:?}): until its offsets cover all {n} events");
        let mut ingest = Ingests::start(args, path, &db.url, &topic, &format!("{suffix}-{i}"))?;
        let bulk = wait_ingested(&pool, &mut ingest, n, db.name()).await?;
        let metrics = ingest.scrape().await;
        let checks = sqlx::query_as(
            "SELECT (SELECT count(*) FROM request_log),
                    (SELECT coalesce(sum(requests), 0)::bigint FROM usage_hourly),
                    (SELECT count(*) FROM dead_letters)",
        )
        .fetch_one(&pool)
        .await?;
        println!(
            "freshness ({path:?}): {} events at {}/s",
            args.fresh_events, args.rate
        );
        let fresh = freshness(args, &topic, &pool, &mut ingest, rng).await;
        let hwm_kib = ingest.max_kib("VmHWM:");
        ingest.stop().await;
        pool.close().await;
        runs.push(PathRun {
            path,
            bulk,
            metrics,
            checks,
            hwm_kib,
            fresh: fresh?,
        });
    }
    drop(events);
    for name in kept {
        println!("kept database {name}");
    }
    let measured = Measured {
        load,
        produce,
        read,
        rounds,
        runs,
    };
    report(args, &measured)
}

/// Produces `events` to `topic` (idempotent, acks=all, lz4, linger 5 ms).
async fn produce_to(args: &Args, topic: &str, events: &[UsageEvent]) -> Result<()> {
    let bulk_producer = producer(&args.kafka_brokers, 5, "lz4")?;
    let messages = events.iter().map(|e| (&e.tenant_id, e.to_json()));
    produce_all(&bulk_producer, topic, messages).await?;
    Ok(())
}

/// N events of the reference tenants started in the [`BULK_SPAN`] up to
/// [`BULK_MARGIN`] ago (the generator's seed drawn from `rng`), in the
/// arrival `order`.
fn bulk_events(n: usize, order: Order, rng: &mut StdRng) -> Result<Vec<UsageEvent>> {
    let to = Utc::now() - BULK_MARGIN;
    let generated = workload::Generator::reference(rng.random(), to - BULK_SPAN, to, n as u64)?;
    let mut events: Vec<UsageEvent> = generated.collect();
    match order {
        // Stable: events that finished in the same millisecond keep their
        // start order.
        Order::Arrival => events.sort_by_key(|e| e.finished_at),
        Order::Random => events.shuffle(rng),
    }
    Ok(events)
}

/// The fresh bench database's pool, with the five reference tenants (those
/// of the `workload` crate, whose events the bench sends).
async fn bench_database(db: &Database) -> Result<PgPool> {
    let tenants = workload::Tenant::reference();
    let names: Vec<String> = tenants.iter().map(|t| t.name.clone()).collect();
    let priorities: Vec<i16> = tenants.iter().map(|t| t.priority).collect();
    sqlx::query(
        "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode)
         SELECT t, t, 'standard', p, 'per_token' FROM UNNEST($1::text[], $2::smallint[]) x(t, p)",
    )
    .bind(names)
    .bind(priorities)
    .execute(&db.pool)
    .await?;
    Ok(db.pool.clone())
}
