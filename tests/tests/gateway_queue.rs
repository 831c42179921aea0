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
    let send = |b: Value| client.post(&chat).bearer_auth(FLOOD).json(&b).send();

    // Fill the 8B replica's KV until a request waits its whole budget.
    let mut held = Vec::new();
    let mut timed_out = None;
    for i in 0..40 {
        let started = Instant::now();
        let res = send(long(i)).await.unwrap();
        match res.status().as_u16() {
            200 => held.push(res),
            429 => {
                timed_out = Some((res, started.elapsed()));
                break;
            }
            s => panic!(
                "unexpected {s} (a full replica queues, never 503): {}",
                res.text().await.unwrap()
            ),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (res, waited) = timed_out.expect("the replica never filled");
    assert!(held.len() >= 2, "several long requests fit first");
    assert!(
        waited >= Duration::from_millis(1_900),
        "it waited its 2 s budget first, not {waited:?}"
    );
    assert!(res.headers().contains_key("retry-after-ms"));
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["error"]["code"], "queue_timeout", "{v}");
    assert_eq!(v["error"]["type"], "queue", "{v}");

    // One more waits in line; one of the long streams ends (its client
    // leaves): the waiting one runs at once, well within its budget.
    let waiting = tokio::spawn({
        let (client, chat) = (client.clone(), chat.clone());
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
    // Its budget is 2 s: a 200 means it ran when room came, within it (a
    // request still waiting at the end of its budget is answered 429).
    let (status, took, res) = waiting.await.unwrap();
    assert_eq!(
        status,
        200,
        "not run when room came (after {took:?}): {}",
        gateway.log_tail()
    );
    held.push(res);
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
async fn a_saturated_pool_refuses_priority_one_until_it_recovers() {
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
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
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
    // /metrics says so too (at its next look, if a queued client was just
    // between two attempts).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = tests::gateway::metrics(&url).await;
        let saturated = m.lines().any(|l| l == "gateway_pool_saturated 1")
            && m.lines()
                .any(|l| l == "gateway_priority_rate_percent{priority=\"1\"} 0");
        if saturated {
            break;
        }
        assert!(Instant::now() < deadline, "{m}");
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
