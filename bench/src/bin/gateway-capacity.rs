//! Two capacity figures for docs/benchmarks.md:
//!
//! 1. The outbox's durable append rate: many concurrent appenders, each
//!    waiting for its event's flushed group commit (what every request does
//!    before it is answered), in the system temp directory; with the time
//!    each append waited. Baseline in the same run: the disk's own floor,
//!    one write plus `fdatasync` at a time into a zero-filled file (of one
//!    event: what a lone appender cannot beat; of 100: a busy group), and
//!    the same into space only reserved with `fallocate`, to show why
//!    segments are zero-filled.
//! 2. The gateway's resident memory with 1,000 open streams: the real
//!    `gateway-lite` binary (next to this one, so built in the same profile)
//!    with the engine in real time (`ENGINE_SPEEDUP=1`), so the streams stay
//!    open (1,000 slots, each opening its next stream when one ends); VmRSS
//!    from `/proc/<pid>/status`, sampled while all slots are in flight. Needs
//!    Postgres (`DATABASE_URL`; a fresh database of its own,
//!    `mt_gateway_capacity_<random>`) and the broker (`KAFKA_BROKERS`; a
//!    fresh topic `usage.events.v1.bench.<random>`), both dropped at the
//!    end: `scripts/stack.sh up`.
//!
//! ```sh
//! cargo build --release -p bench -p gateway-lite && . .stack/env &&
//!   target/release/gateway-capacity [outbox seconds] [streams]
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bench::percentiles::Percentiles;
use devstack::health::{free_port, wait_http};
use devstack::{Database, Service, Topic};
use gateway_lite::outbox::Outbox;
use serde_json::json;

const KEY: &str = "sk-bench-streams-0001";
/// The fresh topic's prefix.
const TOPIC: &str = "usage.events.v1.bench";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let secs: u64 = args.get(1).map_or(Ok(5), |a| a.parse())?;
    let streams: usize = args.get(2).map_or(Ok(1000), |a| a.parse())?;
    let mut out = Vec::new();
    for (zero_filled, events) in [(true, 1), (false, 1), (true, 100), (false, 100)] {
        out.push(disk_floor(secs, zero_filled, events)?);
        eprintln!("{}", out.last().map_or("", String::as_str));
    }
    for appenders in [1, 100, 1000, 4000] {
        out.push(outbox_rate(appenders, secs).await?);
        eprintln!("{}", out.last().map_or("", String::as_str));
    }
    out.push(stream_memory(streams).await?);
    eprintln!("---");
    eprintln!("{}", out.join("\n"));
    Ok(())
}

/// A usage event's size: the relay stores the contract's JSON, ~500 bytes.
fn payload(i: u64) -> Vec<u8> {
    json!({
        "schema_version": 1,
        "request_id": format!("req_0190f3a2-7b1c-7d4e-9a2b-{i:012x}"),
        "tenant_id": "acme-corp",
        "api_key_id": "key_acme_demo",
        "model": "llama-3.1-70b",
        "model_version": "70b-2026.10",
        "priority": 5,
        "started_at": "2026-11-29T20:19:28.123Z",
        "finished_at": "2026-11-29T20:19:29.456Z",
        "prompt_tokens": 212,
        "cached_tokens": 64,
        "completion_tokens": 187,
        "gpu_seconds": "0.912345678",
        "finish_reason": "stop",
        "stream": false,
        "gateway_id": "gw-1",
        "ttft_ms": 41,
        "e2e_ms": 1333,
        "content_hash": "9f2c4e7a1b3d5f6081a2c3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e",
    })
    .to_string()
    .into_bytes()
}

fn scratch_dir(what: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("gateway-capacity-{}-{what}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// p50 and p99 of `waits`, in ms.
fn percentiles(waits: &[Duration]) -> (f64, f64) {
    let p = Percentiles::of_durations_ms(waits);
    (p.at(0.50), p.at(0.99))
}

/// One write of `events` events and `fdatasync` at a time, into
/// preallocated space: zero-filled as the outbox's segments are, or (for
/// comparison) only reserved with `fallocate`.
fn disk_floor(secs: u64, zero_filled: bool, events: usize) -> anyhow::Result<String> {
    use std::os::unix::fs::FileExt;
    let dir = scratch_dir(if zero_filled { "floor" } else { "reserved" })?;
    let file = if zero_filled {
        gateway_lite::outbox::log::create_segment(&dir, 0, 256 << 20)?
    } else {
        let file = std::fs::File::create(dir.join("reserved"))?;
        rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, 256 << 20)?;
        file.sync_all()?;
        file
    };
    let record = payload(0).repeat(events);
    let (started, until) = (Instant::now(), Duration::from_secs(secs));
    let (mut offset, mut waits) = (0u64, Vec::new());
    while started.elapsed() < until && offset + (record.len() as u64) < 256 << 20 {
        let t = Instant::now();
        file.write_all_at(&record, offset)?;
        file.sync_data()?;
        waits.push(t.elapsed());
        offset += record.len() as u64;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    let n = waits.len();
    let (p50, p99) = percentiles(&waits);
    Ok(format!(
        "disk floor, {events:>3} event(s) per write + fdatasync, {:<9} {:>6.0} flushes/s  (each p50 {p50:.3} ms, p99 {p99:.3} ms; {n} in {elapsed:.1} s)",
        if zero_filled { "zeroed:" } else { "reserved:" },
        n as f64 / elapsed
    ))
}

/// `appenders` tasks append for `secs`, each waiting for its commit.
async fn outbox_rate(appenders: u64, secs: u64) -> anyhow::Result<String> {
    let dir = scratch_dir(&appenders.to_string())?;
    let outbox = Outbox::open(&dir.join("outbox"))?;
    let started = Instant::now();
    let until = Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for w in 0..appenders {
        let outbox = outbox.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = w << 32;
            let mut waits = Vec::new();
            while started.elapsed() < until {
                let t = Instant::now();
                outbox.append("acme-corp".into(), payload(i)).await?;
                waits.push(t.elapsed());
                i += 1;
            }
            anyhow::Ok(waits)
        }));
    }
    let mut waits = Vec::new();
    for t in tasks {
        waits.extend(t.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let n = waits.len() as u64;
    let stored = outbox.depth();
    anyhow::ensure!(
        stored == n,
        "outbox holds {stored} events, {n} were acknowledged"
    );
    drop(outbox);
    let _ = std::fs::remove_dir_all(&dir);
    let (p50, p99) = percentiles(&waits);
    Ok(format!(
        "outbox durable appends, {appenders:>4} concurrent appenders: {:>8.0} events/s  (each waited p50 {p50:.3} ms, p99 {p99:.3} ms; {n} events of {} B in {elapsed:.1} s)",
        n as f64 / elapsed,
        payload(0).len()
    ))
}

/// The gateway's memory with `streams` streams open, on a fresh database
/// that is dropped afterwards.
async fn stream_memory(streams: usize) -> anyhow::Result<String> {
    // Before anything is created: fail at once if the binary is not built.
    devstack::process::workspace_bin("gateway-lite")?;
    // Dropped when the handle is, however the run ends.
    let db = Database::fresh_on(&devstack::postgres::shared_url(), "gateway_capacity").await?;
    serve_streams(streams, &db).await
}

/// [`stream_memory`] on the database `db`, with a fresh topic.
async fn serve_streams(streams: usize, db: &Database) -> anyhow::Result<String> {
    let brokers = devstack::topic::shared_brokers();
    // Deleted when dropped, after the gateway is killed.
    let topic = Topic::fresh(&brokers, TOPIC, 1).await?;
    let dir = std::env::temp_dir().join(format!("gateway-capacity-{}-rss", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let tenants = dir.join("tenants.yaml");
    std::fs::write(
        &tenants,
        format!(
            "tenants:
  - name: bench-streams
    plan: enterprise
    priority: 5
    weight: 1
    rateLimit: {{ requestsPerSecond: 100000, burst: 100000 }}
    maxConcurrency: 100000
    billingMode: per_token
    shadow: false
    timeZone: UTC
    slo: {{ bestEffort: true }}
    keys: [{{ id: key_bench_streams, key: {KEY} }}]
    limits: [{{ model: \"*\", maxContext: 131072, maxOutput: 4096 }}]
"
        ),
    )?;
    // billing-api owns the tenants; the gateway only reads them.
    let seed = billing_api::tenant_admin::load("tenants.yaml", &tenants)?;
    let pool = schema::connect(&db.url, 2, Duration::from_secs(30)).await?;
    billing_api::tenant_admin::apply(&pool, &seed).await?;
    pool.close().await;
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let env: [(&str, String); 8] = [
        ("DATABASE_URL", db.url.clone()),
        ("KAFKA_BROKERS", brokers),
        ("GATEWAY_TOPIC", topic.name.clone()),
        ("GATEWAY_ADDR", addr.to_string()),
        ("GATEWAY_OUTBOX", dir.join("outbox").display().to_string()),
        ("GATEWAY_GLOBAL_RPS", "0".into()),
        ("ENGINE_SPEEDUP", "1".into()),
        ("RUST_LOG", "warn".into()),
    ];
    let env = env.map(|(k, v)| (k.to_owned(), v)).into();
    // Logs to gateway-lite.log in `dir`.
    let mut gateway = Service::start("gateway-lite", "gateway-lite", &[], env, &dir)?;
    let result = sample_memory(streams, &format!("http://{addr}"), &mut gateway).await;
    gateway.kill9().await;
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// Opens `streams` stream slots against the gateway at `base` and samples
/// its memory while they are in flight.
async fn sample_memory(
    streams: usize,
    base: &str,
    gateway: &mut Service,
) -> anyhow::Result<String> {
    let pid = gateway.pid().context("the gateway has no pid")?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(streams)
        .build()?;
    wait_http(&format!("{base}/healthz"), gateway, Duration::from_secs(60)).await?;
    // One warm-up stream, so the idle figure includes what any first request allocates.
    let warm = client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(
            &json!({"model": "llama-3.1-8b", "max_tokens": 4, "stream": true,
                      "messages": [{"role": "user", "content": "warm up"}]}),
        )
        .send()
        .await?;
    warm.bytes().await?;
    let idle = kib(pid, "VmRSS:")?;

    // Each slot holds one stream open and opens the next as soon as it ends
    // (the simulator's answers run 16 to 600 tokens, so some end early).
    let in_flight = Arc::new(AtomicU64::new(0));
    let opened = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::with_capacity(streams);
    for slot in 0..streams as u64 {
        let (client, base) = (client.clone(), base.to_owned());
        let (in_flight, opened, stop) = (in_flight.clone(), opened.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut seed = slot << 32;
            while !stop.load(Ordering::Relaxed) {
                in_flight.fetch_add(1, Ordering::Relaxed);
                let result = one_stream(&client, &base, seed).await;
                in_flight.fetch_sub(1, Ordering::Relaxed);
                result?;
                opened.fetch_add(1, Ordering::Relaxed);
                seed += 1;
            }
            anyhow::Ok(())
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while opened.load(Ordering::Relaxed) < streams as u64 {
        if let Some(i) = tasks.iter().position(|t| t.is_finished()) {
            let failed = tasks.swap_remove(i).await?;
            anyhow::bail!("a stream slot failed: {failed:?}");
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} streams completed within 60 s",
            opened.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Sample while the slots are busy.
    let (mut peak, mut min_in_flight, mut min_active) = (0, u64::MAX, f64::MAX);
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        peak = peak.max(kib(pid, "VmRSS:")?);
        min_in_flight = min_in_flight.min(in_flight.load(Ordering::Relaxed));
        let metrics = client
            .get(format!("{base}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        let active: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("gateway_active_requests"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        min_active = min_active.min(active);
    }
    let hwm = kib(pid, "VmHWM:")?;
    stop.store(true, Ordering::Relaxed);
    let failed = tasks.iter().any(|t| t.is_finished());
    for t in &tasks {
        t.abort();
    }
    anyhow::ensure!(!failed, "a stream slot failed while memory was sampled");
    Ok(format!(
        "gateway resident memory, {streams} stream slots (ENGINE_SPEEDUP=1, llama-3.1-8b): VmRSS {:.1} MiB (idle {:.1} MiB, VmHWM {:.1} MiB; while sampling at least {min_in_flight} streams in flight, gateway_active_requests >= {min_active})",
        peak as f64 / 1024.0,
        idle as f64 / 1024.0,
        hwm as f64 / 1024.0,
    ))
}

/// One streaming request, read to its end.
async fn one_stream(client: &reqwest::Client, base: &str, seed: u64) -> anyhow::Result<()> {
    let mut res = client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({
            "model": "llama-3.1-8b",
            "messages": [{"role": "user", "content": format!("stream {seed}: tell me a long story")}],
            "max_tokens": 2048,
            "seed": seed,
            "stream": true,
            "stream_options": {"include_usage": true},
        }))
        .send()
        .await?;
    anyhow::ensure!(res.status().is_success(), "stream {seed}: {}", res.status());
    while res.chunk().await?.is_some() {}
    Ok(())
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS:`).
fn kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    bench::procfs::status_kib(pid, field)
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}
