//! Latency the gateway adds, side by side in one run, on every path a
//! request can take: at each due instant one request goes straight to the
//! engine and one through the gateway over HTTP (auth, limits, outbox
//! fsync included), with the engine answering at once (`ENGINE_SPEEDUP=0`):
//!
//! - `json`: non-streaming, in-process engine (direct: the in-process call);
//! - `stream`: `"stream": true`, in-process engine (direct: the same call;
//!   the gateway's figure is the time to its last SSE frame);
//! - `http`: non-streaming through an HTTP upstream (the engine's own HTTP
//!   server on a local port; direct: the same request sent to it);
//! - `http-stream`: streaming through the HTTP upstream (direct: the same
//!   streaming request sent to it).
//!
//! Then the pacing check: streams from an engine paced in real time
//! (`ENGINE_SPEEDUP=1`), read directly and through the gateway, comparing
//! the gaps between SSE frames a client sees.
//!
//! With `KAFKA_BROKERS` set (source `.stack/env`), the relay runs too,
//! publishing to a fresh topic (deleted at the end) and deleting what the
//! broker acknowledged, as in a deployed gateway; without it the outbox
//! only grows.
//!
//! `limits` as the third argument compares limits in memory with limits
//! shared through Redis instead; `fairness` compares the gateway with the
//! fairness layer off and on (`GATEWAY_QUEUE`), on a pool of 12 replicas,
//! in as many rounds as the fourth argument says (each round's figures,
//! their median and the figures of every round's samples together).
//! `deployed` measures the gateway as it is deployed (see [`deployed`]):
//! the `gateway-lite` binary in front of the `engine` binary, with each
//! component switched off in turn in the same run.
//!
//! ```sh
//! cargo build --release -p bench -p gateway-lite -p engine && . .stack/env &&
//!   target/release/gateway-bench [rate] [seconds] [serving|plain|limits|fairness|deployed] [rounds]
//! ```

mod deployed;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use admission::limits::Limiter;
use admission::upstream::{RemoteModel, Upstreams};
use bench::percentiles::Percentiles;
use engine::identity::{self, Secret, Signer};
use engine::{CompletionRequest, ModelProfile, ServiceClass, Simulator};
use gateway_lite::idempotency::Idempotency;
use gateway_lite::outbox::Outbox;
use gateway_lite::service::{app, AppState};
use gateway_lite::tenants::{Caller, Registry};
use serde_json::json;

/// At least 16 characters, as the gateway requires of a key it loads.
const KEY: &str = "sk-bench-0000000001";
/// The model served in process.
const LOCAL: &str = "llama-3.1-8b";
/// The same model served by the engine's HTTP server, unpaced.
const HTTP: &str = "llama-3.1-8b-http";
/// The same model served by the engine's HTTP server in real time.
const PACED: &str = "llama-3.1-8b-paced";
/// The secret the gateway signs `x-meterline-identity` with and the
/// engine's HTTP server checks (local ports only).
const IDENTITY_SECRET: &str = "gateway-bench-identity-secret-0123456789";
/// The env var the bench's upstreams read it from.
const IDENTITY_SECRET_ENV: &str = "GATEWAY_BENCH_IDENTITY_SECRET";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Before anything else runs: the upstreams read it in `Upstreams::new`.
    std::env::set_var(IDENTITY_SECRET_ENV, IDENTITY_SECRET);
    let args: Vec<String> = std::env::args().collect();
    let rate: u64 = args.get(1).map_or(Ok(500), |a| a.parse())?;
    let secs: u64 = args.get(2).map_or(Ok(5), |a| a.parse())?;
    // `plain`: serve with bare `axum::serve` (no no-delay, no timeouts),
    // the baseline the shared `serving` layer is measured against.
    let plain = match args.get(3).map(String::as_str) {
        None | Some("serving") => false,
        Some("plain") => true,
        Some("limits") => return limits(rate, secs).await,
        Some("fairness") => {
            let rounds: u32 = args.get(4).map_or(Ok(1), |a| a.parse())?;
            return fairness(rate, secs, rounds.max(1)).await;
        }
        Some("deployed") => return deployed::run(rate, secs).await,
        Some(other) => {
            anyhow::bail!(
                "third argument must be serving, plain, limits, fairness or deployed, got {other:?}"
            )
        }
    };
    let dir = std::env::temp_dir().join(format!("gateway-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let engine = Arc::new(Simulator::new(ModelProfile::reference(), 0));
    let engine_url = serve_engine(0, plain).await?;
    let paced_url = serve_engine(1, plain).await?;
    let registry = Registry::default();
    registry.insert(KEY, bench_caller());
    let outbox = Outbox::open(&dir.join("outbox"))?;
    let remote = vec![
        remote_model(HTTP, &engine_url),
        remote_model(PACED, &paced_url),
    ];
    let state = AppState::alone(
        "gw-bench",
        registry,
        Arc::new(Upstreams::new(engine.clone(), remote)?),
        outbox.clone(),
    );
    let (stop_relay, stop_rx) = tokio::sync::watch::channel(false);
    let relay = match std::env::var("KAFKA_BROKERS") {
        Ok(brokers) => {
            // Deleted when dropped, once the relay has stopped.
            let topic = devstack::Topic::fresh(&brokers, "gateway-bench", 4).await?;
            let relay = tokio::spawn(gateway_lite::relay::run(
                outbox.clone(),
                gateway_lite::relay::producer(&brokers)?,
                topic.name.clone(),
                stop_rx,
            ));
            Some((relay, topic))
        }
        Err(_) => None,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    spawn_server(listener, app(state, None), plain);
    let url = format!("http://{addr}/v1/chat/completions");
    let client = reqwest::Client::new();

    let mut out =
        vec![format!(
        "fixed rate {rate} req/s for {secs} s per path, ENGINE_SPEEDUP=0, served by {}, relay {}",
        if plain { "axum::serve (plain)" } else { "serving" },
        if relay.is_some() {
            "publishing"
        } else {
            "off (no KAFKA_BROKERS)"
        }
    )];
    // Both sides of a path in one run, in pairs: at every due instant one
    // request goes to the engine directly and one through the gateway, so
    // both meet the same machine and the same lateness of the load
    // generator's timer (tokio's timer ticks by the millisecond: requests
    // paced at 2x the rate alone would give the two sides different,
    // run-dependent offsets).
    // One uncounted second of each path first: connection pools, the
    // outbox's first segment and the relay's first publish warm up there.
    for (path, warm_up) in ["json", "stream", "http", "http-stream"]
        .into_iter()
        .flat_map(|p| [(p, true), (p, false)])
    {
        let secs = if warm_up { 1 } else { secs };
        let (engine, client, url, engine_url) = (
            engine.clone(),
            client.clone(),
            url.clone(),
            engine_url.clone(),
        );
        let (direct, gateway) = fixed_rate(rate, secs, move |i| -> [BoxFuture; 2] {
            let engine = engine.clone();
            let (client, client2) = (client.clone(), client.clone());
            let (url, engine_url) = (url.clone(), engine_url.clone());
            let direct: BoxFuture =
                match path {
                    "json" | "stream" => Box::pin(async move {
                        engine
                            .complete(&request(i))
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    }),
                    "http" => Box::pin(async move {
                        post(&client, &engine_url, LOCAL, false, i).await.map(drop)
                    }),
                    _ => Box::pin(async move {
                        post(&client, &engine_url, LOCAL, true, i).await.map(drop)
                    }),
                };
            let via: BoxFuture = match path {
                "json" => {
                    Box::pin(async move { post(&client2, &url, LOCAL, false, i).await.map(drop) })
                }
                "stream" => {
                    Box::pin(async move { post(&client2, &url, LOCAL, true, i).await.map(drop) })
                }
                "http" => {
                    Box::pin(async move { post(&client2, &url, HTTP, false, i).await.map(drop) })
                }
                _ => Box::pin(async move { post(&client2, &url, HTTP, true, i).await.map(drop) }),
            };
            [direct, via]
        })
        .await;
        if warm_up {
            continue;
        }
        out.push(format!("{path}:"));
        out.push(line("  engine ", rate, &direct));
        out.push(line("  gateway", rate, &gateway));
        out.push(format!(
            "  added   p50 {:.3} ms  p99 {:.3} ms",
            gateway.p(0.50) - direct.p(0.50),
            gateway.p(0.99) - direct.p(0.99)
        ));
    }
    out.extend(pacing(&client, &paced_url, &url).await);
    out.push(format!(
        "max sustained (64 closed-loop clients): {:.0} req/s",
        max_sustained(&client, &url, LOCAL, secs).await?
    ));
    if let Some((relay, topic)) = relay {
        let _ = stop_relay.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(10), relay).await;
        drop(topic);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let text = out.join("\n");
    eprintln!("{text}");
    Ok(())
}

/// `limits`: the same gateway twice in one process, one with its limits in
/// memory (`GATEWAY_LIMITS=local`) and one sharing them through a private
/// Redis (`shared`), a caller with every kind of limit set high enough
/// that none refuses; at each due instant one request goes to each. Then
/// each one's highest sustained rate, and Redis commands per request
/// (from the private Redis's own `total_commands_processed`).
async fn limits(rate: u64, secs: u64) -> anyhow::Result<()> {
    let redis = devstack::PrivateRedis::start().await?;
    let dir = std::env::temp_dir().join(format!("gateway-bench-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let engine = Arc::new(Simulator::new(ModelProfile::reference(), 0));
    let registry = Registry::default();
    let model_limits = gateway_lite::tenants::ModelLimits {
        rpm: Some(1_200_000),
        tpm: Some(1_000_000_000),
        max_context: None,
        max_output: None,
    };
    registry.insert(
        KEY,
        Caller {
            max_concurrency: Some(10_000),
            max_kv_mib_seconds: Some(1 << 40),
            rate: Some(admission::limits::RequestRate {
                per_second: 20_000,
                burst: 2_000,
            }),
            limits: Arc::new(HashMap::from([("*".to_owned(), model_limits)])),
            ..bench_caller()
        },
    );
    let global = Some(admission::limits::RequestRate {
        per_second: 20_000,
        burst: 2_000,
    });
    let mut urls = Vec::new();
    for (name, cluster) in [
        ("local", admission::cluster::Cluster::local("gw-local")),
        (
            "shared",
            admission::cluster::Cluster::connect(
                &redis.url(),
                "bench:",
                "gw-shared",
                admission::cluster::FailClosed::alone(),
            )?,
        ),
    ] {
        let limiter = Limiter::new(global, cluster.clone());
        limiter.renew(true).await;
        if name == "shared" {
            anyhow::ensure!(
                cluster.mode() == admission::cluster::Mode::Shared,
                "the private Redis at {} did not answer",
                redis.url()
            );
            limiter.spawn_renewal();
        }
        let outbox = Outbox::open(&dir.join(name))?;
        let state = AppState {
            limiter,
            idempotency: Idempotency::new(outbox.clone(), cluster),
            ..AppState::alone(
                &format!("gw-{name}"),
                registry.clone(),
                Arc::new(Upstreams::new(engine.clone(), Vec::new())?),
                outbox,
            )
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        spawn_server(listener, app(state, None), false);
        urls.push(format!("http://{addr}/v1/chat/completions"));
    }
    let client = reqwest::Client::new();
    let mut out = vec![format!(
        "limits: fixed rate {rate} req/s for {secs} s, in-process limits vs shared through Redis \
         (private redis-server), ENGINE_SPEEDUP=0, relay off"
    )];
    let before = deployed::commands(&redis.url()).await?;
    let (local, shared, shared_requests) = side_by_side(&client, &urls, rate, secs).await;
    out.push(line("  in-process", rate, &local));
    out.push(line("  shared    ", rate, &shared));
    out.push(format!(
        "  added by Redis: p50 {:.3} ms  p99 {:.3} ms",
        shared.p(0.50) - local.p(0.50),
        shared.p(0.99) - local.p(0.99)
    ));
    // Two INFO calls of ours are in the count.
    let used = deployed::commands(&redis.url())
        .await?
        .saturating_sub(before + 2);
    out.push(format!(
        "  Redis commands per request (shared): {:.4} ({used} for {shared_requests} requests, \
         heartbeats and renewals included)",
        used as f64 / shared_requests.max(1) as f64
    ));
    for (name, url) in ["in-process", "shared"].iter().zip(&urls) {
        out.push(format!(
            "  max sustained, {name} (64 closed-loop clients): {:.0} req/s",
            max_sustained(&client, url, LOCAL, secs).await?
        ));
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{}", out.join("\n"));
    Ok(())
}

/// The fairness layer's cost on the request path: two gateways side by
/// side, the engine a pool of 12 replicas of the 8B answering at once, the
/// caller at priority 5 with every limit high enough that none refuses:
/// one without the fairness layer, one with it (the queue before the
/// engine and the ladder, as `GATEWAY_QUEUE=on`). At each due instant one
/// request goes to each. A loaded 2-core machine's p99 swings more from
/// one 10 s run to the next than the layer costs, so it runs `rounds`
/// times and prints each round, the median round and all rounds' samples
/// together.
async fn fairness(rate: u64, secs: u64, rounds: u32) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("gateway-bench-fair-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut profiles = ModelProfile::reference();
    ModelProfile::set_replicas(&mut profiles, &format!("{LOCAL}=12"))?;
    let engine = Arc::new(Simulator::new(profiles, 0));
    let registry = Registry::default();
    registry.insert(
        KEY,
        Caller {
            priority: 5,
            rate: Some(admission::limits::RequestRate {
                per_second: 20_000,
                burst: 2_000,
            }),
            ..bench_caller()
        },
    );
    let mut urls = Vec::new();
    for on in [false, true] {
        let outbox = Outbox::open(&dir.join(if on { "on" } else { "off" }))?;
        let mut state = AppState::alone(
            "gw-fair",
            registry.clone(),
            Arc::new(Upstreams::new(engine.clone(), Vec::new())?),
            outbox,
        );
        if on {
            let ladder = admission::ladder::Ladder::new();
            state.limiter = state.limiter.clone().with_ladder(ladder.clone());
            state.ladder = Some(ladder);
            state.queues = Some(admission::admission_queue::Queues::new(
                engine.models().iter().map(|m| m.name.clone()),
                1_000,
            ));
            state.spawn_ladder();
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        spawn_server(listener, app(state, None), false);
        urls.push(format!("http://{addr}/v1/chat/completions"));
    }
    let client = reqwest::Client::new();
    let mut out = vec![format!(
        "fairness: fixed rate {rate} req/s for {secs} s × {rounds} rounds, GATEWAY_QUEUE off vs on, \
         12 replicas of {LOCAL}, ENGINE_SPEEDUP=0, relay off"
    )];
    let (mut added_p50, mut added_p99) = (Vec::new(), Vec::new());
    let (mut all_off, mut all_on) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let (off, on, _) = side_by_side(&client, &urls, rate, secs).await;
        let (p50, p99) = (on.p(0.50) - off.p(0.50), on.p(0.99) - off.p(0.99));
        out.push(format!(
            "  round {round:>2}: off p50 {:.3} ms p99 {:.3} ms ({} ok, {} errors); on p50 {:.3} ms p99 {:.3} ms ({} ok, {} errors); added p50 {p50:.3} ms p99 {p99:.3} ms",
            off.p(0.50),
            off.p(0.99),
            off.ok,
            off.errors,
            on.p(0.50),
            on.p(0.99),
            on.ok,
            on.errors,
        ));
        added_p50.push(p50);
        added_p99.push(p99);
        all_off.extend_from_slice(off.latencies_ms.samples());
        all_on.extend_from_slice(on.latencies_ms.samples());
    }
    let (p50s, p99s) = (Percentiles::new(added_p50), Percentiles::new(added_p99));
    out.push(format!(
        "  median round: added p50 {:.3} ms  p99 {:.3} ms (rounds' added p99 from {:.3} to {:.3} ms)",
        p50s.at(0.5),
        p99s.at(0.5),
        p99s.at(0.0),
        p99s.at(1.0)
    ));
    let (off, on) = (Percentiles::new(all_off), Percentiles::new(all_on));
    out.push(format!(
        "  every round's samples together ({} each): off p50 {:.3} ms p99 {:.3} ms; on p50 {:.3} ms p99 {:.3} ms; added p50 {:.3} ms p99 {:.3} ms",
        on.len(),
        off.at(0.5),
        off.at(0.99),
        on.at(0.5),
        on.at(0.99),
        on.at(0.5) - off.at(0.5),
        on.at(0.99) - off.at(0.99)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{}", out.join("\n"));
    Ok(())
}

/// One request to each of two gateways at every due instant: a second's
/// warm-up, then `secs` measured. Returns both figures and how many
/// requests the second gateway was sent, warm-up included.
async fn side_by_side(
    client: &reqwest::Client,
    urls: &[String],
    rate: u64,
    secs: u64,
) -> (Stats, Stats, u64) {
    let mut sent = 0u64;
    let mut last = None;
    for run_secs in [1, secs] {
        let (client, urls) = (client.clone(), urls.to_vec());
        let (a, b) = fixed_rate(rate, run_secs, move |i| -> [BoxFuture; 2] {
            let (c1, c2) = (client.clone(), client.clone());
            let (u1, u2) = (urls[0].clone(), urls[1].clone());
            [
                Box::pin(async move { post(&c1, &u1, LOCAL, false, i).await.map(drop) }),
                Box::pin(async move { post(&c2, &u2, LOCAL, false, i).await.map(drop) }),
            ]
        })
        .await;
        sent += (b.ok + b.errors) as u64;
        last = Some((a, b));
    }
    let (a, b) = last.unwrap_or_default();
    (a, b, sent)
}

/// The highest sustained rate of `url` for `model`: 64 clients in a closed loop for
/// `secs`, requests per second answered 200.
async fn max_sustained(
    client: &reqwest::Client,
    url: &str,
    model: &'static str,
    secs: u64,
) -> anyhow::Result<f64> {
    max_sustained_as(client, url, model, false, secs).await
}

/// [`max_sustained`], the requests streamed or not.
async fn max_sustained_as(
    client: &reqwest::Client,
    url: &str,
    model: &'static str,
    stream: bool,
    secs: u64,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..64u64 {
        let (client, url) = (client.clone(), url.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            let mut i = w << 32;
            while started.elapsed() < Duration::from_secs(secs) {
                if post(&client, &url, model, stream, i).await.is_ok() {
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
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// The benchmark's caller: priority 5, no limits.
fn bench_caller() -> Caller {
    Caller::unlimited("bench", "key_bench", 5)
}

fn request(i: u64) -> CompletionRequest {
    CompletionRequest {
        model: LOCAL.into(),
        prompt: format!("bench request {i}"),
        max_tokens: Some(16),
        seed: i,
        tenant_id: "bench".into(),
        class: ServiceClass::from_priority(5),
        body: None,
    }
}

/// The engine's own HTTP server (what the `engine` binary runs) on a
/// local port, pacing at `speedup`; its chat completions URL.
async fn serve_engine(speedup: u32, plain: bool) -> anyhow::Result<String> {
    let sim = Arc::new(Simulator::new(ModelProfile::reference(), speedup));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let secret = Secret::new(IDENTITY_SECRET).map_err(|e| anyhow::anyhow!("bench secret {e}"))?;
    spawn_server(listener, engine::server::app(sim, secret), plain);
    Ok(format!("http://{addr}"))
}

/// Serves `router` on `listener` in the background, through the shared
/// serving layer or, with `plain`, bare `axum::serve`.
fn spawn_server(listener: tokio::net::TcpListener, router: axum::Router, plain: bool) {
    if plain {
        tokio::spawn(async move { axum::serve(listener, router).await });
    } else {
        tokio::spawn(serving::serve(
            listener,
            router,
            serving::HttpSettings::default(),
            std::future::pending(),
        ));
    }
}

fn remote_model(model: &str, base: &str) -> RemoteModel {
    RemoteModel {
        model: model.into(),
        url: base.into(),
        upstream_model: Some(LOCAL.into()),
        gpus: 1,
        max_context: 131_072,
        model_version: None,
        replica_id: Some(model.into()),
        gpu_time: admission::upstream::GpuTime::Auto,
        api_key_env: None,
        identity_secret_env: Some(IDENTITY_SECRET_ENV.into()),
        cache_salt: false,
        idle_timeout_secs: 60,
        kv_poll_ms: 0,
        replica_reports: false,
        dedicated_to: None,
        kv_tokens: None,
    }
}

/// Sends one chat completion to `url` (a base URL or the gateway's full
/// path) and reads the whole answer; with `stream`, the instant each SSE
/// frame arrived. Fails unless the answer is 200 and, streamed, ends with
/// `[DONE]`.
async fn post(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    stream: bool,
    i: u64,
) -> Result<Vec<Instant>, String> {
    let url = if url.ends_with("/v1/chat/completions") {
        url.to_owned()
    } else {
        format!("{url}/v1/chat/completions")
    };
    // The engine's server needs a signed identity; the gateway ignores it.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let identity = Secret::new(IDENTITY_SECRET)
        .map(|s| Signer::new(s).sign("bench", ServiceClass::Standard, now))
        .map_err(|e| e.to_string())?;
    let mut res = client
        .post(url)
        .bearer_auth(KEY)
        .header(identity::HEADER, identity)
        .json(&json!({
            "model": model,
            "messages": [{"role": "user", "content": format!("bench request {i}")}],
            "max_tokens": 16,
            "seed": i,
            "stream": stream,
        }))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !res.status().is_success() {
        return Err(res.status().to_string());
    }
    let mut frames = Vec::new();
    let mut tail = String::new();
    while let Some(chunk) = res.chunk().await.map_err(|e| e.to_string())? {
        let now = Instant::now();
        let text = String::from_utf8_lossy(&chunk);
        for _ in 0..text.matches("data:").count() {
            frames.push(now);
        }
        tail = text.into_owned();
    }
    if stream && !tail.contains("[DONE]") {
        return Err("stream ended without [DONE]".into());
    }
    Ok(frames)
}

/// Gaps between the SSE frames of streams paced in real time, read
/// directly from the engine and through the gateway (which streams from
/// that engine): what a client sees of the engine's pacing.
async fn pacing(client: &reqwest::Client, paced_url: &str, gateway_url: &str) -> Vec<String> {
    const STREAMS: u64 = 20;
    let mut gaps = [Vec::new(), Vec::new()];
    for i in 0..STREAMS {
        let pair = tokio::join!(
            post(client, paced_url, LOCAL, true, 1_000_000 + i),
            post(client, gateway_url, PACED, true, 1_000_000 + i),
        );
        for (side, frames) in [pair.0, pair.1].into_iter().enumerate() {
            match frames {
                Ok(frames) => gaps[side].extend(
                    frames
                        .windows(2)
                        .map(|w| (w[1] - w[0]).as_secs_f64() * 1000.0),
                ),
                Err(e) => return vec![format!("pacing: failed: {e}")],
            }
        }
    }
    let mut out = vec![format!(
        "pacing: {STREAMS} streams paced in real time (ENGINE_SPEEDUP=1), gaps between SSE frames"
    )];
    let mut stats = Vec::new();
    for (name, g) in ["  engine ", "  gateway"].into_iter().zip(gaps) {
        let s = Stats {
            ok: g.len(),
            errors: 0,
            latencies_ms: Percentiles::new(g),
        };
        out.push(format!(
            "{name} gaps {:>5}  p50 {:>8.3} ms  p99 {:>8.3} ms  max {:>8.3} ms",
            s.ok,
            s.p(0.50),
            s.p(0.99),
            s.p(1.0)
        ));
        stats.push(s);
    }
    out.push(format!(
        "  added   p50 {:.3} ms  p99 {:.3} ms",
        stats[1].p(0.50) - stats[0].p(0.50),
        stats[1].p(0.99) - stats[0].p(0.99)
    ));
    out
}

fn line(name: &str, rate: u64, s: &Stats) -> String {
    format!(
        "{name} {rate:>6} req/s  ok {:>6}  errors {:>4}  p50 {:>8.3} ms  p99 {:>8.3} ms",
        s.ok,
        s.errors,
        s.p(0.50),
        s.p(0.99)
    )
}

#[derive(Default)]
struct Stats {
    ok: usize,
    errors: usize,
    latencies_ms: Percentiles,
}

impl Stats {
    fn p(&self, q: f64) -> f64 {
        self.latencies_ms.at(q)
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
        let mut latencies_ms = Vec::with_capacity(tasks.len());
        for t in tasks {
            match t.await {
                Ok((true, ms)) => {
                    s.ok += 1;
                    latencies_ms.push(ms);
                }
                _ => s.errors += 1,
            }
        }
        s.latencies_ms = Percentiles::new(latencies_ms);
    }
    let [first, second] = stats;
    (first, second)
}
