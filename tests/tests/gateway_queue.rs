#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! `GATEWAY_QUEUE=on`: a request the simulated replica cannot admit for its
//! class waits in the model's fair queue instead of getting 503 — it runs
//! as soon as a request ending frees the room, or gets 429 `queue_timeout`
//! after its tenant's wait budget; nothing that did not run is billed.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::gateway::{seed_tenant, start_gateway_with, start_ingest, wait_for_log, TenantLimits};
use tests::TestStack;

const FLOOD: &str = "sk-test-queue-flood";

/// Per-key limits far above what a test sends.
fn generous() -> TenantLimits {
    TenantLimits {
        rpm: Some(100_000),
        tpm: Some(100_000_000),
        ..Default::default()
    }
}

fn long(i: usize) -> Value {
    json!({
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": format!("flood {i}:{}", " hello".repeat(100_000))}],
        "max_tokens": 30_000,
        "stream": true,
    })
}

/// Sends long streams as the flood tenant 300 ms apart, holding each one
/// answered, until one is refused: it must be 429 `queue_timeout` (a full
/// model queues, never 503) after waiting its `budget`. The streams held.
async fn flood_until_one_times_out(
    client: &reqwest::Client,
    chat: &str,
    budget: Duration,
) -> Vec<reqwest::Response> {
    let mut held = Vec::new();
    for i in 0..40 {
        let started = Instant::now();
        let res = client
            .post(chat)
            .bearer_auth(FLOOD)
            .json(&long(i))
            .send()
            .await
            .unwrap();
        match res.status().as_u16() {
            200 => held.push(res),
            429 => {
                let waited = started.elapsed();
                assert!(held.len() >= 2, "several long requests fit first");
                assert!(
                    waited >= budget - Duration::from_millis(100),
                    "it waited its {budget:?} budget first, not {waited:?}"
                );
                assert!(res.headers().contains_key("retry-after-ms"));
                let v: Value = res.json().await.unwrap();
                assert_eq!(v["error"]["code"], "queue_timeout", "{v}");
                assert_eq!(v["error"]["type"], "queue", "{v}");
                return held;
            }
            s => panic!(
                "unexpected {s} (a full model queues, never 503): {}",
                res.text().await.unwrap()
            ),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("the model never filled")
}

/// One more long stream waits in line; the last held one ends (its client
/// leaves): the waiting one runs when room comes, within its budget (one
/// still waiting at the end of its budget is answered 429), and joins
/// `held`. It is sent once the ladder has seen the queue empty again: a
/// queue that held at two looks saturates the pool, and priority 1 is
/// refused at the door until then.
async fn the_next_in_line_runs_when_room_comes(
    client: &reqwest::Client,
    chat: &str,
    url: &str,
    held: &mut Vec<reqwest::Response>,
    gateway: &tests::Service,
) {
    let recovered = Instant::now();
    while !tests::gateway::metrics(url)
        .await
        .lines()
        .any(|l| l == "gateway_pool_saturated{model=\"llama-3.1-8b\"} 0")
    {
        assert!(
            recovered.elapsed() < Duration::from_secs(10),
            "the pool stayed saturated with its queue empty"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let waiting = tokio::spawn({
        let (client, chat) = (client.clone(), chat.to_owned());
        async move {
            let started = Instant::now();
            let res = client
                .post(&chat)
                .bearer_auth(FLOOD)
                .json(&long(99))
                .send()
                .await
                .unwrap();
            (res.status().as_u16(), started.elapsed(), res)
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(held.pop());
    let (status, took, res) = waiting.await.unwrap();
    assert_eq!(
        status,
        200,
        "not run when room came (after {took:?}): {}",
        gateway.log_tail()
    );
    held.push(res);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_replica_queues_and_a_freed_one_takes_the_next_in_line() {
    let stack = TestStack::new("gwqueue").await;
    let limits = generous();
    seed_tenant(&stack, "flood", FLOOD, limits).await;
    // Best effort (priority 1, admitted below 60% KV), no objectives: a
    // wait budget of 2 s.
    sqlx::query("UPDATE tenants SET priority = 1 WHERE tenant_id = 'flood'")
        .execute(&stack.pool)
        .await
        .unwrap();
    let (gateway, url) = start_gateway_with(&stack, 1, &[("GATEWAY_QUEUE", "on".into())]).await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");

    // Fill the 8B replica's KV until a request waits its whole budget.
    let mut held = flood_until_one_times_out(&client, &chat, Duration::from_secs(2)).await;
    // One more waits in line; one of the long streams ends (its client
    // leaves): the waiting one runs at once, well within its budget.
    the_next_in_line_runs_when_room_comes(&client, &chat, &url, &mut held, &gateway).await;
    let m = tests::gateway::metrics(&url).await;
    assert!(
        m.lines().any(|l| l.starts_with("gateway_rejections_total{")
            && l.contains("reason=\"queue_timeout\"")),
        "{m}"
    );
    // Billed: every stream that ran (as cancelled when its client left,
    // or as stopped if it reached its natural end first on a slow
    // machine), never the one that timed out in the queue.
    let ran = held.len() + 1;
    drop(held);
    let rows = wait_for_log(&stack, "flood", ran, &[&gateway, &ingest]).await;
    assert_eq!(rows.len(), ran, "{rows:?}");
    assert!(
        rows.values().all(|r| r.0 == "cancelled" || r.0 == "stop"),
        "{rows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_pool_refuses_priority_one_on_it_alone_until_it_recovers() {
    let stack = TestStack::new("gwladder").await;
    let limits = generous();
    const STANDARD: &str = "sk-test-ladder-std";
    const LOW: &str = "sk-test-ladder-p1";
    seed_tenant(&stack, "ladder-std", STANDARD, limits).await;
    seed_tenant(&stack, "ladder-p1", LOW, limits).await;
    // A standard tenant (admitted below 85% of KV) and a priority-1 one
    // with a requests/s bucket (the ladder scales that bucket).
    for sql in [
        "UPDATE tenants SET priority = 3 WHERE tenant_id = 'ladder-std'",
        "UPDATE tenants SET priority = 1, requests_per_second = 50, burst = 50
             WHERE tenant_id = 'ladder-p1'",
    ] {
        sqlx::query(sql).execute(&stack.pool).await.unwrap();
    }
    let (gateway, url) = start_gateway_with(&stack, 1, &[("GATEWAY_QUEUE", "on".into())]).await;
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    let small = || json!({"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let p1 = client
        .post(&chat)
        .bearer_auth(LOW)
        .json(&small())
        .send()
        .await
        .unwrap();
    assert_eq!(p1.status(), 200, "not saturated yet");

    // The standard flood fills the replica past 85% and queues behind it.
    let mut held = Vec::new();
    for i in 0..40 {
        let started = Instant::now();
        let res = client
            .post(&chat)
            .bearer_auth(STANDARD)
            .json(&long(i))
            .send()
            .await
            .unwrap();
        if res.status() != 200 {
            assert_eq!(res.status(), 429, "{}", res.text().await.unwrap());
            assert!(started.elapsed() >= Duration::from_millis(1_900));
            break;
        }
        held.push(res);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Four clients keep standard requests waiting behind it (each sent
    // again when its wait budget ends), so the queue does not shrink.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waiting: Vec<_> = (0..4)
        .map(|i| {
            let (client, chat, stop) = (client.clone(), chat.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let res = client
                        .post(&chat)
                        .bearer_auth(STANDARD)
                        .json(&long(100 + i))
                        .send()
                        .await;
                    if let Ok(res) = res {
                        if res.status() == 200 {
                            return Some(res);
                        }
                    }
                }
                None
            })
        })
        .collect();
    // Within a tick or two the ladder sees the pool saturated: priority 1
    // is refused at once (429 `degraded`, not after waiting in the queue),
    // and says so on /metrics.
    // Deadlines are generous: on a loaded machine (Redis itself timing
    // out) one probe can take over a second to be answered.
    let shows_saturated = |m: &str| {
        m.lines()
            .any(|l| l == "gateway_pool_saturated{model=\"llama-3.1-8b\"} 1")
            && m.lines().any(|l| {
                l == "gateway_priority_rate_percent{model=\"llama-3.1-8b\",priority=\"1\"} 0"
            })
    };
    let mut metrics_said_so = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        // /metrics is read beside every probe: on a loaded machine the
        // flood's streams may end and the pool recover soon after the
        // refusal, before a read that waited for it.
        metrics_said_so |= shows_saturated(&tests::gateway::metrics(&url).await);
        // A probe the replica admits may wait behind the long prefills:
        // give up on it (it is cancelled) and probe again.
        let probe = client
            .post(&chat)
            .bearer_auth(LOW)
            .json(&small())
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if let Ok(res) = probe {
            if res.status() == 429 {
                let v: Value = res.json().await.unwrap();
                if v["error"]["type"] == "degraded" {
                    break v;
                }
                assert_eq!(v["error"]["code"], "queue_timeout", "{v}");
            }
        }
        if Instant::now() >= deadline {
            let m = tests::gateway::metrics(&url).await;
            let ladder: Vec<&str> = m
                .lines()
                .filter(|l| {
                    l.starts_with("gateway_pool_saturated")
                        || l.starts_with("gateway_priority_rate_percent")
                        || l.starts_with("gateway_queue_depth")
                })
                .collect();
            panic!("never refused: {ladder:?}\n{}", gateway.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("saturated"),
        "{refused}"
    );
    // Only that pool: priority 1 is still answered on another model, and
    // refused again on the saturated one right after.
    let other = client
        .post(&chat)
        .bearer_auth(LOW)
        .json(&json!({"model": "llama-3.1-70b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        other.status(),
        200,
        "another pool: {}",
        other.text().await.unwrap()
    );
    let again = client
        .post(&chat)
        .bearer_auth(LOW)
        .json(&small())
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .unwrap();
    assert_eq!(
        again.status(),
        429,
        "the saturated pool still refuses priority 1"
    );
    // /metrics says so too (beside a probe, or at its next look if a
    // queued client was just between two attempts).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !metrics_said_so {
        let m = tests::gateway::metrics(&url).await;
        metrics_said_so = shows_saturated(&m);
        assert!(metrics_said_so || Instant::now() < deadline, "{m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The flood's clients leave and the queue drains: priority 1 is back.
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(held);
    for w in waiting {
        drop(w.await);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let res = client
            .post(&chat)
            .bearer_auth(LOW)
            .json(&small())
            .send()
            .await
            .unwrap();
        if res.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "priority 1 never came back");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The same with the model behind an HTTP upstream (the `engine` binary
/// standing in for vLLM): its refusals for the class — the gateway's last
/// KV poll, or the engine's own 503 — wait in the fair queue instead of
/// reaching the client, the one in line runs when room comes, and a
/// request the upstream refused leaves the gateways' shared GPU-time
/// ledger at once (before, every refusal stayed a member for good and took
/// a share of each later busy period that nobody was billed for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_http_upstream_queues_too_and_its_refusals_leave_the_shared_ledger() {
    let stack = TestStack::new("gwqueuehttp").await;
    seed_tenant(&stack, "flood", FLOOD, generous()).await;
    // Best effort, with a 4 s TTFT objective: a 4 s wait budget.
    sqlx::query(
        "UPDATE tenants SET priority = 1, slo_ttft_p95_ms = 4000 WHERE tenant_id = 'flood'",
    )
    .execute(&stack.pool)
    .await
    .unwrap();
    let secret = tests::engine::random_secret();
    let (engine, engine_url) = tests::engine::start_engine(stack.dir.path(), 1, &secret).await;
    let upstreams = tests::engine::write_upstreams(
        &stack.dir.path().join("upstreams.yaml"),
        &[tests::engine::vllm_entry(
            "llama-3.1-8b",
            &engine_url,
            131_072,
            "http-8b",
            200,
            "",
        )],
    );
    let (gateway, url) = start_gateway_with(
        &stack,
        1,
        &[
            ("GATEWAY_QUEUE", "on".into()),
            ("GATEWAY_UPSTREAMS", upstreams),
            (tests::engine::SECRET_ENV, secret),
        ],
    )
    .await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    let send = |b: Value| client.post(&chat).bearer_auth(FLOOD).json(&b).send();

    let mut held = flood_until_one_times_out(&client, &chat, Duration::from_secs(4)).await;
    the_next_in_line_runs_when_room_comes(&client, &chat, &url, &mut held, &gateway).await;
    let ran = held.len() + 1;
    drop(held);
    let rows = wait_for_log(&stack, "flood", ran, &[&gateway, &ingest, &engine]).await;
    assert_eq!(rows.len(), ran, "{rows:?}");

    // Every request has left the shared ledger: the ledger's whole equals
    // what it handed to billed requests plus what refused ones held, and
    // stays put now that nothing runs. A refusal left in it would keep the
    // replica "busy" (its share growing, unbilled) for good.
    let figure = |m: &str, name: &str| -> rust_decimal::Decimal {
        m.lines()
            .find(|l| l.starts_with(&format!("{name}{{")) && l.contains("http-8b"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing: {m}"))
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let m = tests::gateway::metrics(&url).await;
    let busy = figure(&m, "gateway_upstream_shared_busy_gpu_seconds_total");
    let attributed = figure(&m, "gateway_upstream_shared_attributed_gpu_seconds_total");
    let reaped = figure(&m, "gateway_upstream_shared_reaped_gpu_seconds_total");
    assert_eq!(busy, attributed + reaped, "{m}");
    let billed: rust_decimal::Decimal =
        sqlx::query_scalar("SELECT sum(gpu_seconds) FROM request_log WHERE tenant_id = 'flood'")
            .fetch_one(&stack.pool)
            .await
            .unwrap();
    assert_eq!(
        billed, attributed,
        "what the ledger handed out is what was billed"
    );
    // One more short request after a pause: it alone is in the ledger
    // while it runs, so the busy time it adds is its own GPU time.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let res = send(json!({
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": "after the flood"}],
        "max_tokens": 20,
    }))
    .await
    .unwrap();
    assert_eq!(res.status(), 200);
    res.text().await.unwrap();
    let rows = wait_for_log(&stack, "flood", ran + 1, &[&gateway, &ingest]).await;
    assert_eq!(rows.len(), ran + 1);
    let m = tests::gateway::metrics(&url).await;
    let billed_after: rust_decimal::Decimal =
        sqlx::query_scalar("SELECT sum(gpu_seconds) FROM request_log WHERE tenant_id = 'flood'")
            .fetch_one(&stack.pool)
            .await
            .unwrap();
    assert_eq!(
        figure(&m, "gateway_upstream_shared_busy_gpu_seconds_total") - busy,
        billed_after - billed,
        "the pause was not busy time, and the last request had the replica to itself: {m}"
    );
}
