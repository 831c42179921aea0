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
