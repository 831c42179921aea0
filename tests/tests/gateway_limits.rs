#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! Each limit trips with 429, the limit's name as the error `type`, a
//! `Retry-After` and the `x-ratelimit-*` headers; rejected requests are
//! never billed; a full engine is 503, never mixed up with 429.

use std::time::Duration;

use serde_json::{json, Value};
use tests::gateway::{
    read_sse, seed_tenant, start_gateway, start_gateway_with, start_ingest, wait_for_log,
    TenantLimits,
};
use tests::TestStack;

const HEADERS: [&str; 6] = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
];

fn body(max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

fn header<'a>(res: &'a reqwest::Response, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .unwrap_or_else(|| panic!("missing {name}"))
        .to_str()
        .unwrap()
}

async fn expect_429(res: reqwest::Response, limit: &str) {
    assert_eq!(res.status(), 429, "{limit}");
    for h in HEADERS {
        header(&res, h);
    }
    let retry: u64 = header(&res, "retry-after").parse().unwrap();
    assert!((1..=120).contains(&retry), "Retry-After {retry}");
    // The exact wait the OpenAI SDK reads, and the seconds rounded up from it.
    let retry_ms: u64 = header(&res, "retry-after-ms").parse().unwrap();
    assert_eq!(
        retry,
        retry_ms.div_ceil(1_000).max(1),
        "retry-after-ms {retry_ms}"
    );
    assert!(res.headers().contains_key("x-request-id"));
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["error"]["type"], limit, "{v}");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_limit_trips_with_its_type_and_headers_and_rejections_are_not_billed() {
    let stack = TestStack::new("gwlimits").await;
    let big = TenantLimits {
        rpm: Some(1000),
        tpm: Some(1_000_000),
        ..Default::default()
    };
    seed_tenant(
        &stack,
        "rpm-tenant",
        "sk-test-rpm",
        TenantLimits {
            rpm: Some(3),
            ..big
        },
    )
    .await;
    seed_tenant(
        &stack,
        "tpm-tenant",
        "sk-test-tpm",
        TenantLimits {
            tpm: Some(100),
            ..big
        },
    )
    .await;
    seed_tenant(
        &stack,
        "conc-tenant",
        "sk-test-conc",
        TenantLimits {
            max_concurrency: Some(1),
            ..big
        },
    )
    .await;
    let (gateway, url) = start_gateway(&stack, 1).await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    let send = |key: &'static str, b: Value| client.post(&chat).bearer_auth(key).json(&b).send();

    // Requests per minute: 3 pass, the 4th is turned away.
    for n in 0..3 {
        let res = send("sk-test-rpm", body(5, false)).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(header(&res, "x-ratelimit-limit-requests"), "3");
        assert_eq!(
            header(&res, "x-ratelimit-remaining-requests"),
            (2 - n).to_string()
        );
        assert_eq!(header(&res, "x-ratelimit-limit-tokens"), "1000000");
        let reset = header(&res, "x-ratelimit-reset-requests");
        assert!(reset.ends_with('s'), "{reset}");
    }
    expect_429(
        send("sk-test-rpm", body(5, false)).await.unwrap(),
        "requests",
    )
    .await;
    // Errors of an authenticated request carry the headers too.
    let res = client
        .post(&chat)
        .bearer_auth("sk-test-rpm")
        .json(&json!({"model": "llama-3.1-8b", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    header(&res, "x-ratelimit-remaining-requests");

    // Tokens per minute: the estimate (prompt + max_tokens) is charged at
    // admission, the actual count kept; a second one no longer fits.
    let res = send("sk-test-tpm", body(90, false)).await.unwrap();
    assert_eq!(res.status(), 200);
    let remaining: u64 = header(&res, "x-ratelimit-remaining-tokens")
        .parse()
        .unwrap();
    let v: Value = res.json().await.unwrap();
    let used = v["usage"]["total_tokens"].as_u64().unwrap();
    assert!(
        (100 - used..=100 - used + 2).contains(&remaining),
        "the estimate was reconciled to the {used} tokens used, remaining {remaining}"
    );
    expect_429(
        send("sk-test-tpm", body(90, false)).await.unwrap(),
        "tokens",
    )
    .await;

    // Concurrency: one stream open, a second request is turned away, and
    // the streaming response carries the headers.
    let mut open = send("sk-test-conc", body(500, true)).await.unwrap();
    assert_eq!(open.status(), 200);
    for h in HEADERS {
        header(&open, h);
    }
    assert_eq!(read_sse(&mut open, 2).await.len(), 2);
    expect_429(
        send("sk-test-conc", body(5, false)).await.unwrap(),
        "concurrency",
    )
    .await;
    drop(open);

    // Billed: 3 + 1 + 1 admitted requests, none of the rejected ones.
    wait_for_log(&stack, "rpm-tenant", 3, &[&gateway, &ingest]).await;
    wait_for_log(&stack, "tpm-tenant", 1, &[&gateway, &ingest]).await;
    let conc = wait_for_log(&stack, "conc-tenant", 1, &[&gateway, &ingest]).await;
    assert_eq!(conc.values().next().unwrap().0, "cancelled");

    // The slot is free again once the stream ended.
    let res = send("sk-test-conc", body(5, false)).await.unwrap();
    assert_eq!(res.status(), 200);

    let metrics = tests::gateway::metrics(&url).await;
    for reason in ["requests", "tokens", "concurrency"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("gateway_rejections_total")
                    && l.contains(&format!("reason=\"{reason}\""))),
            "rejections by {reason}:\n{metrics}"
        );
    }
    assert!(metrics.contains("gateway_active_requests"), "{metrics}");
    assert!(metrics.contains("gateway_tokens_remaining"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_and_global_rates_are_429_and_a_full_engine_is_503() {
    let stack = TestStack::new("gwcapacity").await;
    for (tenant, key) in [
        ("burster", "sk-test-burster"),
        ("flood", "sk-test-flood"),
        ("vip", "sk-test-vip"),
    ] {
        // Generous per-key limits, so every answer carries x-ratelimit-*.
        let limits = TenantLimits {
            rpm: Some(100_000),
            tpm: Some(100_000_000),
            ..Default::default()
        };
        seed_tenant(&stack, tenant, key, limits).await;
    }
    // The reference config's rateLimit (requests/s, burst), and a
    // best-effort tenant (priority 1: admitted below 60% KV occupancy).
    sqlx::query(
        "UPDATE tenants SET requests_per_second = 1, burst = 2 WHERE tenant_id = 'burster'",
    )
    .execute(&stack.pool)
    .await
    .unwrap();
    sqlx::query("UPDATE tenants SET priority = 1 WHERE tenant_id = 'flood'")
        .execute(&stack.pool)
        .await
        .unwrap();
    // Real time: long prompts queue for prefill and hold their KV while
    // they decode, so occupancy climbs while the test watches. Without the
    // fair queue (`GATEWAY_QUEUE=off`) a full engine answers 503 at once.
    let (gateway, url) = start_gateway_with(
        &stack,
        1,
        &[
            ("GATEWAY_GLOBAL_RPS", "20".into()),
            ("GATEWAY_GLOBAL_BURST", "20".into()),
            ("GATEWAY_QUEUE", "off".into()),
        ],
    )
    .await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    let send = |key: &'static str, b: Value| client.post(&chat).bearer_auth(key).json(&b).send();

    // 1. The tenant's bucket: a burst of 2, then 429 `tenant_requests`.
    for _ in 0..2 {
        assert_eq!(
            send("sk-test-burster", body(1, false))
                .await
                .unwrap()
                .status(),
            200
        );
    }
    expect_429(
        send("sk-test-burster", body(1, false)).await.unwrap(),
        "tenant_requests",
    )
    .await;

    // 2. A long-context flood from the best-effort tenant fills the 8B
    //    replica's KV until the engine says no: 503, not 429.
    let mut held = Vec::new();
    let mut refused = None;
    for i in 0..40 {
        let prompt = format!("flood {i}:{}", " hello".repeat(100_000));
        let res = send(
            "sk-test-flood",
            json!({
                "model": "llama-3.1-8b",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 30_000,
                "stream": true,
            }),
        )
        .await
        .unwrap();
        match res.status().as_u16() {
            200 => held.push(res),
            503 => {
                refused = Some(res);
                break;
            }
            s => panic!("unexpected {s}: {}", res.text().await.unwrap()),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let refused = refused.expect("the flood was never refused");
    assert!(held.len() >= 2, "several long requests fit first");
    // No capacity: come back in 5 s plus up to 5 s of jitter.
    let retry: u64 = header(&refused, "retry-after").parse().unwrap();
    let retry_ms: u64 = header(&refused, "retry-after-ms").parse().unwrap();
    assert!(
        (5_000..=10_000).contains(&retry_ms),
        "retry-after-ms {retry_ms}"
    );
    assert_eq!(retry, retry_ms.div_ceil(1_000), "Retry-After {retry}");
    assert!(refused.headers().contains_key("x-request-id"));
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_capacity", "{v}");
    assert_eq!(v["error"]["type"], "server_error", "{v}");

    // 3. A reserved tenant (threshold 92%) still gets in during the flood.
    let res = send("sk-test-vip", body(5, false)).await.unwrap();
    assert_eq!(res.status(), 200, "{}", res.text().await.unwrap());

    // 4. The global bucket (20/s, burst 20) turns a burst of 40 away in part.
    let burst = (0..40).map(|_| send("sk-test-vip", body(1, false)));
    let mut statuses: Vec<u16> = Vec::new();
    let mut global = 0;
    for res in futures_util::future::join_all(burst).await {
        let res = res.unwrap();
        statuses.push(res.status().as_u16());
        if res.status() == 429 {
            let v: Value = res.json().await.unwrap();
            assert_eq!(v["error"]["type"], "global_requests", "{v}");
            global += 1;
        }
    }
    assert!(
        statuses.iter().all(|s| [200, 429].contains(s)),
        "{statuses:?}"
    );
    assert!(global > 0, "{statuses:?}");
    let vip_ok = 1 + statuses.iter().filter(|s| **s == 200).count();

    // The flood's clients leave: each admitted stream is billed once, as
    // cancelled; nothing refused is billed.
    let flooded = held.len();
    drop(held);
    wait_for_log(&stack, "burster", 2, &[&gateway, &ingest]).await;
    wait_for_log(&stack, "vip", vip_ok, &[&gateway, &ingest]).await;
    let flood = wait_for_log(&stack, "flood", flooded, &[&gateway, &ingest]).await;
    assert!(flood.values().all(|row| row.0 == "cancelled"), "{flood:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_seconds_in_flight_are_capped_per_tenant() {
    let stack = TestStack::new("gwkv").await;
    const KEY: &str = "sk-test-kv-0001";
    seed_tenant(&stack, "kv", KEY, Default::default()).await;
    // 20 GiB·s: two of the requests below (~8 GiB·s each: 1,000 output
    // tokens on the 70B at twice its 26.3 ms target TPOT) fit, a third not.
    sqlx::query("UPDATE tenants SET max_kv_gib_seconds = 20 WHERE tenant_id = 'kv'")
        .execute(&stack.pool)
        .await
        .unwrap();
    let (gateway, url) = start_gateway(&stack, 1).await;
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    let stream = |max_tokens: u32| {
        client
            .post(&chat)
            .bearer_auth(KEY)
            .json(&json!({
                "model": "llama-3.1-70b",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": max_tokens,
                "stream": true,
            }))
            .send()
    };
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut res = stream(1000).await.unwrap();
        assert_eq!(res.status(), 200, "{}", gateway.log_tail());
        res.chunk().await.unwrap();
        held.push(res);
    }
    let third = stream(1000).await.unwrap();
    assert_eq!(third.status(), 429);
    let v: Value = third.json().await.unwrap();
    assert_eq!(v["error"]["type"], "kv_seconds", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("20 GiB·s"),
        "{v}"
    );
    // A small one still fits beside them (the cap is KV·s, not a count).
    let small = client
        .post(&chat)
        .bearer_auth(KEY)
        .json(&json!({"model": "llama-3.1-70b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(small.status(), 200);
    // Released when they end; then one larger than the whole cap (~128
    // GiB·s) passes alone: slow, never impossible.
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut res = stream(4000).await.unwrap();
        if res.status() == 200 {
            res.chunk().await.unwrap();
            let next = stream(5).await.unwrap();
            assert_eq!(next.status(), 429, "the large one holds the whole cap");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never released");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
