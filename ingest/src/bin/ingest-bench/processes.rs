//! The real ingest binary as child processes of one consumer group: start,
//! watch (RSS, CPU, `/metrics`), wait until their offsets cover the bulk
//! load, stop.

use std::collections::HashMap;
use std::io::{Read, Write as _};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use sqlx::PgPool;

use crate::cpu_time::{Part, Sample};
use crate::Args;

/// The real ingest binary, next to this one, as `--processes` child
/// processes of one consumer group.
pub(crate) struct Ingests {
    procs: Vec<Ingest>,
    group: String,
    started: Instant,
}

impl Ingests {
    pub(crate) fn start(args: &Args, url: &str, topic: &str, suffix: &str) -> Result<Self> {
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

    pub(crate) fn check_running(&mut self) -> Result<()> {
        self.procs.iter_mut().try_for_each(Ingest::check_running)
    }

    pub(crate) fn scrape(&self) -> Vec<String> {
        let text = |p: &Ingest| p.scrape().unwrap_or_default();
        self.procs.iter().map(text).collect()
    }

    /// The largest value of a `/proc/<pid>/status` field among the processes.
    pub(crate) fn max_kib(&self, field: &str) -> u64 {
        let kib = |p: &Ingest| proc_kib(p.pid, field).unwrap_or(0);
        self.procs.iter().map(kib).max().unwrap_or(0)
    }

    /// CPU seconds of all the processes together.
    pub(crate) fn cpu_seconds(&self) -> f64 {
        let cpu = |p: &Ingest| cpu_seconds(p.pid).unwrap_or(f64::NAN);
        self.procs.iter().map(cpu).sum()
    }

    pub(crate) fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(|p| p.pid).collect()
    }

    /// SIGTERM to all at once (so none takes over the partitions of another
    /// that stops first), then waits for each.
    pub(crate) async fn stop(self) {
        for p in &self.procs {
            p.terminate();
        }
        for p in self.procs {
            p.wait_stopped().await;
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
        cmd.env("INGEST_MAX_BATCH", args.max_batch.to_string())
            .env("INGEST_LINGER_MS", args.linger_ms.to_string());
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

    /// SIGTERM: ingest commits what it holds and leaves the group.
    fn terminate(&self) {
        let pid = self.pid.to_string();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
    }

    /// Waits for the exit after [`Self::terminate`], SIGKILL after 30 s. The
    /// log is kept only if ingest did not stop cleanly.
    async fn wait_stopped(mut self) {
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
pub(crate) fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

/// A sample's value from Prometheus text (`name` may include labels); NaN if absent.
pub(crate) fn metric(text: &str, name: &str) -> f64 {
    let value = |l: &str| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok();
    text.lines().find_map(value).unwrap_or(f64::NAN)
}

/// The upper bound of the histogram bucket that holds quantile `q` of
/// `name` (`name_bucket{le="…"}` lines, cumulative); NaN without samples.
pub(crate) fn bucket_quantile(text: &str, name: &str, q: f64) -> f64 {
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let (le, count) = l.strip_prefix(&prefix)?.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    let total = buckets.last().map_or(0.0, |b| b.1);
    if total == 0.0 {
        return f64::NAN;
    }
    buckets
        .iter()
        .find(|(_, cumulative)| *cumulative >= q * total)
        .map_or(f64::NAN, |(le, _)| *le)
}

pub(crate) struct Bulk {
    pub(crate) total: Duration,
    pub(crate) first: Duration,
    pub(crate) at_first: i64,
    pub(crate) max_rss_kib: u64,
    pub(crate) cpu_s: f64,
    /// CPU of the pipeline's processes from the first commit until all
    /// committed: the steady state, without the group join.
    pub(crate) steady_cpu: HashMap<Part, f64>,
}

/// Polls the group's offsets in Postgres every 50 ms until they cover all
/// N. `ingest_db`: the database ingest writes to.
pub(crate) async fn wait_ingested(
    pool: &PgPool,
    ingest: &mut Ingests,
    n: usize,
    ingest_db: &str,
) -> Result<Bulk> {
    let (mut first, mut max_rss_kib) = (None, 0);
    let sample = |ingest: &Ingests| Sample::take(ingest_db, &ingest.pids());
    let mut cpu_at_first = Sample::default();
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
            cpu_at_first = sample(ingest);
        }
        if done >= n as i64 {
            let steady_cpu = sample(ingest).since(&cpu_at_first);
            let (first, at_first) = first.unwrap_or((now, done));
            let cpu_s = ingest.cpu_seconds();
            return Ok(Bulk {
                total: now,
                first,
                at_first,
                max_rss_kib,
                cpu_s,
                steady_cpu,
            });
        }
        let late = now > Duration::from_secs(1800);
        ensure!(!late, "ingest committed only {done} of {n} in 30 minutes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
