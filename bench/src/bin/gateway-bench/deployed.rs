//! `deployed`: the gateway as it is deployed, measured from outside. The
//! `gateway-lite` binary runs as its own process in front of the `engine`
//! binary (unpaced, `ENGINE_SPEEDUP=0`, requiring a signed identity), the
//! model an HTTP upstream with its GPU time derived, limits and the GPU
//! ledger shared through Redis (a private `redis-server`), the relay
//! publishing to the broker (`KAFKA_BROKERS`, a fresh topic), tenants read
//! from Postgres (a fresh database), the fair queue on — then the same
//! with one component switched off at a time, each variant a fresh gateway
//! process, every one beside the direct call to the engine in the same
//! pairs (one request each way at every due instant).
//!
//! The tenant has every limit set (rpm, tpm, concurrency, KV·seconds) high
//! enough that none refuses, so each is checked and leased as in
//! production. Redis commands per request come from the private Redis's
//! own `total_commands_processed`.

use std::collections::HashMap;
use std::time::Duration;

use devstack::process::Service;

use super::{fixed_rate, line, max_sustained, post, BoxFuture, Stats, IDENTITY_SECRET, KEY, LOCAL};

/// The model the gateway serves from the engine binary.
const MODEL: &str = "llama-3.1-8b-http";
/// The env var the upstream file names for the identity secret.
const SECRET_ENV: &str = "GATEWAY_BENCH_ENGINE_SECRET";

/// One configuration of the gateway.
struct Variant {
    name: &'static str,
    /// `GATEWAY_LIMITS`.
    limits: &'static str,
    /// Whether the relay reaches the broker.
    relay: bool,
    /// `gpu_time` of the upstream.
    gpu_time: &'static str,
    /// `GATEWAY_QUEUE`: the fairness layer.
    queue: &'static str,
}

const VARIANTS: [Variant; 5] = [
    Variant {
        name: "as deployed",
        limits: "shared",
        relay: true,
        gpu_time: "derived",
        queue: "on",
    },
    Variant {
        name: "limits and ledger in memory (GATEWAY_LIMITS=local)",
        limits: "local",
        relay: true,
        gpu_time: "derived",
        queue: "on",
    },
    Variant {
        name: "relay off (broker unreachable; the outbox only grows)",
        limits: "shared",
        relay: false,
        gpu_time: "derived",
        queue: "on",
    },
    Variant {
        name: "fair queue off (GATEWAY_QUEUE=off)",
        limits: "shared",
        relay: true,
        gpu_time: "derived",
        queue: "off",
    },
    Variant {
        name: "Redis and relay both off",
        limits: "local",
        relay: false,
        gpu_time: "derived",
        queue: "on",
    },
];

pub async fn run(rate: u64, secs: u64) -> anyhow::Result<()> {
    let brokers = std::env::var("KAFKA_BROKERS")
        .map_err(|_| anyhow::anyhow!("deployed needs the stack: . .stack/env (KAFKA_BROKERS)"))?;
    let dir = tempfile::tempdir()?;
    let db = devstack::Database::fresh("gwbench").await?;
    seed(&db.pool).await?;
    let redis = devstack::PrivateRedis::start().await?;
    let topic = devstack::Topic::fresh(&brokers, "gateway-bench-deployed", 4).await?;

    let engine_port = free_port()?;
    let engine_url = format!("http://127.0.0.1:{engine_port}");
    let mut engine = Service::start(
        "engine",
        "engine",
        &[],
        HashMap::from([
            ("ENGINE_ADDR".to_owned(), format!("127.0.0.1:{engine_port}")),
            ("ENGINE_SPEEDUP".to_owned(), "0".to_owned()),
            (
                "ENGINE_IDENTITY_SECRET".to_owned(),
                IDENTITY_SECRET.to_owned(),
            ),
            ("RUST_LOG".to_owned(), "warn".to_owned()),
        ]),
        dir.path(),
    )?;
    healthy(&format!("{engine_url}/health"), &mut engine).await?;

    let upstreams = dir.path().join("upstreams.yaml");
    let client = reqwest::Client::new();
    let mut out = vec![format!(
        "deployed: fixed rate {rate} req/s for {secs} s per variant; the gateway-lite binary in front \
         of the engine binary (ENGINE_SPEEDUP=0, signed identity), tenants from Postgres, every \
         limit of the tenant set; each variant beside the direct call in the same pairs"
    )];
    for (n, v) in VARIANTS.iter().enumerate() {
        std::fs::write(
            &upstreams,
            format!(
                "upstreams:\n  - model: {MODEL}\n    url: {engine_url}\n    upstream_model: {LOCAL}\n    \
                 gpus: 1\n    max_context: 131072\n    replica_id: bench-8b\n    gpu_time: {}\n    \
                 identity_secret_env: {SECRET_ENV}\n    kv_poll_ms: 1000\n",
                v.gpu_time
            ),
        )?;
        let port = free_port()?;
        let url = format!("http://127.0.0.1:{port}");
        let env = HashMap::from([
            ("GATEWAY_ADDR".to_owned(), format!("127.0.0.1:{port}")),
            ("GATEWAY_ID".to_owned(), format!("gw-bench-{n}")),
            ("DATABASE_URL".to_owned(), db.url.clone()),
            (
                "KAFKA_BROKERS".to_owned(),
                if v.relay {
                    brokers.clone()
                } else {
                    "127.0.0.1:1".to_owned()
                },
            ),
            ("GATEWAY_TOPIC".to_owned(), topic.name.clone()),
            (
                "GATEWAY_OUTBOX".to_owned(),
                dir.path().join(format!("outbox-{n}")).display().to_string(),
            ),
            (
                "GATEWAY_UPSTREAMS".to_owned(),
                upstreams.display().to_string(),
            ),
            ("GATEWAY_LIMITS".to_owned(), v.limits.to_owned()),
            ("GATEWAY_QUEUE".to_owned(), v.queue.to_owned()),
            ("REDIS_URL".to_owned(), redis.url()),
            ("GATEWAY_REDIS_PREFIX".to_owned(), format!("bench{n}:")),
            ("GATEWAY_GLOBAL_RPS".to_owned(), "0".to_owned()),
            (SECRET_ENV.to_owned(), IDENTITY_SECRET.to_owned()),
            ("RUST_LOG".to_owned(), "warn".to_owned()),
        ]);
        let mut gateway = Service::start(
            &format!("gateway-{n}"),
            "gateway-lite",
            &[],
            env,
            dir.path(),
        )?;
        healthy(&format!("{url}/healthz"), &mut gateway).await?;
        let chat = format!("{url}/v1/chat/completions");
        let before = commands(&redis.url()).await?;
        let (direct, via, sent) = pairs(&client, &engine_url, &chat, rate, secs).await;
        // Two INFO calls of ours are in the count.
        let used = commands(&redis.url()).await?.saturating_sub(before + 2);
        out.push(format!("{}:", v.name));
        out.push(line("  engine ", rate, &direct));
        out.push(line("  gateway", rate, &via));
        out.push(format!(
            "  added   p50 {:.3} ms  p99 {:.3} ms   Redis commands per request {:.2}",
            via.p(0.50) - direct.p(0.50),
            via.p(0.99) - direct.p(0.99),
            used as f64 / sent.max(1) as f64
        ));
        out.push(format!(
            "  max sustained (64 closed-loop clients): gateway {:.0} req/s, engine direct {:.0} req/s, \
             engine direct streamed (as the gateway asks it) {:.0} req/s",
            max_sustained(&client, &chat, MODEL, secs).await?,
            max_sustained(&client, &engine_url, LOCAL, secs).await?,
            super::max_sustained_as(&client, &engine_url, LOCAL, true, secs).await?
        ));
        gateway.terminate(Duration::from_secs(10)).await;
    }
    engine.terminate(Duration::from_secs(5)).await;
    drop(topic);
    eprintln!("{}", out.join("\n"));
    Ok(())
}

/// A second's warm-up, then `secs` measured: one request to the engine and
/// one through the gateway at every due instant. Returns both figures and
/// how many requests the gateway was sent, warm-up included.
async fn pairs(
    client: &reqwest::Client,
    engine_url: &str,
    gateway_url: &str,
    rate: u64,
    secs: u64,
) -> (Stats, Stats, u64) {
    let mut sent = 0u64;
    let mut last = (Stats::default(), Stats::default());
    for run_secs in [1, secs] {
        let (client, engine_url, gateway_url) = (
            client.clone(),
            engine_url.to_owned(),
            gateway_url.to_owned(),
        );
        let (direct, via) = fixed_rate(rate, run_secs, move |i| -> [BoxFuture; 2] {
            let (c1, c2) = (client.clone(), client.clone());
            let (e, g) = (engine_url.clone(), gateway_url.clone());
            [
                Box::pin(async move { post(&c1, &e, LOCAL, false, i).await.map(drop) }),
                Box::pin(async move { post(&c2, &g, MODEL, false, i).await.map(drop) }),
            ]
        })
        .await;
        sent += (via.ok + via.errors) as u64;
        last = (direct, via);
    }
    (last.0, last.1, sent)
}

/// The bench tenant, its key and limits high enough that none refuses.
async fn seed(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode, max_concurrency,
                              max_kv_gib_seconds)
         VALUES ('bench', 'bench', 'enterprise', 5, 'per_token', 10000, 1000000000)",
    )
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO api_keys (api_key_id, tenant_id, key_hash, key_prefix)
         VALUES ('key_bench', 'bench', sha256($1::bytea), left($1, 8))",
    )
    .bind(KEY)
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO limits (tenant_id, model, rpm, tpm) VALUES ('bench', '*', 1200000, 1000000000)",
    )
    .execute(pool)
    .await?;
    Ok(())
}

async fn healthy(url: &str, service: &mut Service) -> anyhow::Result<()> {
    for _ in 0..600 {
        if reqwest::get(url)
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(());
        }
        service.check_running()?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!(
        "{} never answered {url}:\n{}",
        service.name(),
        service.log_tail()
    )
}

/// Commands the Redis at `url` has run (`total_commands_processed`;
/// commands run inside scripts count too).
pub async fn commands(url: &str) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(
            &mut redis::Client::open(url)?
                .get_multiplexed_async_connection()
                .await?,
        )
        .await?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
