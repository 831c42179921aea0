//! `archive-bench`: how fast the archiver turns usage events on the topic
//! into committed Parquet files. Run it with `scripts/bench-archive.sh [N]`,
//! which builds it and the `archiver` binary it starts (`cargo build
//! --release -p bench -p ingest`) and runs `target/release/archive-bench`.
//!
//! On a fresh database `mt_archive_bench_<random>` and a fresh 4-partition
//! topic `usage.events.v1.archbench.<random>` (both dropped at the end): N
//! events of the five reference tenants over the last two hours, from the
//! `workload` crate's generator (seed 1: the same figures every run, the
//! times moving with the clock), are produced in the order they started;
//! then the real `archiver` binary runs as a process, timed from its start
//! until its offsets in Postgres cover all N, with its CPU time, peak RSS,
//! files, bytes and commit times (from its `/metrics`). Finally every file
//! is read back and counted.

#![allow(clippy::print_stdout, reason = "a benchmark prints its report")]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bench::procfs::{cpu_seconds, status_kib};
use bench::prometheus::{bucket_quantile, metric};
use chrono::{TimeDelta, Utc};
use devstack::health::free_port;
use devstack::{Database, Service, Topic};

/// The generator's seed.
const SEED: u64 = 1;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(200_000);
    // Dropped when the handle is, however the run ends.
    let db = Database::fresh_on(&devstack::postgres::shared_url(), "archive_bench").await?;
    let suffix = devstack::database::unique_suffix();
    run(n, &db, &suffix).await
}

/// The benchmark on the fresh database `db`, with a fresh topic, and a
/// consumer group named by `suffix`.
async fn run(n: usize, db: &Database, suffix: &str) -> anyhow::Result<()> {
    let pool = &db.pool;
    let brokers = devstack::topic::shared_brokers();
    // Deleted when dropped, after the archiver stopped.
    let topic = Topic::fresh(&brokers, "usage.events.v1.archbench", 4).await?;
    let to = Utc::now();
    let events = workload::Generator::reference(SEED, to - TimeDelta::hours(2), to, n as u64)?;
    let msgs: Vec<(String, Vec<u8>)> = events.map(|e| (e.tenant_id.clone(), e.to_json())).collect();
    anyhow::ensure!(msgs.len() == n, "the workload gave {} events", msgs.len());
    let dir = tempfile::tempdir()?;
    let payload_bytes: usize = msgs.iter().map(|(_, p)| p.len()).sum();
    let produced = Instant::now();
    let producer = bench::produce::producer(&brokers, 5, "none")?;
    bench::produce::produce_all(&producer, &topic.name, msgs).await?;
    println!(
        "== archive benchmark: {n} events ({:.1} MiB of JSON), 4 partitions, {} cores; produced in {:.2} s",
        payload_bytes as f64 / 1048576.0,
        std::thread::available_parallelism().map_or(0, |p| p.get()),
        produced.elapsed().as_secs_f64()
    );

    let root = dir.path().join("archive");
    let metrics_addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let env = [
        ("DATABASE_URL", db.url.clone()),
        ("KAFKA_BROKERS", brokers),
        ("ARCHIVE_TOPIC", topic.name.clone()),
        ("ARCHIVE_GROUP", format!("archiver-bench-{suffix}")),
        ("ARCHIVE_URL", root.display().to_string()),
        ("ARCHIVE_METRICS_ADDR", metrics_addr.to_string()),
        ("ARCHIVE_LINGER_MS", "1000".into()),
    ];
    let env = env.map(|(k, v)| (k.to_owned(), v)).into();
    // The archiver built next to this binary (target/<profile>/), logging
    // to archiver.log in the temporary directory.
    let started = Instant::now();
    let mut archiver = Service::start("archiver", "archiver", &[], env, dir.path())?;
    let pid = archiver
        .pid()
        .ok_or_else(|| anyhow::anyhow!("the archiver has no pid"))?;
    let mut first_commit: Option<Duration> = None;
    let mut cpu = 0.0;
    let mut hwm_kib = None;
    loop {
        archiver.check_running()?;
        let (done,): (i64,) =
            sqlx::query_as("SELECT coalesce(sum(next_offset), 0)::bigint FROM archive_offsets")
                .fetch_one(pool)
                .await?;
        if done > 0 && first_commit.is_none() {
            first_commit = Some(started.elapsed());
        }
        cpu = cpu_seconds(pid).unwrap_or(cpu);
        hwm_kib = status_kib(pid, "VmHWM:").or(hwm_kib);
        if done as usize >= n {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "archiver did not finish in 10 minutes; its log ends:\n{}",
            archiver.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let total = started.elapsed();
    let metrics = bench::prometheus::scrape(metrics_addr).await?;
    archiver.terminate(Duration::from_secs(30)).await;
    let rss = hwm_kib.map_or("?".to_owned(), |kib| format!("{kib} kB"));

    let (files, rows, bytes): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(path), coalesce(sum(rows), 0)::bigint, coalesce(sum(bytes), 0)::bigint
         FROM archive_manifest",
    )
    .fetch_one(pool)
    .await?;
    let paths: Vec<(String,)> =
        sqlx::query_as("SELECT path FROM archive_manifest WHERE path IS NOT NULL")
            .fetch_all(pool)
            .await?;
    let mut read_back = 0;
    for (p,) in paths {
        let data = std::fs::read(root.join(&p))?;
        read_back += ingest::archive::writer::decode(bytes::Bytes::from(data))?.len();
    }
    let commits = CommitTimes::parse(&metrics);
    let after_first = total - first_commit.unwrap_or_default();
    println!(
        "   archiver, process start -> all committed  {:>8.2} s  {:>9.0} events/s",
        total.as_secs_f64(),
        n as f64 / total.as_secs_f64()
    );
    println!(
        "   archiver, first commit -> all committed   {:>8.2} s  {:>9.0} events/s",
        after_first.as_secs_f64(),
        n as f64 / after_first.as_secs_f64().max(1e-9)
    );
    println!(
        "   CPU {cpu:.2} s user+sys ({:.0} events per CPU-second), peak RSS {rss}",
        n as f64 / cpu.max(1e-9)
    );
    println!(
        "   {files} files, {:.1} MiB of Parquet ({:.1} bytes/event, {:.1}x smaller than the JSON)",
        bytes as f64 / 1048576.0,
        bytes as f64 / rows.max(1) as f64,
        payload_bytes as f64 / bytes.max(1) as f64
    );
    println!(
        "   manifest commit mean {}, p50 {}, p99 {} (bucket bounds; {} commits)",
        commits.mean(),
        commits.at_most(0.5),
        commits.at_most(0.99),
        commits.count
    );
    println!(
        "   correct: {} ({rows} rows in the manifest, {read_back} read back, {n} produced)",
        if rows as usize == n && read_back == n {
            "yes"
        } else {
            "NO"
        }
    );
    Ok(())
}

/// `archive_commit_seconds` as the archiver exports it: a histogram.
struct CommitTimes<'a> {
    metrics: &'a str,
    count: f64,
}

impl<'a> CommitTimes<'a> {
    const NAME: &'static str = "archive_commit_seconds";

    fn parse(metrics: &'a str) -> Self {
        let count = metric(metrics, &format!("{}_count", Self::NAME));
        Self {
            metrics,
            // NaN (not exported yet) reads as no commits.
            count: count.max(0.0),
        }
    }

    fn mean(&self) -> String {
        if self.count == 0.0 {
            return "?".to_owned();
        }
        let sum = metric(self.metrics, &format!("{}_sum", Self::NAME));
        format!("{:.1} ms", sum / self.count * 1000.0)
    }

    /// The upper bound of the bucket the `q` quantile falls in.
    fn at_most(&self, q: f64) -> String {
        match bucket_quantile(self.metrics, Self::NAME, q) {
            bound if bound.is_nan() => "?".to_owned(),
            bound if bound.is_finite() => format!("<= {:.1} ms", bound * 1000.0),
            _ => "> the largest bucket".to_owned(),
        }
    }
}
