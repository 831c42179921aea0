//! Latency the gateway adds, side by side in one run: the same
//! non-streaming requests sent to the in-process engine directly and
//! through the gateway over HTTP (auth, limits, outbox fsync included), with
//! the engine answering at once (`ENGINE_SPEEDUP=0`). With `KAFKA_BROKERS`
//! set (source `.stack/env`), the relay runs too, publishing to a fresh
//! topic and deleting what the broker acknowledged, as in a deployed
//! gateway; without it the outbox only grows.
//!
//! `cargo run --release -p gateway-lite --bin gateway-bench -- [rate] [seconds]`

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::upstream::Upstreams;
use engine::{CompletionRequest, ModelProfile, ServiceClass, Simulator};
use gateway_lite::idempotency::Idempotency;
use gateway_lite::limits::Limiter;
use gateway_lite::outbox::Outbox;
use gateway_lite::service::{app, AppState};
use gateway_lite::tenants::{Caller, Registry};
use serde_json::json;

const KEY: &str = "sk-bench-0001";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let rate: u64 = args.get(1).map_or(Ok(500), |a| a.parse())?;
    let secs: u64 = args.get(2).map_or(Ok(5), |a| a.parse())?;
    let dir = std::env::temp_dir().join(format!("gateway-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let engine = Arc::new(Simulator::new(ModelProfile::reference(), 0));
    let registry = Registry::default();
    registry.insert(
        KEY,
        Caller {
            tenant_id: "bench".into(),
            api_key_id: "key_bench".into(),
            priority: 5,
            max_concurrency: None,
            rate: None,
            limits: Arc::new(HashMap::new()),
        },
    );
    let outbox = Outbox::open(&dir.join("outbox"))?;
    let state = AppState {
        registry,
        engine: Arc::new(Upstreams::simulated(engine.clone())),
        outbox: outbox.clone(),
        gateway_id: "gw-bench".into(),
        speedup: 0,
        request_timeout: Duration::from_secs(600),
        limiter: Limiter::default(),
        idempotency: Idempotency::new(outbox.clone()),
        runs: tokio_util::task::TaskTracker::new(),
    };
    let (stop_relay, stop_rx) = tokio::sync::watch::channel(false);
    let relay = match std::env::var("KAFKA_BROKERS") {
        Ok(brokers) => {
            let topic = format!("gateway-bench.{}", std::process::id());
            usage_contract::topic::create(&brokers, &topic, 4).await?;
            Some(tokio::spawn(gateway_lite::relay::run(
                outbox.clone(),
                gateway_lite::relay::producer(&brokers)?,
                topic,
                stop_rx,
            )))
        }
        Err(_) => None,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app(state, None)).await });
    let url = format!("http://{addr}/v1/chat/completions");
    let client = reqwest::Client::new();

    // Both paths in one run, in pairs: at every due instant one request goes
    // to the engine directly and one through the gateway, so both meet the
    // same machine and the same lateness of the load generator's timer
    // (tokio's timer ticks by the millisecond: requests paced at 2x the rate
    // alone would give the two paths different, run-dependent offsets).
    let (direct, gateway) = {
        let (engine, client, url) = (engine.clone(), client.clone(), url.clone());
        fixed_rate(rate, secs, move |i| -> [BoxFuture; 2] {
            let engine = engine.clone();
            let (client, url) = (client.clone(), url.clone());
            [
                Box::pin(async move {
                    engine
                        .complete(&request(i))
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }),
                Box::pin(async move { post(&client, &url, i).await }),
            ]
        })
        .await
    };
    let line = |name: &str, s: &Stats| {
        format!(
            "{name:<8} {rate:>6} req/s  ok {:>6}  errors {:>4}  p50 {:>8.3} ms  p99 {:>8.3} ms",
            s.ok,
            s.errors,
            s.p(0.50),
            s.p(0.99)
        )
    };
    let mut out = vec![
        format!(
            "fixed rate {rate} req/s for {secs} s, non-streaming, ENGINE_SPEEDUP=0, relay {}",
            if relay.is_some() {
                "publishing"
            } else {
                "off (no KAFKA_BROKERS)"
            }
        ),
        line("engine", &direct),
        line("gateway", &gateway),
        format!(
            "added   p50 {:.3} ms  p99 {:.3} ms",
            gateway.p(0.50) - direct.p(0.50),
            gateway.p(0.99) - direct.p(0.99)
        ),
    ];
    // Highest sustained rate: closed loop with 64 clients for `secs`.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..64u64 {
        let (client, url) = (client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            let mut i = w << 32;
            while started.elapsed() < Duration::from_secs(secs) {
                if post(&client, &url, i).await.is_ok() {
                    n += 1;
                }
                i += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await?;
    }
    out.push(format!(
        "max sustained (64 closed-loop clients): {:.0} req/s",
        total as f64 / started.elapsed().as_secs_f64()
    ));
    if let Some(relay) = relay {
        let _ = stop_relay.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(10), relay).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let text = out.join("\n");
    eprintln!("{text}");
    Ok(())
}

fn request(i: u64) -> CompletionRequest {
    CompletionRequest {
        model: "llama-3.1-8b".into(),
        prompt: format!("bench request {i}"),
        max_tokens: Some(16),
        seed: i,
        tenant_id: "bench".into(),
        class: ServiceClass::from_priority(5),
        body: None,
    }
}

async fn post(client: &reqwest::Client, url: &str, i: u64) -> Result<(), String> {
    let res = client
        .post(url)
        .bearer_auth(KEY)
        .json(&json!({
            "model": "llama-3.1-8b",
            "messages": [{"role": "user", "content": format!("bench request {i}")}],
            "max_tokens": 16,
            "seed": i,
        }))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !res.status().is_success() {
        return Err(res.status().to_string());
    }
    res.bytes().await.map(|_| ()).map_err(|e| e.to_string())
}

#[derive(Default)]
struct Stats {
    ok: usize,
    errors: usize,
    latencies_ms: Vec<f64>,
}

impl Stats {
    fn p(&self, q: f64) -> f64 {
        if self.latencies_ms.is_empty() {
            return f64::NAN;
        }
        let i = ((self.latencies_ms.len() - 1) as f64 * q).round() as usize;
        self.latencies_ms[i.min(self.latencies_ms.len() - 1)]
    }
}

/// One request of either path.
type BoxFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// Sends the pair `f(i)` at `rate` per second for `secs`, each request on
/// its own task (the two spawned in alternating order), and measures each
/// from the moment it was due (so queueing counts). Returns the figures of
/// the first and of the second of each pair.
async fn fixed_rate<F>(rate: u64, secs: u64, f: F) -> (Stats, Stats)
where
    F: Fn(u64) -> [BoxFuture; 2],
{
    let n = rate * secs;
    let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let start = tokio::time::Instant::now();
    let mut tasks: [Vec<_>; 2] = [
        Vec::with_capacity(n as usize),
        Vec::with_capacity(n as usize),
    ];
    for i in 0..n {
        let at = start + interval * i as u32;
        tokio::time::sleep_until(at).await;
        let mut pair = f(i).map(Some);
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for path in order {
            if let Some(fut) = pair[path].take() {
                tasks[path].push(tokio::spawn(async move {
                    let r = fut.await;
                    (r.is_ok(), at.elapsed().as_secs_f64() * 1000.0)
                }));
            }
        }
    }
    let mut stats = [Stats::default(), Stats::default()];
    for (path, tasks) in tasks.into_iter().enumerate() {
        let s = &mut stats[path];
        for t in tasks {
            match t.await {
                Ok((true, ms)) => {
                    s.ok += 1;
                    s.latencies_ms.push(ms);
                }
                _ => s.errors += 1,
            }
        }
        s.latencies_ms.sort_by(f64::total_cmp);
    }
    let [first, second] = stats;
    (first, second)
}
