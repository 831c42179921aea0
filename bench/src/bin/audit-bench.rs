//! `audit-bench`: the audit's scan rate. Run it with
//! `scripts/bench-audit.sh [N]` (default 10,000,000), which builds it in
//! release mode.
//!
//! On a fresh database `mt_audit_bench_<random>` (dropped at the end), N
//! events of the five reference tenants over one 30-day month from the
//! `workload` generator (seed 1), written as compacted files (one per hour
//! of request-id time, as compaction leaves a closed hour) to a local
//! directory and listed in the manifest. Then, three times each, median
//! reported:
//!
//! - **baseline**: the parquet crate reading the same files, only the
//!   columns the audit aggregates (the read the query engine cannot beat);
//! - **audit scan**: the audit's own DataFusion aggregation of the month
//!   (per tenant, model, priority, hour, dedicated owner and ingestion
//!   class against 12 invoice instants), as `audit` runs it.
//!
//! and the audit's rate extrapolated to the reference month (~216 million
//! events).

#![allow(clippy::print_stdout, reason = "a benchmark prints its report")]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use archive::format::{ArchivedRequest, Layout};
use chrono::{DateTime, DurationRound, NaiveDate, TimeDelta, Utc};
use devstack::Database;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;

const SEED: u64 = 1;
const REFERENCE_MONTH: f64 = 216e6;
/// The columns the audit's query reads.
const COLUMNS: [&str; 10] = [
    "tenant_id",
    "model",
    "priority",
    "started_at",
    "dedicated_to",
    "ingested_at",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "gpu_seconds",
];

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(10_000_000);
    let db = Database::fresh_on(&devstack::postgres::shared_url(), "audit_bench").await?;
    let pool = &db.pool;
    let dir = tempfile::tempdir()?;
    let store = archive::store::open(dir.path().to_str().unwrap_or("audit-bench"))?;
    let to = Utc::now().duration_trunc(TimeDelta::days(1))? - TimeDelta::days(2);
    let from = to - TimeDelta::days(30);
    println!(
        "== audit benchmark: {n} events over 30 days, {} cores",
        std::thread::available_parallelism().map_or(0, |p| p.get())
    );

    // The archive: compacted files, one per hour, listed in the manifest.
    let started = Instant::now();
    let mut hour: BTreeMap<(NaiveDate, i16), Vec<ArchivedRequest>> = BTreeMap::new();
    let (mut files, mut bytes, mut rows) = (0usize, 0i64, 0u64);
    let mut flush =
        async |hour: &mut BTreeMap<(NaiveDate, i16), Vec<ArchivedRequest>>| -> anyhow::Result<()> {
            let groups = std::mem::take(hour);
            for (_, mut part) in groups {
                archive::format::sort_for_scans(&mut part);
                let key = archive::archiver::hour_of(&part[0]);
                let encoded = archive::archiver::encode_files(
                    BTreeMap::from([(key, part)]),
                    &format!("compacted-{}", uuid::Uuid::now_v7()),
                    Layout::Compacted,
                    1,
                )?;
                for (file, body) in &encoded {
                    archive::store::put(&store, &file.path, body.clone()).await?;
                    files += 1;
                    bytes += file.bytes;
                    rows += file.rows as u64;
                }
                let listed: Vec<_> = encoded.into_iter().map(|(f, _)| f).collect();
                anyhow::ensure!(archive::manifest::swap(pool, &[], &listed).await?);
            }
            Ok(())
        };
    for (i, e) in workload::Generator::reference(SEED, from, to, n)?.enumerate() {
        let r = ArchivedRequest {
            ingested_at: e.finished_at + TimeDelta::milliseconds(700),
            kafka_partition: (i % 4) as i32,
            kafka_offset: i as i64,
            event: e,
        };
        let key = archive::archiver::hour_of(&r);
        if hour.keys().next().is_some_and(|k| *k != key) {
            flush(&mut hour).await?;
        }
        hour.entry(key).or_default().push(r);
    }
    flush(&mut hour).await?;
    println!(
        "archive written: {rows} events in {files} files, {:.1} MiB, {:.1} bytes/event ({:.0} s)",
        bytes as f64 / 1048576.0,
        bytes as f64 / rows as f64,
        started.elapsed().as_secs_f64()
    );

    // Twelve invoice instants across the month, as a year of
    // finalizations classify rows.
    let instants: Vec<DateTime<Utc>> = (1..=12)
        .map(|k| from + TimeDelta::days(k * 5 / 2))
        .collect();
    let files = archive::manifest::live(
        pool,
        (from - TimeDelta::days(1)).date_naive(),
        to.date_naive(),
    )
    .await?;
    let mut baseline = Vec::new();
    let mut audit = Vec::new();
    let mut counted = (0u64, 0i64);
    for _ in 0..3 {
        let t = Instant::now();
        counted.0 = read_columns(&store, &files).await?;
        baseline.push(t.elapsed());
        let t = Instant::now();
        let (hours, stats) = audit::scan::hours(pool, &store, from, to, &instants).await?;
        audit.push(t.elapsed());
        counted.1 = stats.requests;
        anyhow::ensure!(!hours.is_empty());
    }
    anyhow::ensure!(
        counted.0 == rows && counted.1 == rows as i64,
        "read {} and aggregated {} of {rows} events",
        counted.0,
        counted.1
    );
    let rate = |d: Duration| rows as f64 / d.as_secs_f64();
    let (b, a) = (median(&mut baseline), median(&mut audit));
    println!(
        "(a) parquet crate, the audit's 10 columns  {:>9.0} events/s  ({:.2} s, median of 3)",
        rate(b),
        b.as_secs_f64()
    );
    println!(
        "(b) audit scan (DataFusion aggregation)    {:>9.0} events/s  ({:.2} s)   (b)/(a) {:.2}",
        rate(a),
        a.as_secs_f64(),
        b.as_secs_f64() / a.as_secs_f64()
    );
    println!(
        "reference month (~216M events) at (b): {:.0} s ({:.1} min) on these cores",
        REFERENCE_MONTH / rate(a),
        REFERENCE_MONTH / rate(a) / 60.0
    );
    Ok(())
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Reads every file's audit columns with the parquet crate; returns the rows.
async fn read_columns(
    store: &archive::store::ArchiveStore,
    files: &[archive::manifest::Listed],
) -> anyhow::Result<u64> {
    let mut rows = 0u64;
    for f in files {
        let body = archive::store::get(store, &f.path).await?;
        rows += tokio::task::spawn_blocking(move || -> anyhow::Result<u64> {
            let builder = ParquetRecordBatchReaderBuilder::try_new(body)?;
            let mask = ProjectionMask::columns(builder.parquet_schema(), COLUMNS);
            let mut n = 0u64;
            for batch in builder.with_projection(mask).build()? {
                n += batch?.num_rows() as u64;
            }
            Ok(n)
        })
        .await??;
    }
    Ok(rows)
}
