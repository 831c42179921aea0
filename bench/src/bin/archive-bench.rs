//! `archive-bench`: the archive's figures. Run it with
//! `scripts/bench-archive.sh [N]`, which builds it and the `archiver`
//! binary it starts in release mode.
//!
//! On a fresh database `mt_archive_bench_<random>` (dropped at the end), N
//! events of the five reference tenants over 24 closed hours, from the
//! `workload` crate's generator (seed 1):
//!
//! 1. the archiver's own ceiling: the rows decoded beforehand, encoded into
//!    batch files (100,000 rows each, one per hour) and written to a local
//!    directory, no Postgres;
//! 2. the `archiver` binary draining N queued request_log rows (inserted
//!    directly, as ingest's commits would), timed from its start until the
//!    queue is empty, with its CPU, peak RSS and manifest commit times;
//!    beside it, as the baseline, the time Postgres takes to hand out the
//!    same rows (`SELECT` of request_log in the archiver's batch size);
//! 3. bytes per event: the batch files, then the same events compacted,
//!    against the events as newline-delimited JSON;
//! 4. lookup latency of archived requests with a year of synthetic
//!    manifest (one compacted and three retired files per hour).

#![allow(clippy::print_stdout, reason = "a benchmark prints its report")]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use archive::format::{ArchivedRequest, Layout};
use bench::percentiles::Percentiles;
use bench::procfs::{cpu_seconds, status_kib};
use bench::prometheus::{bucket_quantile, metric};
use chrono::{DurationRound, NaiveDate, TimeDelta, Utc};
use devstack::health::free_port;
use devstack::{Database, Service};
use sqlx::PgPool;
use usage_contract::UsageEvent;

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
    run(n, &db).await
}

async fn insert_logged(pool: &PgPool, events: &[UsageEvent]) -> anyhow::Result<()> {
    let mut days: Vec<NaiveDate> = events.iter().map(|e| e.request_id.day()).collect();
    days.sort_unstable();
    days.dedup();
    for d in days {
        sqlx::query("SELECT ensure_request_log_partition($1)")
            .bind(d)
            .execute(pool)
            .await?;
    }
    for (c, chunk) in events.chunks(1500).enumerate() {
        let mut q = sqlx::QueryBuilder::new(
            "INSERT INTO request_log (request_id, tenant_id, api_key_id, model, model_version,
             priority, started_at, first_token_at, finished_at, prompt_tokens, cached_tokens,
             completion_tokens, gpu_seconds, preempted_gpu_seconds, finish_reason, ttft_ms,
             tpot_ms, replica_id, gateway_id, stream, content_hash, kafka_partition,
             kafka_offset, pool, dedicated_to, queue_wait_ms, preemptions) ",
        );
        q.push_values(chunk.iter().enumerate(), |mut b, (i, e)| {
            b.push_bind(e.request_id.as_uuid())
                .push_bind(&e.tenant_id)
                .push_bind(&e.api_key_id)
                .push_bind(&e.model)
                .push_bind(&e.model_version)
                .push_bind(e.priority)
                .push_bind(e.started_at)
                .push_bind(e.first_token_at)
                .push_bind(e.finished_at)
                .push_bind(e.prompt_tokens)
                .push_bind(e.cached_tokens)
                .push_bind(e.completion_tokens)
                .push_bind(e.gpu_seconds)
                .push_bind(e.preempted_gpu_seconds)
                .push_bind(e.finish_reason.as_str())
                .push_bind(e.ttft_ms)
                .push_bind(e.tpot_ms)
                .push_bind(&e.replica_id)
                .push_bind(&e.gateway_id)
                .push_bind(e.stream)
                .push_bind(e.content_hash().to_vec())
                .push_bind((c % 4) as i32)
                .push_bind((c * 1500 + i) as i64)
                .push_bind(e.placement.as_ref().map(|p| p.pool.clone()))
                .push_bind(e.placement.as_ref().and_then(|p| p.dedicated_to.clone()))
                .push_bind(e.placement.as_ref().map(|p| p.queue_wait_ms))
                .push_bind(e.placement.as_ref().map(|p| p.preemptions));
        });
        q.build().execute(pool).await?;
    }
    Ok(())
}

async fn run(n: usize, db: &Database) -> anyhow::Result<()> {
    let pool = &db.pool;
    let to = Utc::now().duration_trunc(TimeDelta::hours(1))? - TimeDelta::hours(1);
    let from = to - TimeDelta::hours(24);
    let events: Vec<UsageEvent> =
        workload::Generator::reference(SEED, from, to, n as u64)?.collect();
    anyhow::ensure!(
        events.len() == n,
        "the workload gave {} events",
        events.len()
    );
    let json_bytes: usize = events.iter().map(|e| e.to_json().len() + 1).sum();
    println!(
        "== archive benchmark: {n} events over 24 closed hours ({:.1} MiB of NDJSON), {} cores",
        json_bytes as f64 / 1048576.0,
        std::thread::available_parallelism().map_or(0, |p| p.get()),
    );
    let dir = tempfile::tempdir()?;

    // 1. The ceiling: decoded rows → batch files on disk.
    let rows: Vec<ArchivedRequest> = events
        .iter()
        .enumerate()
        .map(|(i, e)| ArchivedRequest {
            event: e.clone(),
            ingested_at: e.finished_at + TimeDelta::milliseconds(700),
            kafka_partition: (i % 4) as i32,
            kafka_offset: i as i64,
        })
        .collect();
    let ceiling_store = archive::store::open(dir.path().join("ceiling").to_str().unwrap_or("x"))?;
    let started = Instant::now();
    for (b, batch) in rows.chunks(100_000).enumerate() {
        let mut hours: BTreeMap<(NaiveDate, i16), Vec<ArchivedRequest>> = BTreeMap::new();
        for r in batch {
            hours
                .entry(archive::archiver::hour_of(r))
                .or_default()
                .push(r.clone());
        }
        for (file, bytes) in
            archive::archiver::encode_files(hours, &format!("b{b}"), Layout::Batch, 0)?
        {
            archive::store::put(&ceiling_store, &file.path, bytes).await?;
        }
    }
    let ceiling = started.elapsed();
    println!(
        "   (1) ceiling, decoded rows -> batch files  {:>8.2} s  {:>9.0} events/s",
        ceiling.as_secs_f64(),
        n as f64 / ceiling.as_secs_f64()
    );
    drop(rows);

    // 2. The archiver binary draining the queue.
    insert_logged(pool, &events).await?;
    let started = Instant::now();
    let mut read = 0usize;
    let mut after = 0_i64;
    loop {
        // The archiver's reads: the oldest queue rows holding up to 100,000
        // ids, then their request_log rows.
        let queued: Vec<(i64, Vec<uuid::Uuid>)> = sqlx::query_as(
            "SELECT batch_id, request_ids FROM (
                 SELECT batch_id, request_ids, sum(ids) OVER (ORDER BY batch_id) - ids AS before
                 FROM archive_queue_batches WHERE batch_id > $1) q
             WHERE before < 100000 ORDER BY batch_id",
        )
        .bind(after)
        .fetch_all(pool)
        .await?;
        let Some(last) = queued.last().map(|(b, _)| *b) else {
            break;
        };
        after = last;
        let ids: Vec<uuid::Uuid> = queued.into_iter().flat_map(|(_, ids)| ids).collect();
        let (Some(&from), Some(&to)) = (ids.iter().min(), ids.iter().max()) else {
            break;
        };
        let got = archive::queue::logged_between(pool, from, to).await?;
        read += got.len() + 1;
    }
    let baseline = started.elapsed();
    anyhow::ensure!(read == n, "the baseline read {read} rows");
    let root = dir.path().join("archive");
    let metrics_addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let env = [
        ("DATABASE_URL", db.url.clone()),
        ("ARCHIVE_URL", root.display().to_string()),
        ("ARCHIVE_METRICS_ADDR", metrics_addr.to_string()),
        ("ARCHIVE_LINGER_MS", "1000".into()),
        ("ARCHIVE_COMPACT_EVERY_SECS", "0".into()),
    ];
    let env = env.map(|(k, v)| (k.to_owned(), v)).into();
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
        let (queued,): (i64,) =
            sqlx::query_as("SELECT coalesce(sum(ids), 0)::bigint FROM archive_queue_batches")
                .fetch_one(pool)
                .await?;
        if (queued as usize) < n && first_commit.is_none() {
            first_commit = Some(started.elapsed());
        }
        cpu = cpu_seconds(pid).unwrap_or(cpu);
        hwm_kib = status_kib(pid, "VmHWM:").or(hwm_kib);
        if queued == 0 {
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
    let after_first = total - first_commit.unwrap_or_default();
    let rss = hwm_kib.map_or("?".to_owned(), |kib| format!("{kib} kB"));
    println!(
        "   (2) archiver, queue -> files, first commit -> all committed {:>6.2} s  {:>9.0} events/s",
        after_first.as_secs_f64(),
        n as f64 / after_first.as_secs_f64().max(1e-9)
    );
    println!(
        "       archiver, process start -> all committed             {:>6.2} s  {:>9.0} events/s",
        total.as_secs_f64(),
        n as f64 / total.as_secs_f64()
    );
    println!(
        "       baseline: Postgres handing out the same rows (queue + request_log reads) {:>6.2} s  {:>9.0} events/s; archiver / baseline {:.2}",
        baseline.as_secs_f64(),
        n as f64 / baseline.as_secs_f64(),
        baseline.as_secs_f64() / after_first.as_secs_f64().max(1e-9)
    );
    println!(
        "       CPU {cpu:.2} s user+sys ({:.0} events per CPU-second), peak RSS {rss}",
        n as f64 / cpu.max(1e-9)
    );
    let commits = metric(&metrics, "archive_commit_seconds_count").max(0.0);
    println!(
        "       manifest commit mean {:.1} ms, p99 <= {:.1} ms ({commits} commits)",
        metric(&metrics, "archive_commit_seconds_sum") / commits.max(1.0) * 1000.0,
        bucket_quantile(&metrics, "archive_commit_seconds", 0.99) * 1000.0
    );

    // 3. Bytes per event, before and after compaction.
    let store = archive::store::open(root.to_str().unwrap_or("x"))?;
    let (a, b) = (
        from.date_naive() - chrono::Days::new(1),
        to.date_naive() + chrono::Days::new(1),
    );
    let before = archive::manifest::live(pool, a, b).await?;
    let bytes_before: i64 = before.iter().map(|f| f.bytes).sum();
    let started = Instant::now();
    let policy = archive::compact::Policy {
        settle: TimeDelta::zero(),
        ..archive::compact::Policy::default()
    };
    let done = archive::compact::compact_due(pool, &store, Utc::now(), policy, false).await?;
    let compaction = started.elapsed();
    let live = archive::manifest::live(pool, a, b).await?;
    let bytes_after: i64 = live.iter().map(|f| f.bytes).sum();
    let rows_after: i64 = live.iter().map(|f| f.rows).sum();
    println!(
        "   (3) NDJSON {:.1} bytes/event; batch files (zstd) {:.1} bytes/event in {} files; compacted {:.1} bytes/event in {} files ({} hours in {:.2} s, {:.0} events/s); {rows_after} rows live",
        json_bytes as f64 / n as f64,
        bytes_before as f64 / n as f64,
        before.len(),
        bytes_after as f64 / n as f64,
        live.len(),
        done.len(),
        compaction.as_secs_f64(),
        n as f64 / compaction.as_secs_f64()
    );

    // 4. Lookup with a year of synthetic manifest.
    sqlx::query(
        "INSERT INTO archive_manifest (path, day, hour, level, min_request_id, max_request_id,
             rows, bytes, sha256, retired_at, replaced_by)
         SELECT 'synthetic/' || h || '-' || k || '.parquet',
                (t AT TIME ZONE 'UTC')::date, extract(hour FROM t AT TIME ZONE 'UTC')::smallint,
                CASE WHEN k = 0 THEN 1 ELSE 0 END,
                request_log_bound((t AT TIME ZONE 'UTC')::date), request_log_bound((t AT TIME ZONE 'UTC')::date + 1),
                300000, 9000000, sha256(h::text::bytea),
                CASE WHEN k = 0 THEN NULL ELSE t + interval '2 hours' END,
                CASE WHEN k = 0 THEN NULL ELSE 1 END
         FROM generate_series(1, 8760) h, generate_series(0, 3) k,
              LATERAL (SELECT $1::timestamptz - h * interval '1 hour' AS t) s",
    )
    .bind(from)
    .execute(pool)
    .await?;
    let (listed,): (i64,) = sqlx::query_as("SELECT count(*) FROM archive_manifest")
        .fetch_one(pool)
        .await?;
    let mut took = Vec::new();
    for e in events.iter().step_by((n / 200).max(1)) {
        let started = Instant::now();
        let found = archive::reader::lookup(pool, &store, e.request_id).await?;
        took.push(started.elapsed());
        anyhow::ensure!(
            found.is_some_and(|f| &f.event == e),
            "lookup of {} failed",
            e.request_id
        );
    }
    let p = Percentiles::of_durations_ms(&took);
    println!(
        "   (4) lookup of an archived request, {listed} manifest rows (a year): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} lookups)",
        p.at(0.5),
        p.at(0.99),
        p.at(1.0),
        p.len()
    );
    Ok(())
}
