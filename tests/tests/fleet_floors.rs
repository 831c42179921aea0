#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! Reserved floors through the real gateway: an enterprise tenant's floor
//! (30% of the pool, seeded by `billing-api tenants apply` like any tenant
//! config) is kept free while it is idle. A best-effort tenant fills what
//! is left and is then refused with a 503 that names the floors, although
//! no replica is past its threshold; the owner, arriving later, is placed
//! at once although the other tenant was just refused; every answered
//! request is billed once. The floor is on
//! `/metrics`. The same on a pool of two HTTP replicas (two `engine`
//! processes as two upstream URLs of one model, as two vLLM servers would
//! be), whose KV capacity the gateway reads from their `/metrics`.

use serde_json::{json, Value};
use tests::engine::{random_secret, start_engine_with, vllm_entry, write_upstreams, SECRET_ENV};
use tests::gateway::{metrics, read_sse, start_gateway_with, start_ingest, wait_for_log};
use tests::{Service, TestStack};

const PROD: &str = "sk-test-floors-prod-0001";
const BATCH: &str = "sk-test-floors-batch-0001";

/// Two replicas of 128 KV blocks (16 tokens each) whose every step takes
/// 0.25 s: a request of ~200 tokens holds ~5% of the pool for ~25 s.
const TINY: &str = "profiles:
  - name: tiny
    version: tiny-1
    gpus: 1
    replicas: 2
    weight_bytes: 2500000000
    flops_per_token: 1000000000
    kv_bytes_per_token: 1024
    kv_budget_bytes: 2097152
    hbm_bytes_per_second: 10000000000
    bandwidth_efficiency_percent: 100
    flops_per_second: 100000000000000
    max_context: 1024
";

const TENANTS: &str = "tenants:
  - name: floors-prod
    plan: enterprise
    priority: 5
    weight: 8
    rateLimit: { requestsPerSecond: 1000, burst: 1000 }
    maxConcurrency: 1000
    billingMode: per_token
    reservedFloor: \"0.30\"
    keys: [{ id: key_floors_prod, key: sk-test-floors-prod-0001 }]
  - name: floors-batch
    plan: standard
    priority: 1
    weight: 1
    rateLimit: { requestsPerSecond: 1000, burst: 1000 }
    maxConcurrency: 1000
    billingMode: per_token
    keys: [{ id: key_floors_batch, key: sk-test-floors-batch-0001 }]
";

/// A seed whose simulated answer is at least 100 tokens for any prompt
/// length near the one sent (the gateway's flattening adds a few tokens).
fn long_seed() -> u64 {
    (0..10_000)
        .find(|&s| (90..=140).all(|pt| engine::simulator::natural_output_tokens(s, pt) >= 100))
        .expect("a seed for a long answer")
}

fn body(who: &str, n: usize, seed: u64) -> Value {
    json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": format!("{who} {n}:{}", " hello".repeat(100))}],
        "max_tokens": 100,
        "seed": seed,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tenants_floor_is_kept_free_and_it_gets_in_when_it_comes() {
    let stack = TestStack::new("floors").await;
    apply_tenants(&stack);
    let profiles = stack.dir.path().join("tiny.yaml");
    std::fs::write(&profiles, TINY).unwrap();
    let (gateway, url) = start_gateway_with(
        &stack,
        1,
        &[
            ("ENGINE_PROFILES", profiles.display().to_string()),
            ("GATEWAY_REQUEST_TIMEOUT_SECS", "120".into()),
            // The refusal at once (with the fair queue on, the request
            // would wait in line for the floor's owner to leave room).
            ("GATEWAY_QUEUE", "off".into()),
        ],
    )
    .await;
    let ingest = start_ingest(&stack);
    floor_kept_and_owner_placed(&stack, &url, &[&gateway, &ingest]).await;
}

/// The same floor on a model served by two HTTP replicas, each an
/// `engine` process with one replica of the tiny profile (2,048 KV tokens,
/// which it exports as vLLM's `vllm:cache_config_info`): the gateway holds
/// 30% of the pool's 4,096 tokens for the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_is_kept_free_on_a_pool_of_http_replicas_too() {
    let stack = TestStack::new("floors-http").await;
    apply_tenants(&stack);
    let profiles = stack.dir.path().join("tiny.yaml");
    std::fs::write(&profiles, TINY.replace("replicas: 2", "replicas: 1")).unwrap();
    let secret = random_secret();
    let profiles = profiles.display().to_string();
    let (engine_a, url_a) = start_engine_with(
        stack.dir.path(),
        1,
        &secret,
        &[("ENGINE_PROFILES", &profiles)],
    )
    .await;
    let (engine_b, url_b) = start_engine_with(
        stack.dir.path(),
        1,
        &secret,
        &[("ENGINE_PROFILES", &profiles)],
    )
    .await;
    let upstreams = write_upstreams(
        &stack.dir.path().join("upstreams.yaml"),
        &[
            vllm_entry("tiny", &url_a, 1024, "tiny-a", 200, ""),
            vllm_entry("tiny", &url_b, 1024, "tiny-b", 200, ""),
        ],
    );
    let (gateway, url) = start_gateway_with(
        &stack,
        1,
        &[
            ("GATEWAY_UPSTREAMS", upstreams),
            (SECRET_ENV, secret),
            ("GATEWAY_REQUEST_TIMEOUT_SECS", "120".into()),
            ("GATEWAY_QUEUE", "off".into()),
        ],
    )
    .await;
    // The replicas' capacity and KV use, read by the gateway's first polls.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let ingest = start_ingest(&stack);
    floor_kept_and_owner_placed(&stack, &url, &[&gateway, &ingest, &engine_a, &engine_b]).await;
}

fn apply_tenants(stack: &TestStack) {
    let tenants = stack.dir.path().join("tenants.yaml");
    std::fs::write(&tenants, TENANTS).unwrap();
    tests::billing::apply_tenants(&stack.database_url, &tenants.display().to_string());
}

/// The floor's metrics; a best-effort tenant fills the pool until it is
/// refused for the floor; the owner is then placed at once; every
/// answered request ends with one usage event.
async fn floor_kept_and_owner_placed(stack: &TestStack, url: &str, services: &[&Service]) {
    let gateway = services[0];
    let m = metrics(url).await;
    for want in [
        "gateway_reserved_floor_ratio{tenant=\"floors-prod\"} 0.3",
        "gateway_reserved_floors_ratio{of=\"applied\"} 0.3",
        "gateway_reserved_floors_ratio{of=\"limit\"} 0.5",
    ] {
        assert!(m.lines().any(|l| l == want), "no {want} in:\n{m}");
    }
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    let seed = long_seed();

    // The best-effort tenant fills the pool until it is refused; it keeps
    // its streams open (each holds ~5% of the pool).
    let mut held = Vec::new();
    let refusal = loop {
        let mut res = client
            .post(&chat)
            .bearer_auth(BATCH)
            .json(&body("batch", held.len(), seed))
            .send()
            .await
            .unwrap();
        if res.status() == 200 {
            assert_eq!(read_sse(&mut res, 1).await.len(), 1, "the stream started");
            held.push(res);
            assert!(held.len() < 40, "never refused:\n{}", gateway.log_tail());
            continue;
        }
        assert_eq!(res.status(), 503, "{}", gateway.log_tail());
        break res.json::<Value>().await.unwrap();
    };
    let message = refusal["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("held for reserved tenants' floors"),
        "refused for the floor, not a full replica: {refusal}"
    );
    // Best effort may use 60% of the pool; 30% is held: about 6 requests
    // of 5% each (the router counts KV in use, which a request grows into).
    assert!(
        (4..=14).contains(&held.len()),
        "{} best-effort requests placed",
        held.len()
    );

    // The owner of the floor arrives: placed at once, within its floor.
    let mut prod = Vec::new();
    for n in 0..4 {
        let mut res = client
            .post(&chat)
            .bearer_auth(PROD)
            .json(&body("prod", n, seed))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{}", res.text().await.unwrap());
        assert_eq!(read_sse(&mut res, 1).await.len(), 1, "the stream started");
        prod.push(res);
    }
    // Every answered request ends with exactly one usage event.
    let answered = held.len() + prod.len();
    for mut res in held.into_iter().chain(prod) {
        let frames = read_sse(&mut res, usize::MAX).await;
        assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    }
    let batch_rows = wait_for_log(stack, "floors-batch", answered - 4, services).await;
    let prod_rows = wait_for_log(stack, "floors-prod", 4, services).await;
    assert_eq!(batch_rows.len() + prod_rows.len(), answered);
}
