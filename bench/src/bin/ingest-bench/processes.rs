//! The real ingest binary as child processes of one consumer group: start,
//! watch (RSS, CPU, `/metrics`), wait until their offsets cover the bulk
//! load, stop.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use bench::procfs::{cpu_seconds, status_kib};
use clap::ValueEnum;
use devstack::health::free_port;
use devstack::Service;
use ingest::store::WritePath;
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
    pub(crate) fn start(
        args: &Args,
        path: WritePath,
        url: &str,
        topic: &str,
        suffix: &str,
    ) -> Result<Self> {
        let group = format!("bench-{suffix}");
        let started = Instant::now();
        let procs = (0..args.processes)
            .map(|i| Ingest::start(args, path, url, topic, &group, &format!("{suffix}-{i}")))
            .collect::<Result<_>>()?;
        Ok(Self {
            procs,
            group,
            started,
        })
    }

    pub(crate) fn check_running(&mut self) -> Result<()> {
        let check = |p: &mut Ingest| p.service.check_running();
        Ok(self.procs.iter_mut().try_for_each(check)?)
    }

    /// `/metrics` of each process (empty if it did not answer).
    pub(crate) async fn scrape(&self) -> Vec<String> {
        let mut texts = Vec::with_capacity(self.procs.len());
        for p in &self.procs {
            let text = bench::prometheus::scrape(p.metrics_addr).await;
            texts.push(text.unwrap_or_default());
        }
        texts
    }

    /// The largest value of a `/proc/<pid>/status` field among the processes.
    pub(crate) fn max_kib(&self, field: &str) -> u64 {
        let kib = |p: &Ingest| p.service.pid().and_then(|pid| status_kib(pid, field));
        let kib = |p: &Ingest| kib(p).unwrap_or(0);
        self.procs.iter().map(kib).max().unwrap_or(0)
    }

    /// CPU seconds of all the processes together.
    pub(crate) fn cpu_seconds(&self) -> f64 {
        let cpu = |p: &Ingest| p.service.pid().and_then(cpu_seconds).unwrap_or(f64::NAN);
        self.procs.iter().map(cpu).sum()
    }

    pub(crate) fn pids(&self) -> Vec<u32> {
        self.procs.iter().filter_map(|p| p.service.pid()).collect()
    }

    /// SIGTERM to all at once (so none takes over the partitions of another
    /// that stops first), then waits for each.
    pub(crate) async fn stop(self) {
        for p in &self.procs {
            p.service.signal_term();
        }
        for p in self.procs {
            p.wait_stopped().await;
        }
    }
}

/// One ingest process.
struct Ingest {
    service: Service,
    metrics_addr: SocketAddr,
}

impl Ingest {
    /// `target/<profile>/ingest`, logging to `ingest-bench-<name>.log` in
    /// the system temp directory.
    fn start(
        args: &Args,
        path: WritePath,
        url: &str,
        topic: &str,
        group: &str,
        name: &str,
    ) -> Result<Self> {
        let path = path.to_possible_value().map(|v| v.get_name().to_owned());
        let metrics_addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let env = [
            ("DATABASE_URL", url.to_owned()),
            ("KAFKA_BROKERS", args.kafka_brokers.clone()),
            ("INGEST_TOPIC", topic.to_owned()),
            ("INGEST_GROUP", group.to_owned()),
            ("INGEST_METRICS_ADDR", metrics_addr.to_string()),
            ("INGEST_MAX_BATCH", args.max_batch.to_string()),
            ("INGEST_LINGER_MS", args.linger_ms.to_string()),
            ("INGEST_WRITE_PATH", path.unwrap_or_default()),
        ];
        let env = env.map(|(k, v)| (k.to_owned(), v)).into();
        let name = format!("ingest-bench-{name}");
        let service = Service::start(&name, "ingest", &[], env, &std::env::temp_dir())?;
        Ok(Self {
            service,
            metrics_addr,
        })
    }

    /// Waits for the exit after SIGTERM (ingest commits what it holds and
    /// leaves the group), SIGKILL after 30 s. The log is kept only if ingest
    /// did not stop cleanly.
    async fn wait_stopped(mut self) {
        let log = self.service.log_path().to_owned();
        match self.service.wait_exit(Duration::from_secs(30)).await {
            Some(status) if status.success() => {
                let _ = std::fs::remove_file(&log);
            }
            Some(_) => {
                println!("ingest did not stop cleanly; its log: {}", log.display());
            }
            None => {
                println!(
                    "ingest ignored SIGTERM for 30 s; its log: {}",
                    log.display()
                );
            }
        }
    }
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
