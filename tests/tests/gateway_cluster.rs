#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! Several gateway processes on one Redis behave as one gateway: one key's
//! limit holds across them, a SIGKILLed gateway's concurrency comes back
//! within 15 s, an idempotent retry on another gateway gets the same
//! answer and is billed once (also after the first gateway was killed,
//! and after Redis restarted empty), a Redis that stops turns every
//! gateway to local mode and back, and without Redis the gateways
//! together (one of them restarted) never pass a concurrency cap.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use devstack::PrivateRedis;
use serde_json::{json, Value};
use tests::gateway::{
    hourly, metrics, seed_tenant, start_gateway_named, start_ingest, wait_for_log, TenantLimits,
    Told,
};
use tests::process::wait_healthy;
use tests::{Service, TestStack};

/// Starts gateway `id` with its own outbox, on `redis` (the shared one if `None`).
async fn gateway(
    stack: &TestStack,
    id: &str,
    speedup: u32,
    redis: Option<&str>,
) -> (Service, String) {
    let settings: Vec<(&str, String)> = redis
        .map(|url| ("REDIS_URL", url.to_owned()))
        .into_iter()
        .collect();
    start_gateway_named(stack, id, speedup, &settings).await
}

fn chat(model: &str, content: &str, max_tokens: u32) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    })
}

/// The value of `gateway_limits_mode{mode="…"}` on a gateway.
async fn mode(url: &str) -> &'static str {
    let text = metrics(url).await;
    if text
        .lines()
        .any(|l| l == "gateway_limits_mode{mode=\"shared\"} 1")
    {
        "shared"
    } else if text
        .lines()
        .any(|l| l == "gateway_limits_mode{mode=\"local\"} 1")
    {
        "local"
    } else {
        panic!("no gateway_limits_mode in /metrics:\n{text}")
    }
}

async fn wait_mode(url: &str, want: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if mode(url).await == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{url} not {want} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the gateway at `url` has seen `n` gateways alive (its
/// heartbeat runs every 5 s).
async fn wait_peers(url: &str, n: u32) {
    let want = format!("gateway_peers {n}");
    let deadline = Instant::now() + Duration::from_secs(12);
    while !metrics(url).await.lines().any(|l| l == want) {
        assert!(Instant::now() < deadline, "{url} never saw {n} gateways");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the client was told in a 200: (prompt, cached, completion).
fn usage(v: &Value) -> (i64, i64, i64) {
    let u = &v["usage"];
    (
        u["prompt_tokens"].as_i64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_i64()
            .unwrap_or(0),
        u["completion_tokens"].as_i64().unwrap(),
    )
}

fn add(told: &mut Told, tenant: &str, (p, c, o): (i64, i64, i64)) {
    let e = told.entry(tenant.to_owned()).or_default();
    e.0 += 1;
    e.1 += p;
    e.2 += c;
    e.3 += o;
}

async fn wait_hourly(stack: &TestStack, want: &Told, services: &[&Service]) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got = hourly(stack).await;
        if &got == want {
            return;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = services.iter().map(|s| s.log_tail()).collect();
            panic!(
                "usage_hourly {got:?}, clients were told {want:?}\n{}",
                logs.join("\n---\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_gateways_behind_nginx_admit_one_keys_limit_between_them() {
    let stack = TestStack::new("gwshared").await;
    const KEY: &str = "sk-test-shared-0001";
    let limits = TenantLimits {
        rpm: Some(60),
        ..Default::default()
    };
    seed_tenant(&stack, "shared", KEY, limits).await;
    let mut gateways = Vec::new();
    for id in ["gw-a", "gw-b", "gw-c"] {
        gateways.push(gateway(&stack, id, 0, None).await);
    }
    // Every gateway has seen the other two (heartbeats every 5 s).
    for (_, url) in &gateways {
        wait_peers(url, 3).await;
        assert_eq!(mode(url).await, "shared");
    }
    // In front of them, nginx (round robin), as a load balancer would be.
    let upstreams: Vec<String> = gateways
        .iter()
        .map(|(_, u)| u.trim_start_matches("http://").to_owned())
        .collect();
    let nginx = tests::nginx::Nginx::start(stack.dir.path(), &upstreams).await;
    let client = reqwest::Client::new();
    let started = Instant::now();
    // 8 concurrent clients, 240 requests, all through nginx.
    let mut tasks = Vec::new();
    for _ in 0..8usize {
        let (client, url) = (client.clone(), nginx.url().to_owned());
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u32;
            for _ in 0..30usize {
                let res = client
                    .post(format!("{url}/v1/chat/completions"))
                    .bearer_auth(KEY)
                    .json(&chat("llama-3.1-8b", "hello", 3))
                    .send()
                    .await
                    .unwrap();
                match res.status().as_u16() {
                    200 => admitted += 1,
                    429 => {
                        let v: Value = res.json().await.unwrap();
                        assert_eq!(v["error"]["type"], "requests", "{v}");
                    }
                    s => panic!("status {s}: {}", res.text().await.unwrap()),
                }
            }
            admitted
        }));
    }
    let mut told = 0u32;
    for t in tasks {
        told += t.await.unwrap();
    }
    // A lease a gateway did not spend is given back after a second; a
    // burst that ends sooner may leave a few of the key's tokens in one
    // gateway's lease. After that second, 30 more requests find them.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for _ in 0..30usize {
        let res = client
            .post(format!("{}/v1/chat/completions", nginx.url()))
            .bearer_auth(KEY)
            .json(&chat("llama-3.1-8b", "hello", 3))
            .send()
            .await
            .unwrap();
        match res.status().as_u16() {
            200 => told += 1,
            429 => {}
            s => panic!("status {s}: {}", res.text().await.unwrap()),
        }
    }
    // What each gateway admitted, from its own metrics.
    let mut per_gateway = [0u32; 3];
    for (g, (_, url)) in gateways.iter().enumerate() {
        let m = metrics(url).await;
        per_gateway[g] = m
            .lines()
            .filter(|l| l.starts_with("gateway_requests_total{") && l.contains("\"shared\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u32>().ok())
            .sum();
    }
    let total: u32 = per_gateway.iter().sum();
    assert_eq!(
        total, told,
        "the gateways admitted what clients were told 200"
    );
    // 60/min refills one a second: the limit, plus what refilled meanwhile.
    let refilled = started.elapsed().as_secs() as u32 + 1;
    assert!(
        (60..=60 + refilled).contains(&total),
        "admitted {per_gateway:?} = {total}; the key's limit is 60/min (+{refilled} refilled)"
    );
    // Each gateway alone, with its limits in memory, would have admitted
    // 60 of the ~80 nginx sent it; here none got near that.
    assert!(
        per_gateway.iter().all(|n| (1..60).contains(n)),
        "{per_gateway:?}"
    );
    for (_, url) in &gateways {
        assert_eq!(mode(url).await, "shared");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_gateways_concurrency_returns_and_nothing_it_answered_is_lost_or_doubled() {
    let stack = TestStack::new("gwkill").await;
    const KEY: &str = "sk-test-kill-0001";
    let limits = TenantLimits {
        max_concurrency: Some(3),
        ..Default::default()
    };
    seed_tenant(&stack, "kill", KEY, limits).await;
    let (mut a, url_a) = gateway(&stack, "gw-a", 1, None).await;
    let (b, url_b) = gateway(&stack, "gw-b", 1, None).await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let send = |url: &str, body: Value| {
        client
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&body)
            .send()
    };
    // Answered by a before it dies: these must be billed, once.
    let mut told = Told::new();
    let mut prompt_tokens = 0;
    for n in 0..3 {
        let res = send(&url_a, chat("llama-3.1-8b", &format!("short {n}"), 5))
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let told_now = usage(&res.json().await.unwrap());
        prompt_tokens = told_now.0;
        add(&mut told, "kill", told_now);
    }
    // Three long streams (500+ tokens each, about 10 s) hold the tenant's
    // whole concurrency on a; "long n" is as long a prompt as "short n".
    let seed = tests::engine::seed_for_long_answer(u64::try_from(prompt_tokens).unwrap(), 500);
    let mut streams = Vec::new();
    for n in 0..3 {
        let mut body = chat("llama-3.1-70b", &format!("long {n}"), 4000);
        body["seed"] = json!(seed);
        body["stream"] = json!(true);
        let mut res = send(&url_a, body).await.unwrap();
        assert_eq!(res.status(), 200);
        let first = res.chunk().await.unwrap();
        assert!(first.is_some(), "the stream started");
        streams.push(res);
    }
    let refused = send(&url_b, chat("llama-3.1-8b", "while a holds all", 5))
        .await
        .unwrap();
    assert_eq!(
        refused.status(),
        429,
        "{}\n--- gw-a:\n{}\n--- gw-b:\n{}",
        refused.text().await.unwrap(),
        a.log_tail(),
        b.log_tail()
    );

    a.kill9().await;
    let killed = Instant::now();
    drop(streams);
    let returned = loop {
        let res = send(&url_b, chat("llama-3.1-8b", "after the kill", 5))
            .await
            .unwrap();
        if res.status() == 200 {
            add(&mut told, "kill", usage(&res.json().await.unwrap()));
            break killed.elapsed();
        }
        assert_eq!(res.status(), 429);
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "a's concurrency never came back:\n{}",
            b.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        returned <= Duration::from_millis(15_500),
        "concurrency came back after {returned:?}, above 15 s"
    );
    // a comes back (same outbox): what it answered is relayed, once.
    a.restart().unwrap_or_else(|e| panic!("{e}"));
    wait_healthy(&format!("{url_a}/healthz"), &mut a, Duration::from_secs(60)).await;
    wait_for_log(&stack, "kill", 4, &[&a, &b, &ingest]).await;
    wait_hourly(&stack, &told, &[&a, &b, &ingest]).await;
    eprintln!("concurrency returned {returned:?} after the SIGKILL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotent_retries_across_gateways_kills_and_a_redis_restart_are_billed_once() {
    let mut redis = PrivateRedis::start().await.unwrap();
    let stack = TestStack::new("gwidemx").await;
    const KEY: &str = "sk-test-idemx-0001";
    seed_tenant(&stack, "idemx", KEY, Default::default()).await;
    let (mut a, url_a) = gateway(&stack, "gw-a", 1, Some(&redis.url())).await;
    let (b, url_b) = gateway(&stack, "gw-b", 1, Some(&redis.url())).await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let send = |url: &str, key: &str, body: &Value| {
        client
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth(KEY)
            .header("idempotency-key", key)
            .json(body)
            .send()
    };
    let mut told = Told::new();
    let mut ids = BTreeMap::new();

    // Answered by a, retried on b: the same answer and id, run once.
    let body = chat("llama-3.1-8b", "order 1", 20);
    let first = send(&url_a, "order-1", &body).await.unwrap();
    assert_eq!(first.status(), 200);
    let id = first.headers()["x-request-id"].to_str().unwrap().to_owned();
    let first_body: Value = first.json().await.unwrap();
    add(&mut told, "idemx", usage(&first_body));
    let retry = send(&url_b, "order-1", &body).await.unwrap();
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["x-request-id"], id.as_str());
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.json::<Value>().await.unwrap(), first_body);
    ids.insert("order-1", id);

    // A duplicate on b while a still runs it: 409. a's request is a
    // stream, and its first chunk has arrived, so it is running there
    // however slow or fast this machine is.
    let prompt_tokens = usage(&first_body).0;
    let mut slow = chat("llama-3.1-70b", "order 2", 600);
    slow["seed"] = json!(tests::engine::seed_for_long_answer(
        u64::try_from(prompt_tokens).unwrap(),
        300
    ));
    slow["stream"] = json!(true);
    slow["stream_options"] = json!({"include_usage": true});
    let mut running = send(&url_a, "order-2", &slow).await.unwrap();
    assert_eq!(running.status(), 200);
    let running_id = running.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let first = tests::gateway::read_sse(&mut running, 1).await;
    assert_eq!(first.len(), 1, "the stream started");
    let dup = send(&url_b, "order-2", &slow).await.unwrap();
    assert_eq!(
        dup.status(),
        409,
        "{}\n--- gw-a:\n{}\n--- gw-b:\n{}",
        dup.text().await.unwrap(),
        a.log_tail(),
        b.log_tail()
    );
    let rest = tests::gateway::chunks(&tests::gateway::read_sse(&mut running, usize::MAX).await);
    let last = rest
        .iter()
        .rev()
        .find(|c| !c["usage"].is_null())
        .expect("a usage chunk");
    ids.insert("order-2", running_id);
    add(&mut told, "idemx", usage(last));

    // Answered by a, which is then SIGKILLed: b replays it from Redis.
    let body3 = chat("llama-3.1-8b", "order 3", 20);
    let third = send(&url_a, "order-3", &body3).await.unwrap();
    assert_eq!(third.status(), 200);
    let third_id = third.headers()["x-request-id"].to_str().unwrap().to_owned();
    let third_body: Value = third.json().await.unwrap();
    add(&mut told, "idemx", usage(&third_body));
    a.kill9().await;
    let replay = send(&url_b, "order-3", &body3).await.unwrap();
    assert_eq!(replay.headers()["x-request-id"], third_id.as_str());
    assert_eq!(replay.json::<Value>().await.unwrap(), third_body);
    ids.insert("order-3", third_id);

    // Redis restarts empty: it forgot every claim. A retry of order-1 on b
    // runs again, under the same derived id, and ingest bills it once.
    redis.kill9().await;
    redis.restart().await.unwrap();
    wait_mode(&url_b, "shared", Duration::from_secs(15)).await;
    let rerun = send(&url_b, "order-1", &body).await.unwrap();
    assert_eq!(rerun.status(), 200);
    assert_eq!(
        rerun.headers()["x-request-id"],
        ids["order-1"].as_str(),
        "the re-run carries the first attempt's id"
    );
    assert!(rerun.headers().get("idempotent-replayed").is_none());

    a.restart().unwrap_or_else(|e| panic!("{e}"));
    wait_healthy(&format!("{url_a}/healthz"), &mut a, Duration::from_secs(60)).await;
    let rows = wait_for_log(&stack, "idemx", 3, &[&a, &b, &ingest]).await;
    for (key, id) in &ids {
        assert!(rows.contains_key(id), "{key} ({id}) not billed: {rows:?}");
    }
    wait_hourly(&stack, &told, &[&a, &b, &ingest]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_stopped_mid_traffic_turns_limits_local_and_back() {
    let mut redis = PrivateRedis::start().await.unwrap();
    let stack = TestStack::new("gwredisdown").await;
    const KEY: &str = "sk-test-redisdown-0001";
    let limits = TenantLimits {
        rpm: Some(40),
        max_concurrency: Some(4),
        ..Default::default()
    };
    seed_tenant(&stack, "down", KEY, limits).await;
    let (a, url_a) = gateway(&stack, "gw-a", 0, Some(&redis.url())).await;
    let (b, url_b) = gateway(&stack, "gw-b", 0, Some(&redis.url())).await;
    let ingest = start_ingest(&stack);
    // Both have seen each other before Redis goes.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(mode(&url_a).await, "shared");
    assert!(metrics(&url_a).await.contains("gateway_peers 2"));

    redis.kill9().await;
    let client = reqwest::Client::new();
    let mut told = Told::new();
    let mut admitted = [0u32; 2];
    for n in 0..60usize {
        let (g, url) = if n % 2 == 0 { (0, &url_a) } else { (1, &url_b) };
        let started = Instant::now();
        let res = client
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&chat("llama-3.1-8b", &format!("during the outage {n}"), 3))
            .send()
            .await
            .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "an answer without Redis took {:?}",
            started.elapsed()
        );
        match res.status().as_u16() {
            200 => {
                admitted[g] += 1;
                add(&mut told, "down", usage(&res.json().await.unwrap()));
            }
            429 => {}
            s => panic!("status {s} without Redis: {}", res.text().await.unwrap()),
        }
    }
    for url in [&url_a, &url_b] {
        wait_mode(url, "local", Duration::from_secs(10)).await;
    }
    // Each fell back to its share: 40/min over the 2 gateways it last saw
    // (a minute's allowance is 20 each, +1 for what refilled).
    assert!(
        admitted.iter().all(|n| (1..=21).contains(n)),
        "admitted without Redis {admitted:?}"
    );

    redis.restart().await.unwrap();
    for url in [&url_a, &url_b] {
        let took = wait_mode(url, "shared", Duration::from_secs(15)).await;
        eprintln!("{url} shared again after {took:?}");
    }
    wait_hourly(&stack, &told, &[&a, &b, &ingest]).await;
}

/// Fail-closed that is closed, under concurrent load: three gateways on
/// one Redis see one another, Redis is SIGKILLed, and long streams are
/// opened on all three at once, then on one of them again after it was
/// restarted during the outage. The streams open at any moment, counted
/// by the client, never pass the tenant's cap of 6: each gateway holds at
/// most 6 ÷ 3, the restarted one too (it divides by the most gateways it
/// ever saw, kept beside its outbox; `GATEWAY_EXPECTED_PEERS=1` here, so
/// nothing else protects the cap).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_redis_three_gateways_and_a_restarted_one_never_pass_a_concurrency_cap() {
    let mut redis = PrivateRedis::start().await.unwrap();
    let stack = TestStack::new("gwclosed").await;
    const KEY: &str = "sk-test-closed-0001";
    const CAP: usize = 6;
    let limits = TenantLimits {
        max_concurrency: Some(CAP as i32),
        ..Default::default()
    };
    seed_tenant(&stack, "closed", KEY, limits).await;
    let settings = [
        ("REDIS_URL", redis.url()),
        ("GATEWAY_EXPECTED_PEERS", "1".to_owned()),
    ];
    let mut gateways = Vec::new();
    for id in ["gw-a", "gw-b", "gw-c"] {
        gateways.push(start_gateway_named(&stack, id, 1, &settings).await);
    }
    for (_, url) in &gateways {
        wait_peers(url, 3).await;
    }
    let client = reqwest::Client::new();
    let send = |url: &str, body: Value| {
        client
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&body)
            .send()
    };
    // A long answer (500+ tokens, ~10 s in real time) for a prompt as
    // long as this one's.
    let res = send(&gateways[0].1, chat("llama-3.1-70b", "hold 00", 5))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let prompt_tokens = usage(&res.json().await.unwrap()).0;
    let seed = tests::engine::seed_for_long_answer(u64::try_from(prompt_tokens).unwrap(), 500);
    let long = |n: usize| {
        let mut body = chat("llama-3.1-70b", &format!("hold {n:02}"), 4000);
        body["seed"] = json!(seed);
        body["stream"] = json!(true);
        body
    };
    // Opens `n` long streams at once on `urls` in turn; keeps those that
    // started (their first chunk arrived), counts the refusals.
    let open = |urls: Vec<String>, n: usize, from: usize| {
        let send = &send;
        let long = &long;
        async move {
            let tries = (0..n).map(|i| {
                let url = urls[i % urls.len()].clone();
                async move {
                    let mut res = send(&url, long(from + i)).await.unwrap();
                    match res.status().as_u16() {
                        200 => {
                            assert!(res.chunk().await.unwrap().is_some(), "the stream started");
                            Some((url, res))
                        }
                        429 => None,
                        s => panic!("status {s} without Redis: {}", res.text().await.unwrap()),
                    }
                }
            });
            futures_util::future::join_all(tries)
                .await
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
        }
    };

    redis.kill9().await;
    for (_, url) in &gateways {
        wait_mode(url, "local", Duration::from_secs(10)).await;
    }
    let urls: Vec<String> = gateways.iter().map(|(_, u)| u.clone()).collect();
    let mut held = open(urls.clone(), 30, 1).await;
    let per = |held: &[(String, reqwest::Response)], url: &str| {
        held.iter().filter(|(u, _)| u == url).count()
    };
    let by_gateway: Vec<usize> = urls.iter().map(|u| per(&held, u)).collect();
    eprintln!("open at once without Redis: {} {by_gateway:?}", held.len());
    assert!(
        held.len() <= CAP,
        "{} streams open, cap {CAP}: {by_gateway:?}",
        held.len()
    );
    assert!(
        by_gateway.iter().all(|&n| n == CAP / 3),
        "each gateway holds its third: {by_gateway:?}"
    );

    // gw-a restarts while Redis is still down: its streams end with it.
    let url_a = urls[0].clone();
    let a = &mut gateways[0].0;
    a.kill9().await;
    held.retain(|(u, _)| *u != url_a);
    a.restart().unwrap_or_else(|e| panic!("{e}"));
    wait_healthy(&format!("{url_a}/healthz"), a, Duration::from_secs(60)).await;
    wait_mode(&url_a, "local", Duration::from_secs(10)).await;
    let again = open(vec![url_a.clone()], 12, 100).await;
    let on_a = again.len();
    held.extend(again);
    eprintln!("after gw-a's restart: {} open, {on_a} on gw-a", held.len());
    assert!(
        on_a <= CAP / 3,
        "the restarted gateway holds {on_a}, its third is {}",
        CAP / 3
    );
    assert!(held.len() <= CAP, "{} streams open, cap {CAP}", held.len());
    assert!(
        metrics(&url_a)
            .await
            .lines()
            .any(|l| l == "gateway_peers_fail_closed 3"),
        "the restarted gateway divides by the 3 it saw before"
    );
    drop(held);
}

/// A Redis that stalls (`DEBUG SLEEP 3`) under traffic on two gateways:
/// no request waits for it (a Redis call may take 250 ms; the bound is 1 s)
/// before the gateway counts Redis unreachable and goes local, answers
/// keep coming during the stall, no answer is a 5xx, both gateways are
/// shared again after it, and every answer is billed once with the tokens
/// its client was told.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_redis_slows_no_answer_and_bills_each_once() {
    let redis = PrivateRedis::start().await.unwrap();
    let stack = TestStack::new("gwstall").await;
    const KEY: &str = "sk-test-stall-0001";
    let limits = TenantLimits {
        rpm: Some(100_000),
        tpm: Some(100_000_000),
        max_concurrency: Some(8),
        ..Default::default()
    };
    seed_tenant(&stack, "stall", KEY, limits).await;
    let (a, url_a) = gateway(&stack, "gw-a", 0, Some(&redis.url())).await;
    let (b, url_b) = gateway(&stack, "gw-b", 0, Some(&redis.url())).await;
    let ingest = start_ingest(&stack);
    for url in [&url_a, &url_b] {
        wait_mode(url, "shared", Duration::from_secs(10)).await;
    }
    let began = Instant::now();
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let urls = [url_a.clone(), url_b.clone()];
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                // (sent at, took, status, what the client was told)
                let mut seen = Vec::new();
                let mut n = 0;
                while began.elapsed() < Duration::from_secs(9) {
                    let sent = began.elapsed();
                    let res = client
                        .post(format!("{}/v1/chat/completions", urls[n % 2]))
                        .bearer_auth(KEY)
                        .json(&chat("llama-3.1-8b", &format!("stall {c} {n}"), 3))
                        .send()
                        .await
                        .unwrap();
                    let status = res.status().as_u16();
                    let told = if status == 200 {
                        Some(usage(&res.json().await.unwrap()))
                    } else {
                        None
                    };
                    seen.push((sent, began.elapsed() - sent, status, told));
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                seen
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stalled = began.elapsed();
    redis.stall(3).await.unwrap();
    let resumed = began.elapsed();
    let mut told = Told::new();
    let (mut during, mut slowest, mut all) = (0, Duration::ZERO, 0);
    for c in clients {
        for (sent, took, status, usage) in c.await.unwrap() {
            all += 1;
            assert!(
                status == 200 || status == 429,
                "status {status} during a stall"
            );
            slowest = slowest.max(took);
            if let Some(u) = usage {
                add(&mut told, "stall", u);
                if sent > stalled + Duration::from_millis(500) && sent + took < resumed {
                    during += 1;
                }
            }
        }
    }
    eprintln!(
        "stall {stalled:?}..{resumed:?}: {all} requests, {during} answered inside the stall, slowest {slowest:?}"
    );
    assert!(
        during >= 20,
        "answers kept coming during the stall: {during}"
    );
    assert!(
        slowest < Duration::from_millis(1_000),
        "no answer waits for a stalled Redis: slowest {slowest:?}"
    );
    for url in [&url_a, &url_b] {
        wait_mode(url, "shared", Duration::from_secs(15)).await;
    }
    wait_hourly(&stack, &told, &[&a, &b, &ingest]).await;
}
