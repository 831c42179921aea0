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
    let limits = TenantLimits {
        rpm: Some(100_000),
        tpm: Some(100_000_000),
        ..Default::default()
    };
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
    let (status, took, res) = waiting.await.unwrap();
    assert_eq!(status, 200, "{}", gateway.log_tail());
    assert!(
        took < Duration::from_millis(1_900),
        "ran when room came, after {took:?}"
    );
    held.push(res);
    let m = tests::gateway::metrics(&url).await;
    assert!(
        m.lines().any(|l| l.starts_with("gateway_rejections_total{")
            && l.contains("reason=\"queue_timeout\"")),
        "{m}"
    );
    // Billed: every stream that ran (as cancelled when its client left),
    // never the one that timed out in the queue.
    let ran = held.len() + 1;
    drop(held);
    let rows = wait_for_log(&stack, "flood", ran, &[&gateway, &ingest]).await;
    assert!(rows.values().all(|r| r.0 == "cancelled"), "{rows:?}");
}
