//! `archive-bench`: how fast the archiver turns usage events on the topic
//! into committed Parquet files. Run it with `scripts/bench-archive.sh [N]`.
//!
//! On a fresh database and 4-partition topic: N events of five tenants over
//! two hours are produced; then the real `archiver` binary runs as a
//! process, timed from its start until its offsets in Postgres cover all N,
//! with its CPU time, peak RSS, files, bytes and commit times (from its
//! `/metrics`). Finally every file is read back and counted.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DurationRound, TimeDelta, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rust_decimal::Decimal;
use tests::process::free_port;
use tests::TestStack;
use usage_contract::{FinishReason, RequestId, UsageEvent};

const TENANTS: [&str; 5] = [
    "acme-corp",
    "codegen-platform",
    "finserv-team",
    "medai-labs",
    "research-squad",
];

fn proc_field(pid: u32, file: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_owned()))
}

/// user + system CPU seconds of a process, from /proc/<pid>/stat.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(200_000);
    let mut rng = StdRng::seed_from_u64(1);
    let stack = TestStack::new("archbench").await;
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
    stack.produce(&stack.producer(), &msgs).await;
    println!(
        "== archive benchmark: {n} events ({:.1} MiB of JSON), 4 partitions, {} cores; produced in {:.2} s",
        payload_bytes as f64 / 1048576.0,
        std::thread::available_parallelism().map_or(0, |p| p.get()),
        produced.elapsed().as_secs_f64()
    );

    let root = stack.dir.path().join("archive");
    let port = free_port();
    let mut env = stack.env();
    for (k, v) in [
        ("ARCHIVE_TOPIC", stack.topic.clone()),
        ("ARCHIVE_GROUP", format!("archiver-{}", stack.group)),
        ("ARCHIVE_URL", root.display().to_string()),
        ("ARCHIVE_METRICS_ADDR", format!("127.0.0.1:{port}")),
        ("ARCHIVE_LINGER_MS", "1000".into()),
    ] {
        env.insert(k.into(), v);
    }
    // The archiver built next to this binary (target/<profile>/).
    let bin = std::env::current_exe()?.with_file_name("archiver");
    let log_path = stack.dir.path().join("archiver.log");
    let log = std::fs::File::create(&log_path)?;
    let started = Instant::now();
    let mut child = std::process::Command::new(&bin)
        .envs(&env)
        .env("RUST_LOG", "info,rdkafka=warn")
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let pid = child.id();
    let mut first_commit: Option<Duration> = None;
    let mut cpu = 0.0;
    let mut rss = String::new();
    loop {
        let (done,): (i64,) =
            sqlx::query_as("SELECT coalesce(sum(next_offset), 0)::bigint FROM archive_offsets")
                .fetch_one(&stack.pool)
                .await?;
        if done > 0 && first_commit.is_none() {
            first_commit = Some(started.elapsed());
        }
        cpu = cpu_seconds(pid).unwrap_or(cpu);
        rss = proc_field(pid, "status", "VmHWM:").unwrap_or(rss);
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
    let metrics = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await?
        .text()
        .await?;
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    child.wait()?;

    let (files, rows, bytes): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(path), coalesce(sum(rows), 0)::bigint, coalesce(sum(bytes), 0)::bigint
         FROM archive_manifest",
    )
    .fetch_one(&stack.pool)
    .await?;
    let paths: Vec<(String,)> =
        sqlx::query_as("SELECT path FROM archive_manifest WHERE path IS NOT NULL")
            .fetch_all(&stack.pool)
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
struct CommitTimes {
    /// (upper bound in seconds, cumulative count), `+Inf` last.
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl CommitTimes {
    fn parse(metrics: &str) -> Self {
        let value = |l: &str| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        let mut out = Self {
            buckets: Vec::new(),
            sum: 0.0,
            count: 0.0,
        };
        for l in metrics.lines() {
            if let Some(rest) = l.strip_prefix("archive_commit_seconds_bucket{le=\"") {
                let bound = rest.split('"').next().unwrap_or("");
                let bound = if bound == "+Inf" {
                    f64::INFINITY
                } else {
                    bound.parse().unwrap_or(f64::NAN)
                };
                out.buckets.extend(value(l).map(|n| (bound, n)));
            } else if l.starts_with("archive_commit_seconds_sum") {
                out.sum = value(l).unwrap_or(0.0);
            } else if l.starts_with("archive_commit_seconds_count") {
                out.count = value(l).unwrap_or(0.0);
            }
        }
        out
    }

    fn mean(&self) -> String {
        if self.count == 0.0 {
            return "?".to_owned();
        }
        format!("{:.1} ms", self.sum / self.count * 1000.0)
    }

    /// The upper bound of the bucket the `q` quantile falls in.
    fn at_most(&self, q: f64) -> String {
        let rank = q * self.count;
        match self.buckets.iter().find(|(_, n)| *n >= rank && *n > 0.0) {
            Some((bound, _)) if bound.is_finite() => format!("<= {:.1} ms", bound * 1000.0),
            Some(_) => "> the largest bucket".to_owned(),
            None => "?".to_owned(),
        }
    }
}
