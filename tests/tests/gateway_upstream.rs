#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! The gateway in front of an OpenAI-compatible server over HTTP (the
//! `engine` binary standing in for vLLM): requests pass through, usage comes
//! from the upstream's own counts, and GPU time is either the upstream's
//! reported figure or derived from wall time × in-flight token share — in
//! both cases adding up exactly to the replica's busy GPU time.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use rust_decimal::Decimal;
use serde_json::{json, Value};
use tests::gateway::{read_sse, seed_tenant, start_gateway_with, start_ingest};
use tests::TestStack;

const KEY: &str = "sk-test-upstream-0001";
const DERIVED: &str = "llama-3.1-8b";
const REPORTED: &str = "llama-3.1-70b";

/// The value of the first sample of `name` whose labels contain `label`.
fn sample(metrics: &str, name: &str, label: &str) -> Option<Decimal> {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// (finish_reason, completion_tokens, gpu_seconds, replica_id) by request id.
async fn events(stack: &TestStack, model: &str) -> HashMap<String, (String, i64, Decimal, String)> {
    let rows: Vec<(uuid::Uuid, String, i64, Decimal, String)> = sqlx::query_as(
        "SELECT request_id, finish_reason, completion_tokens, gpu_seconds, replica_id
         FROM request_log WHERE model = $1",
    )
    .bind(model)
    .fetch_all(&stack.pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(id, f, c, g, r)| (format!("req_{id}"), (f, c, g, r)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_upstream_usage_and_gpu_time_add_up() {
    let stack = TestStack::new("gwupstream").await;
    seed_tenant(&stack, "remote", KEY, Default::default()).await;

    // The upstream: the engine binary over HTTP, 20× real time so
    // requests overlap on its replicas.
    // It checks the identity the gateway signs with a per-test secret.
    let secret = tests::engine::random_secret();
    let (mut engine, engine_url) = tests::engine::start_engine(stack.dir.path(), 20, &secret).await;

    // The 70b entry also sets vLLM's `cache_salt` (the engine ignores it).
    let upstreams = stack.dir.path().join("upstreams.yaml");
    std::fs::write(
        &upstreams,
        format!(
            "upstreams:
  - model: {DERIVED}
    url: {engine_url}
    gpus: 1
    max_context: 131072
    model_version: served-8b
    replica_id: http-8b
    gpu_time: derived
    kv_poll_ms: 200
    identity_secret_env: {env}
  - model: {REPORTED}
    url: {engine_url}/
    gpus: 4
    max_context: 131072
    identity_secret_env: {env}
    cache_salt: true
",
            env = tests::engine::SECRET_ENV
        ),
    )
    .unwrap();
    let (gateway, url) = start_gateway_with(
        &stack,
        1,
        &[
            ("GATEWAY_UPSTREAMS", upstreams.display().to_string()),
            (tests::engine::SECRET_ENV, secret.clone()),
        ],
    )
    .await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");

    // Concurrent traffic on both models: plain, streamed with usage, and
    // streams whose client leaves after three chunks.
    let mut told: HashMap<String, (String, i64)> = HashMap::new();
    let mut cancelled: Vec<String> = Vec::new();
    let calls = (0..24).map(|i| {
        let (client, chat) = (client.clone(), chat.clone());
        async move {
            let (stream, leave) = (i % 2 == 1, i % 8 == 7);
            let model = if i % 3 == 0 && !leave { REPORTED } else { DERIVED };
            let mut res = client
                .post(&chat)
                .bearer_auth(KEY)
                .json(&json!({
                    "model": model,
                    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": format!("question number {i} about GPUs")}],
                    "max_tokens": if leave { 500 } else { 60 },
                    "seed": i,
                    "temperature": 0.2,
                    "stream": stream,
                    // OpenAI refuses stream_options without a stream.
                    "stream_options": stream.then(|| json!({"include_usage": true})),
                }))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200, "{}", res.text().await.unwrap_or_default());
            let id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
            if leave {
                let first = read_sse(&mut res, 3).await;
                assert_eq!(first.len(), 3);
                return (id, None);
            }
            let usage: Value = if stream {
                let frames = read_sse(&mut res, 10_000).await;
                assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
                let last: Value = serde_json::from_str(&frames[frames.len() - 2]).unwrap();
                last["usage"].clone()
            } else {
                let body: Value = res.json().await.unwrap();
                assert_eq!(body["model"], model);
                body["usage"].clone()
            };
            (id, Some((model.to_owned(), usage["completion_tokens"].as_i64().unwrap())))
        }
    });
    for (id, outcome) in join_all(calls).await {
        match outcome {
            Some(o) => {
                told.insert(id, o);
            }
            None => cancelled.push(id),
        }
    }
    assert_eq!(cancelled.len(), 3);

    // Every request is billed once, with what the client was told.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let (derived, reported) = loop {
        let (d, r) = (
            events(&stack, DERIVED).await,
            events(&stack, REPORTED).await,
        );
        if d.len() + r.len() >= 24 || tokio::time::Instant::now() > deadline {
            break (d, r);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        derived.len() + reported.len(),
        24,
        "gateway:\n{}\ningest:\n{}",
        gateway.log_tail(),
        ingest.log_tail()
    );
    for (id, (model, completion)) in &told {
        let all = if model == DERIVED {
            &derived
        } else {
            &reported
        };
        let (reason, billed, gpu, _) = &all[id];
        assert!(["stop", "length"].contains(&reason.as_str()), "{reason}");
        assert_eq!(
            billed, completion,
            "billed tokens = the usage the client got"
        );
        assert!(*gpu > Decimal::ZERO, "{id} has GPU time");
    }
    for id in &cancelled {
        let (reason, billed, gpu, _) = derived.get(id).or(reported.get(id)).unwrap();
        assert_eq!(reason, "cancelled");
        assert!(
            (3..500).contains(billed),
            "tokens streamed before leaving, got {billed}"
        );
        assert!(*gpu > Decimal::ZERO);
    }
    assert!(derived.values().all(|e| e.3 == "http-8b"));

    // Derived: the requests' shares add up to the replica's busy GPU time,
    // exactly, as the shared ledger (every gateway's, in Redis) measured it.
    let metrics = tests::gateway::metrics(&url).await;
    let busy = sample(
        &metrics,
        "gateway_upstream_shared_busy_gpu_seconds_total",
        "http-8b",
    )
    .unwrap();
    let attributed = sample(
        &metrics,
        "gateway_upstream_shared_attributed_gpu_seconds_total",
        "http-8b",
    )
    .unwrap();
    let billed: Decimal = derived.values().map(|e| e.2).sum();
    assert_eq!(billed, busy, "{metrics}");
    assert_eq!(attributed, busy);
    // The upstream's KV usage is read from its /metrics (for admission by class).
    let kv = sample(&metrics, "gateway_upstream_kv_usage_ratio", "http-8b").unwrap();
    assert!((Decimal::ZERO..=Decimal::ONE).contains(&kv), "{kv}");

    // Reported: the engine's own attribution passes through unchanged, so
    // the requests on that replica (none cancelled) add up to its busy GPU time.
    assert!(!reported.is_empty());
    let engine_metrics = tests::gateway::metrics(&engine_url).await;
    let busy = sample(
        &engine_metrics,
        "meterline_engine_busy_gpu_seconds_total",
        REPORTED,
    )
    .unwrap();
    let billed: Decimal = reported.values().map(|e| e.2).sum();
    assert_eq!(billed, busy, "{engine_metrics}");

    // The OpenAI request shapes pass through: content parts, a tool call
    // with null content and a tool message reach the upstream and are
    // answered; what the upstream refuses keeps its `param`.
    let conversation = json!({
        "model": DERIVED,
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "weather in Paris?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/paris.png"}}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "14 C"}
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
        "max_tokens": 8,
    });
    let res = client
        .post(&chat)
        .bearer_auth(KEY)
        .json(&conversation)
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        200,
        "{}",
        res.text().await.unwrap_or_default()
    );
    let mut refused = conversation.clone();
    refused["n"] = json!(2);
    let res = client
        .post(&chat)
        .bearer_auth(KEY)
        .json(&refused)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"]["param"], "n", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");

    // The upstream going away: 502 in OpenAI's shape, nothing billed.
    engine.kill9().await;
    let res = client
        .post(&chat)
        .bearer_auth(KEY)
        .json(&json!({"model": DERIVED, "messages": [{"role": "user", "content": "hello?"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 502);
    assert!(res.headers().contains_key("x-request-id"));
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"]["type"], "server_error");
    let total =
        || async { events(&stack, DERIVED).await.len() + events(&stack, REPORTED).await.len() };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while total().await < 24 + 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        total().await,
        24 + 1,
        "the traffic and the tool conversation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_gateways_in_front_of_one_replica_bill_its_busy_time_once() {
    let stack = TestStack::new("gwtwoone").await;
    seed_tenant(&stack, "remote", KEY, Default::default()).await;
    let secret = tests::engine::random_secret();
    let (_engine, engine_url) = tests::engine::start_engine(stack.dir.path(), 10, &secret).await;
    let upstreams = stack.dir.path().join("upstreams.yaml");
    std::fs::write(
        &upstreams,
        format!(
            "upstreams:
  - model: {DERIVED}
    url: {engine_url}
    gpus: 2
    max_context: 131072
    replica_id: one-replica
    gpu_time: derived
    kv_poll_ms: 0
    identity_secret_env: {env}
",
            env = tests::engine::SECRET_ENV
        ),
    )
    .unwrap();
    let mut gateways = Vec::new();
    for id in ["gw-a", "gw-b"] {
        gateways.push(
            start_gateway_with(
                &stack,
                1,
                &[
                    ("GATEWAY_ID", id.to_owned()),
                    (
                        "GATEWAY_OUTBOX",
                        stack.dir.path().join(id).display().to_string(),
                    ),
                    ("GATEWAY_UPSTREAMS", upstreams.display().to_string()),
                    (tests::engine::SECRET_ENV, secret.clone()),
                ],
            )
            .await,
        );
    }
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    // Overlapping requests through both gateways, so the replica is busy
    // with both at once (10× real time: a few hundred ms each).
    let calls = (0..30).map(|i| {
        let client = client.clone();
        let url = gateways[i % 2].1.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(40 * i as u64)).await;
            let res = client
                .post(format!("{url}/v1/chat/completions"))
                .bearer_auth(KEY)
                .json(&json!({
                    "model": DERIVED,
                    "messages": [{"role": "user", "content": format!("request {i}")}],
                    "max_tokens": 40 + 10 * (i % 5),
                    "stream": i % 3 == 0,
                }))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200);
            res.text().await.unwrap();
        }
    });
    join_all(calls).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let billed = loop {
        let e = events(&stack, DERIVED).await;
        if e.len() >= 30 || tokio::time::Instant::now() > deadline {
            assert_eq!(e.len(), 30, "{}", ingest.log_tail());
            break e;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let billed: Decimal = billed.values().map(|e| e.2).sum();
    let a = tests::gateway::metrics(&gateways[0].1).await;
    let b = tests::gateway::metrics(&gateways[1].1).await;
    let shared = |m: &str, name: &str| sample(m, name, "one-replica").unwrap();
    // Both gateways read the one ledger: the same figures.
    let busy = shared(&a, "gateway_upstream_shared_busy_gpu_seconds_total");
    assert_eq!(
        busy,
        shared(&b, "gateway_upstream_shared_busy_gpu_seconds_total")
    );
    assert_eq!(
        shared(&a, "gateway_upstream_shared_attributed_gpu_seconds_total"),
        busy
    );
    // The guarantee: over both gateways, the requests' GPU-seconds add up
    // to the replica's busy wall time × its GPUs, to the microsecond.
    assert_eq!(billed, busy, "billed {billed}, the replica was busy {busy}");
    // Each gateway's own ledger saw only its own requests, and the two
    // overlapped: added up, they would have billed the overlap twice.
    let own = sample(&a, "gateway_upstream_busy_gpu_seconds_total", "one-replica").unwrap()
        + sample(&b, "gateway_upstream_busy_gpu_seconds_total", "one-replica").unwrap();
    assert!(
        own > busy * Decimal::new(12, 1),
        "the gateways' own ledgers ({own}) should over-count the shared one ({busy})"
    );
    assert!(
        own <= busy * Decimal::from(2) + Decimal::ONE,
        "{own} vs {busy}"
    );
}

/// One model on two HTTP replicas (two `engine` processes): requests
/// spread over both, each billed once on the replica that ran it; when
/// one is SIGKILLed the requests it was running fail with an error and are
/// billed for what the gateway could account, and new requests go to the
/// replica left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_on_two_http_replicas_spreads_and_survives_one_dying() {
    let stack = TestStack::new("gwhttppool").await;
    seed_tenant(&stack, "remote", KEY, Default::default()).await;
    let secret = tests::engine::random_secret();
    let (mut a, a_url) = tests::engine::start_engine(stack.dir.path(), 20, &secret).await;
    let (_b, b_url) = tests::engine::start_engine(stack.dir.path(), 20, &secret).await;
    let upstreams = stack.dir.path().join("upstreams-pool.yaml");
    let entry = |url: &str, id: &str| {
        format!(
            "  - model: {DERIVED}\n    url: {url}\n    gpus: 1\n    max_context: 131072\n    replica_id: {id}\n    identity_secret_env: {env}\n",
            env = tests::engine::SECRET_ENV
        )
    };
    std::fs::write(
        &upstreams,
        format!(
            "upstreams:\n{}{}",
            entry(&a_url, "http-a"),
            entry(&b_url, "http-b")
        ),
    )
    .unwrap();
    let (gateway, url) = start_gateway_with(
        &stack,
        1,
        &[
            ("GATEWAY_UPSTREAMS", upstreams.display().to_string()),
            (tests::engine::SECRET_ENV, secret.clone()),
        ],
    )
    .await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    let ask = |i: usize| {
        let (client, chat) = (client.clone(), chat.clone());
        async move {
            let res = client
                .post(&chat)
                .bearer_auth(KEY)
                .json(&json!({"model": DERIVED, "max_tokens": 24,
                              "messages": [{"role": "user", "content": format!("pool {i}")}]}))
                .send()
                .await
                .unwrap();
            res.status().as_u16()
        }
    };
    let first: Vec<u16> = join_all((0..40).map(ask)).await;
    assert!(first.iter().all(|s| *s == 200), "{first:?}");
    let rows = {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let rows = events(&stack, DERIVED).await;
            if rows.len() >= 40 || tokio::time::Instant::now() > deadline {
                break rows;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    assert_eq!(rows.len(), 40, "{}", ingest.log_tail());
    let on = |id: &str| rows.values().filter(|r| r.3 == id).count();
    assert!(
        on("http-a") >= 5 && on("http-b") >= 5,
        "both replicas take a share: a {}, b {}",
        on("http-a"),
        on("http-b")
    );

    // Replica a dies: new requests go to b (at most the first few meet the
    // dead one and get an error, billed as such, before it leaves the pool).
    a.kill9().await;
    let after: Vec<u16> = join_all((40..60).map(ask)).await;
    let failed = after.iter().filter(|s| **s != 200).count();
    assert!(failed <= 2, "a dead replica leaves the pool: {after:?}");
    let later: Vec<u16> = join_all((60..80).map(ask)).await;
    assert!(
        later.iter().all(|s| *s == 200),
        "{later:?}\n{}",
        gateway.log_tail()
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let rows = loop {
        let rows = events(&stack, DERIVED).await;
        if rows.len() >= 80 - failed || tokio::time::Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let new_on_a = rows
        .values()
        .filter(|r| r.3 == "http-a" && r.0 != "error")
        .count();
    assert_eq!(
        new_on_a,
        on("http-a"),
        "nothing more completes on the dead replica"
    );
    assert!(
        rows.len() >= 80 - failed,
        "every answered request is billed once"
    );
}
