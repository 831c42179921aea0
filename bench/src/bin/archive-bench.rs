//! `archive-bench`: how fast the archiver turns usage events on the topic
//! into committed Parquet files. Run it with `scripts/bench-archive.sh [N]`,
//! which builds it and the `archiver` binary it starts (`cargo build
//! --release -p bench -p ingest`) and runs `target/release/archive-bench`.
//!
//! On a fresh database (dropped at the end) and 4-partition topic: N events
//! of five tenants over two hours are produced; then the real `archiver`
//! binary runs as a process, timed from its start until its offsets in
//! Postgres cover all N, with its CPU time, peak RSS, files, bytes and
//! commit times (from its `/metrics`). Finally every file is read back and
//! counted.

#![allow(clippy::print_stdout, reason = "a benchmark prints its report")]

use std::time::{Duration, Instant};

use bench::database::FreshDatabase;
use bench::procfs::{cpu_seconds, status_kib};
use bench::prometheus::{bucket_quantile, metric};
use bench::service::{free_addr, Service};
use chrono::{DurationRound, TimeDelta, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rust_decimal::Decimal;
use usage_contract::{FinishReason, RequestId, UsageEvent};

const TENANTS: [&str; 5] = [
    "acme-corp",
    "codegen-platform",
    "finserv-team",
    "medai-labs",
    "research-squad",
];

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(200_000);
    let server = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/meterline".into());
    let suffix = format!("{:08x}", rand::random::<u32>());
    let db = FreshDatabase::create(&server, &format!("bench_archive_{suffix}")).await?;
    let result = run(n, &db, &suffix).await;
    db.finish(false).await?;
    result
}

/// The benchmark on the fresh database `db`, with a fresh topic and
/// consumer group named by `suffix`.
async fn run(n: usize, db: &FreshDatabase, suffix: &str) -> anyhow::Result<()> {
    let pool = db.connect().await?;
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let topic = format!("usage.events.v1.archbench.{suffix}");
    usage_contract::topic::create(&brokers, &topic, 4).await?;
    let dir = tempfile::tempdir()?;
    let mut rng = StdRng::seed_from_u64(1);
    let base = (Utc::now() - TimeDelta::hours(2)).duration_trunc(TimeDelta::milliseconds(1))?;
    let msgs: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| {
            let at = base + TimeDelta::milliseconds(7_200_000 * i as i64 / n as i64);
            let tenant = TENANTS[i % TENANTS.len()];
            let prompt = rng.random_range(1..4000);
            let e = UsageEvent {
                schema_version: 1,
                request_id: RequestId::at(at),
                tenant_id: tenant.into(),
                api_key_id: "key-1".into(),
                model: "llama-3.1-70b".into(),
                model_version: "2024-07".into(),
                priority: 3,
                started_at: at,
                first_token_at: Some(at + TimeDelta::milliseconds(40)),
                finished_at: at + TimeDelta::milliseconds(900),
                prompt_tokens: prompt,
                cached_tokens: prompt / 2,
                completion_tokens: rng.random_range(1..2000),
                gpu_seconds: Decimal::new(rng.random_range(1..10_000_000), 6),
                preempted_gpu_seconds: Decimal::ZERO,
                finish_reason: FinishReason::Stop,
                ttft_ms: Some(40),
                tpot_ms: Some(20),
                replica_id: "replica-1".into(),
                gateway_id: "gw-1".into(),
                stream: true,
            };
            (tenant.to_owned(), e.to_json())
        })
        .collect();
    let payload_bytes: usize = msgs.iter().map(|(_, p)| p.len()).sum();
    let produced = Instant::now();
    let producer = bench::produce::producer(&brokers, 5, "none")?;
    bench::produce::produce_all(&producer, &topic, msgs).await?;
    println!(
        "== archive benchmark: {n} events ({:.1} MiB of JSON), 4 partitions, {} cores; produced in {:.2} s",
        payload_bytes as f64 / 1048576.0,
        std::thread::available_parallelism().map_or(0, |p| p.get()),
        produced.elapsed().as_secs_f64()
    );

    let root = dir.path().join("archive");
    let metrics_addr = free_addr()?;
    let env = [
        ("DATABASE_URL", db.url().to_owned()),
        ("KAFKA_BROKERS", brokers),
        ("ARCHIVE_TOPIC", topic),
        ("ARCHIVE_GROUP", format!("archiver-bench-{suffix}")),
        ("ARCHIVE_URL", root.display().to_string()),
        ("ARCHIVE_METRICS_ADDR", metrics_addr.to_string()),
        ("ARCHIVE_LINGER_MS", "1000".into()),
    ];
    // The archiver built next to this binary (target/<profile>/).
    let log_path = dir.path().join("archiver.log");
    let started = Instant::now();
    let mut archiver = Service::start("archiver", "ingest", env, &log_path)?;
    let pid = archiver.pid();
    let mut first_commit: Option<Duration> = None;
    let mut cpu = 0.0;
    let mut hwm_kib = None;
    loop {
        archiver.check_running()?;
        let (done,): (i64,) =
            sqlx::query_as("SELECT coalesce(sum(next_offset), 0)::bigint FROM archive_offsets")
                .fetch_one(&pool)
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
            "archiver did not finish; see {}",
            log_path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let total = started.elapsed();
    let metrics = bench::prometheus::scrape(metrics_addr).await?;
    archiver.stop(Duration::from_secs(30)).await;
    let rss = hwm_kib.map_or("?".to_owned(), |kib| format!("{kib} kB"));

    let (files, rows, bytes): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(path), coalesce(sum(rows), 0)::bigint, coalesce(sum(bytes), 0)::bigint
         FROM archive_manifest",
    )
    .fetch_one(&pool)
    .await?;
    let paths: Vec<(String,)> =
        sqlx::query_as("SELECT path FROM archive_manifest WHERE path IS NOT NULL")
            .fetch_all(&pool)
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
