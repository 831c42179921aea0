#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! `Idempotency-Key`: a retry gets the same answer and is billed once; a
//! duplicate while the first is running gets 409; the key with another body
//! 422; answers survive a gateway crash.

use std::time::Duration;

use serde_json::{json, Value};
use tests::gateway::{seed_tenant, start_gateway, start_ingest, wait_for_log};
use tests::process::wait_healthy;
use tests::TestStack;

const KEY: &str = "sk-test-idem-0001";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_with_the_same_key_is_answered_once_and_billed_once() {
    let stack = TestStack::new("gwidem").await;
    seed_tenant(&stack, "idem", KEY, Default::default()).await;
    let (mut gateway, url) = start_gateway(&stack, 1).await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    let body = json!({
        "model": "llama-3.1-70b",
        "messages": [{"role": "user", "content": "an answer worth keeping"}],
        "max_tokens": 100,
        "seed": 3,
    });
    let send = |key: &'static str, b: Value| {
        client
            .post(&chat)
            .bearer_auth(KEY)
            .header("idempotency-key", key)
            .json(&b)
            .send()
    };

    let first = tokio::spawn(send("order-42", body.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let dup = send("order-42", body.clone()).await.unwrap();
    assert_eq!(dup.status(), 409, "a duplicate while the first runs");
    let v: Value = dup.json().await.unwrap();
    assert_eq!(v["error"]["code"], "idempotency_key_in_use", "{v}");

    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), 200);
    let first_id = first.headers()["x-request-id"].to_str().unwrap().to_owned();
    let first_body: Value = first.json().await.unwrap();

    let retry = send("order-42", body.clone()).await.unwrap();
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["x-request-id"], first_id.as_str());
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let retry_body: Value = retry.json().await.unwrap();
    assert_eq!(retry_body, first_body);

    let mut other = body.clone();
    other["seed"] = json!(4);
    let reused = send("order-42", other).await.unwrap();
    assert_eq!(reused.status(), 422);

    // Another key is another request; streaming answers replay too.
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    stream["max_tokens"] = json!(5);
    let s1 = send("order-43", stream.clone()).await.unwrap();
    assert_eq!(s1.status(), 200);
    let s1_id = s1.headers()["x-request-id"].to_str().unwrap().to_owned();
    let s1_text = s1.text().await.unwrap();
    assert!(s1_text.ends_with("data: [DONE]\n\n"), "{s1_text}");
    let s2 = send("order-43", stream).await.unwrap();
    assert_eq!(s2.headers()["x-request-id"], s1_id.as_str());
    assert_eq!(s2.text().await.unwrap(), s1_text);

    // The answers outlive the gateway: after a SIGKILL and a restart, a
    // retry is still answered from the store, not run and billed again.
    gateway.kill9().await;
    gateway.restart().unwrap_or_else(|e| panic!("{e}"));
    wait_healthy(
        &format!("{url}/healthz"),
        &mut gateway,
        Duration::from_secs(60),
    )
    .await;
    let after = reqwest::Client::new()
        .post(&chat)
        .bearer_auth(KEY)
        .header("idempotency-key", "order-42")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), 200);
    assert_eq!(after.headers()["x-request-id"], first_id.as_str());
    assert_eq!(after.json::<Value>().await.unwrap(), first_body);

    let rows = wait_for_log(&stack, "idem", 2, &[&gateway, &ingest]).await;
    assert_eq!(
        rows[&first_id].2,
        first_body["usage"]["completion_tokens"].as_i64().unwrap()
    );
    assert!(rows.contains_key(&s1_id));
    tokio::time::sleep(Duration::from_secs(1)).await;
    wait_for_log(&stack, "idem", 2, &[&gateway, &ingest]).await;
}

/// Cancels a streamed attempt under `key` after its first chunk (the claim
/// is marked failed), then retries it; returns the retry's status and body.
async fn cancel_then_retry(
    client: &reqwest::Client,
    chat: &str,
    api_key: &str,
    key: &str,
) -> (u16, String) {
    let body = json!({
        "model": "llama-3.1-70b",
        "messages": [{"role": "user", "content": format!("long work {key}")}],
        "max_tokens": 2000,
        "stream": true,
    });
    let send = || {
        client
            .post(chat)
            .bearer_auth(api_key)
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };
    let mut first = send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.chunk().await.unwrap().is_some());
    drop(first);
    // The claim stays taken (409) until Redis knows the attempt failed.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let res = send().await.unwrap();
        let status = res.status().as_u16();
        if status != 409 {
            // A retry that runs is cut short too: only its status matters.
            let text = if status == 200 {
                String::new()
            } else {
                res.text().await.unwrap()
            };
            return (status, text);
        }
        assert!(std::time::Instant::now() < deadline, "{key} stayed 409");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_above_a_fifth_of_the_minute_are_shed_before_first_attempts() {
    let stack = TestStack::new("gwretry").await;
    const STANDARD: &str = "sk-test-retry-std-0001";
    const RESERVED: &str = "sk-test-retry-res-0001";
    seed_tenant(&stack, "retry-std", STANDARD, Default::default()).await;
    seed_tenant(&stack, "retry-res", RESERVED, Default::default()).await;
    sqlx::query("UPDATE tenants SET priority = 3 WHERE tenant_id = 'retry-std'")
        .execute(&stack.pool)
        .await
        .unwrap();
    let (gateway, url) = start_gateway(&stack, 1).await;
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    // 20 first attempts.
    for n in 0..20 {
        let res = client
            .post(&chat)
            .bearer_auth(STANDARD)
            .json(&json!({
                "model": "llama-3.1-8b",
                "messages": [{"role": "user", "content": format!("first {n}")}],
                "max_tokens": 2,
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    // Each cancelled stream is one more first attempt; each retry of one
    // is a retry. Retries may be 20% of what was admitted: with 20 + k
    // first attempts and r retries, the (r+1)th passes while
    // (r+1)·100 ≤ (20 + k + r + 1)·20.
    let mut passed = 0;
    let mut shed = None;
    for k in 0..12 {
        let (status, text) = cancel_then_retry(&client, &chat, STANDARD, &format!("job-{k}")).await;
        match status {
            200 => passed += 1,
            503 => {
                let v: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(v["error"]["code"], "retry_budget_exhausted", "{v}");
                shed = Some(k);
                break;
            }
            s => panic!("retry got {s}: {text}"),
        }
    }
    let k = shed.unwrap_or_else(|| panic!("no retry shed after {passed} passed"));
    // The budget's own arithmetic: 20 first attempts + the k+1 cancelled
    // ones admitted, `passed` retries, and the next retry over 20%.
    let admitted = 20 + (k + 1) + passed;
    assert!(
        (passed + 1) * 100 > (admitted + 1) * 20,
        "shed too early: {passed} of {admitted}"
    );
    assert!(
        passed * 100 <= admitted * 20 + 100,
        "shed too late: {passed} of {admitted}"
    );
    // First attempts still run, and a reserved tenant's retry is never shed.
    let first = client
        .post(&chat)
        .bearer_auth(STANDARD)
        .json(&json!({"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "new"}], "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200, "{}", gateway.log_tail());
    for k in 0..3 {
        let (status, text) = cancel_then_retry(&client, &chat, RESERVED, &format!("res-{k}")).await;
        assert_eq!(status, 200, "a reserved retry: {text}");
    }
    let m = tests::gateway::metrics(&url).await;
    assert!(
        m.lines().any(|l| l.starts_with("gateway_rejections_total{")
            && l.contains("reason=\"retry_budget\"")
            && l.contains("retry-std")),
        "{m}"
    );
}
