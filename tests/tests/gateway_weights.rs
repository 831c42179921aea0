#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! The fair queue through the real gateway, in real time over HTTP.
//!
//! Weights: five tenants on one priority level
//! with the reference weights 8:4:2:1:1, each with more closed-loop
//! clients than its share of a small, fast simulated pool (two replicas of
//! 10 ms steps, KV for 4,096 tokens each, in real time), for 40 s over
//! HTTP. What each tenant got is read from `request_log` — the GPU time
//! the replicas attributed to each request, as billed — by the time each
//! request finished, not from anything the queue keeps.
//!
//! Strict priority: a tenant one level below a backlogged one sends
//! request after request for 12 s and none runs: an arrival never goes
//! past a request waiting at its level or above, however often room
//! frees between a request ending and the next in line starting.
//!
//! Both run in the serial test group (`.config/nextest.toml`): their
//! figures come from a loaded machine's real time.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;
use serde_json::json;
use tests::gateway::{seed_tenant, start_gateway_with, start_ingest, TenantLimits};
use tests::TestStack;

/// (tenant, weight, closed-loop clients): each enough to keep a request
/// waiting beyond its share of the ~20 requests the pool runs at once.
const TENANTS: [(&str, i32, usize); 5] = [
    ("w-acme", 8, 20),
    ("w-medai", 4, 12),
    ("w-finserv", 2, 8),
    ("w-research", 1, 6),
    ("w-codegen", 1, 6),
];
const WINDOW: Duration = Duration::from_secs(10);
const WINDOWS: u32 = 4;
/// Over HTTP on a busy machine, in 10 s windows where the smallest
/// tenants complete ~1.2 GPU-s each: ±35% of each weight's share.
/// Measured within 5% on a quiet machine, 24% once with a release build
/// running beside it; with the weights ignored the worst share is 214% off.
const BOUND: f64 = 0.35;

/// The pool: `llama-3.1-8b` by name (its prices), a tiny model by
/// profile, so a few dozen clients saturate it.
fn profiles(dir: &std::path::Path) -> String {
    let path = dir.join("profiles.json");
    let profile = json!({"profiles": [{
        "name": "llama-3.1-8b",
        "version": "tiny-fast-1",
        "gpus": 1,
        "replicas": 2,
        "weight_bytes": 10_000_000_u64,
        "flops_per_token": 1_000_000_000_u64,
        "kv_bytes_per_token": 1024,
        "kv_budget_bytes": 4_194_304,
        "hbm_bytes_per_second": 1_000_000_000_u64,
        "bandwidth_efficiency_percent": 100,
        "flops_per_second": 100_000_000_000_000_u64,
        "max_context": 2048,
    }]});
    std::fs::write(&path, profile.to_string()).unwrap();
    path.display().to_string()
}

/// Seeds `tenant` (key `sk-test-{tenant}`, limits far above what it
/// sends) at `priority` with `weight` and a TTFT objective, its wait budget.
async fn seed(stack: &TestStack, tenant: &str, priority: i16, weight: i32, ttft_ms: i32) {
    let limits = TenantLimits {
        rpm: Some(1_000_000),
        tpm: Some(1_000_000_000),
        ..Default::default()
    };
    seed_tenant(stack, tenant, &format!("sk-test-{tenant}"), limits).await;
    sqlx::query(
        "UPDATE tenants SET priority = $2, wfq_weight = $3, slo_ttft_p95_ms = $4 WHERE tenant_id = $1",
    )
    .bind(tenant)
    .bind(priority)
    .bind(weight)
    .bind(ttft_ms)
    .execute(&stack.pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlogged_tenants_share_gpu_time_by_weight_over_http() {
    let stack = TestStack::new("gwweights").await;
    for (tenant, weight, _) in TENANTS {
        // One level (standard), the reference weights, a 30 s wait budget.
        seed(&stack, tenant, 3, weight, 30_000).await;
    }
    let settings = [
        ("GATEWAY_QUEUE", "on".to_owned()),
        ("ENGINE_PROFILES", profiles(stack.dir.path())),
    ];
    let (gateway, url) = start_gateway_with(&stack, 1, &settings).await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    let began = Instant::now();
    let began_at = chrono::Utc::now();
    let length = WINDOW * WINDOWS;
    let mut clients = Vec::new();
    for (tenant, _, n) in TENANTS {
        for c in 0..n {
            let (client, chat) = (client.clone(), chat.clone());
            clients.push(tokio::spawn(async move {
                let mut sent = 0u64;
                while began.elapsed() < length {
                    let body = json!({
                        "model": "llama-3.1-8b",
                        "messages": [{"role": "user", "content": format!("{tenant} {c} {sent}{}", " the".repeat(300))}],
                        "max_tokens": 16,
                    });
                    let res = client
                        .post(&chat)
                        .bearer_auth(format!("sk-test-{tenant}"))
                        .json(&body)
                        .send()
                        .await
                        .unwrap();
                    let status = res.status();
                    assert_eq!(status, 200, "{tenant}: {}", res.text().await.unwrap());
                    sent += 1;
                }
                sent
            }));
        }
    }
    let mut sent = 0;
    for c in clients {
        sent += c.await.unwrap();
    }
    // Every answered request is billed: wait for them all in request_log.
    let deadline = Instant::now() + Duration::from_secs(90);
    let rows: Vec<(String, chrono::DateTime<chrono::Utc>, Decimal)> = loop {
        let rows: Vec<(String, chrono::DateTime<chrono::Utc>, Decimal)> = sqlx::query_as(
            "SELECT tenant_id, finished_at, gpu_seconds FROM request_log WHERE tenant_id LIKE 'w-%'",
        )
        .fetch_all(&stack.pool)
        .await
        .unwrap();
        if rows.len() as u64 >= sent {
            break rows;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {sent} requests in request_log: {}\n{}",
            rows.len(),
            gateway.log_tail(),
            ingest.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(rows.len() as u64, sent);
    let total_weight: i32 = TENANTS.iter().map(|t| t.1).sum();
    for w in 1..WINDOWS {
        let (from, to) = (began_at + WINDOW * w, began_at + WINDOW * (w + 1));
        let mut gpu: BTreeMap<&str, Decimal> = BTreeMap::new();
        for (tenant, at, g) in &rows {
            if *at >= from && *at < to {
                let t = TENANTS.iter().find(|t| t.0 == tenant).unwrap().0;
                *gpu.entry(t).or_default() += g;
            }
        }
        let all: Decimal = gpu.values().sum();
        let mut table = format!("window {w}:");
        let mut worst = 0.0_f64;
        for (tenant, weight, _) in TENANTS {
            let got = (gpu.get(tenant).copied().unwrap_or_default() / all)
                .to_f64()
                .unwrap();
            let want = f64::from(weight) / f64::from(total_weight);
            worst = worst.max((got / want - 1.0).abs());
            table += &format!(" {tenant} {got:.4} (weight {want:.4});");
        }
        eprintln!("{table} worst {worst:.3}");
        assert!(
            worst <= BOUND,
            "a share off its weight by more than {BOUND}: {table}"
        );
    }
}

/// Strict priority over HTTP: `p-high` (priority 5) keeps 40 closed-loop
/// clients on a pool that runs ~20 at once, so some of its requests always
/// wait; `p-low` (priority 4, the same reserved class, so the replicas
/// would take either) sends from 8 clients with a 200 ms wait budget, each
/// again as soon as it is answered, ~5 attempts a second each. Every one of
/// `p-low`'s requests must be refused 429 `queue_timeout` and none billed:
/// one that went straight to a replica when room freed, past `p-high`'s
/// waiters, would run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_level_never_runs_while_a_higher_one_waits_over_http() {
    let stack = TestStack::new("gwstrict").await;
    for (tenant, priority, ttft_ms) in [("p-high", 5, 30_000), ("p-low", 4, 200)] {
        seed(&stack, tenant, priority, 1, ttft_ms).await;
    }
    let settings = [
        ("GATEWAY_QUEUE", "on".to_owned()),
        ("ENGINE_PROFILES", profiles(stack.dir.path())),
    ];
    let (gateway, url) = start_gateway_with(&stack, 1, &settings).await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    let body = |tenant: &str, n: u64| {
        json!({
            "model": "llama-3.1-8b",
            "messages": [{"role": "user", "content": format!("{tenant} {n}{}", " the".repeat(300))}],
            "max_tokens": 16,
        })
    };
    // p-high runs 20 s; p-low from its 4th second to its 16th, so p-high's
    // backlog is there before p-low's first request and after its last.
    let began = Instant::now();
    let mut high = Vec::new();
    for c in 0..40u64 {
        let (client, chat) = (client.clone(), chat.clone());
        high.push(tokio::spawn(async move {
            let mut sent = 0u64;
            while began.elapsed() < Duration::from_secs(20) {
                let res = client
                    .post(&chat)
                    .bearer_auth("sk-test-p-high")
                    .json(&body("p-high", c * 1_000_000 + sent))
                    .send()
                    .await
                    .unwrap();
                let status = res.status();
                assert_eq!(status, 200, "p-high: {}", res.text().await.unwrap());
                sent += 1;
            }
            sent
        }));
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut low = Vec::new();
    for c in 0..8u64 {
        let (client, chat) = (client.clone(), chat.clone());
        low.push(tokio::spawn(async move {
            let (mut refused, mut ran) = (0u64, 0u64);
            while began.elapsed() < Duration::from_secs(16) {
                let res = client
                    .post(&chat)
                    .bearer_auth("sk-test-p-low")
                    .json(&body("p-low", c * 1_000_000 + refused + ran))
                    .send()
                    .await
                    .unwrap();
                match res.status().as_u16() {
                    200 => ran += 1,
                    429 => {
                        let v: serde_json::Value = res.json().await.unwrap();
                        assert_eq!(v["error"]["code"], "queue_timeout", "{v}");
                        refused += 1;
                    }
                    s => panic!("p-low: unexpected {s}: {}", res.text().await.unwrap()),
                }
            }
            (refused, ran)
        }));
    }
    let (mut refused, mut ran) = (0, 0);
    for c in low {
        let (r, n) = c.await.unwrap();
        refused += r;
        ran += n;
    }
    let mut sent = 0;
    for c in high {
        sent += c.await.unwrap();
    }
    eprintln!("p-high answered {sent}; p-low refused {refused}, ran {ran}");
    assert!(refused >= 200, "p-low kept asking: {refused} refusals");
    assert_eq!(
        ran,
        0,
        "p-low ran {ran} of {} while p-high waited",
        refused + ran
    );
    // What p-high ran is billed, and nothing of p-low's.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (high_rows, low_rows): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE tenant_id = 'p-high'), count(*) FILTER (WHERE tenant_id = 'p-low') FROM request_log",
        )
        .fetch_one(&stack.pool)
        .await
        .unwrap();
        assert_eq!(low_rows, 0, "nothing of p-low's is billed");
        if high_rows as u64 >= sent {
            assert_eq!(high_rows as u64, sent);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{high_rows} of {sent} in request_log: {}\n{}",
            gateway.log_tail(),
            ingest.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
