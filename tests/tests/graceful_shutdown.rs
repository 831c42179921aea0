//! Every long-running binary stops cleanly on SIGTERM — what systemd,
//! Kubernetes and `kill` send — not only on Ctrl-C: it exits 0, and the
//! HTTP services finish a response already in flight first.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::collections::HashMap;
use std::time::Duration;

use tests::process::{free_port, wait_healthy};
use tests::stack::fresh_database;
use tests::Service;

async fn assert_stops_on_sigterm(mut svc: Service) {
    let status = svc
        .terminate(Duration::from_secs(15))
        .await
        .expect("process status");
    assert!(
        status.success(),
        "{} did not exit cleanly on SIGTERM ({status}):\n{}",
        svc.name(),
        svc.log_tail()
    );
}

#[tokio::test]
async fn engine_finishes_a_stream_in_flight_then_exits_0_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let secret = tests::engine::random_secret();
    let (svc, url) = tests::engine::start_engine(dir.path(), 1, &secret).await;
    // A real-time stream of ~60 tokens: still running when SIGTERM comes.
    let mut res = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .header(
            tests::engine::HEADER,
            tests::engine::signed(&secret, "acme"),
        )
        .json(&serde_json::json!({
            "model": "llama-3.1-8b",
            "messages": [{"role": "user", "content": "tell me a long story"}],
            "max_tokens": 60,
            "stream": true,
        }))
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success());
    let first = res.chunk().await.unwrap().expect("a first chunk");
    assert!(!first.is_empty());
    svc.signal_term();
    let mut rest = String::new();
    while let Some(chunk) = res.chunk().await.unwrap() {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(rest.contains("[DONE]"), "the stream was cut: {rest}");
    assert_stops_on_sigterm(svc).await;
}

#[tokio::test]
async fn billing_api_exits_0_on_sigterm() {
    let fresh_db = fresh_database("sigterm_billing").await;
    let url = fresh_db.url.clone();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let env = HashMap::from([
        ("DATABASE_URL".to_owned(), url),
        ("BILLING_ADDR".to_owned(), format!("127.0.0.1:{port}")),
    ]);
    let mut svc = Service::start("billing", "billing-api", &[], env, dir.path())
        .unwrap_or_else(|e| panic!("{e}"));
    wait_healthy(
        &format!("http://127.0.0.1:{port}/healthz"),
        &mut svc,
        Duration::from_secs(60),
    )
    .await;
    assert_stops_on_sigterm(svc).await;
}

#[tokio::test]
async fn rollup_exits_0_on_sigterm() {
    let fresh_db = fresh_database("sigterm_rollup").await;
    let url = fresh_db.url.clone();
    let dir = tempfile::tempdir().unwrap();
    let env = HashMap::from([
        ("DATABASE_URL".to_owned(), url),
        ("ROLLUP_REQUIRE_ARCHIVE".to_owned(), "false".to_owned()),
    ]);
    let svc = Service::start("rollup", "rollup", &["run"], env, dir.path())
        .unwrap_or_else(|e| panic!("{e}"));
    // Let it connect and run its first tick.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_stops_on_sigterm(svc).await;
}

/// Behind a load balancer: on SIGTERM the gateway fails `/readyz` at once
/// while it is still alive (`/healthz`) and still answering requests for
/// its drain delay, then stops accepting and exits 0 with every answered
/// request's event relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_fails_readiness_first_then_drains_and_exits_0() {
    let stack = tests::TestStack::new("readyz").await;
    tests::gateway::seed_tenant(
        &stack,
        "ready-co",
        "sk-test-ready-co-0001",
        Default::default(),
    )
    .await;
    let (mut gateway, url) = tests::gateway::start_gateway_with(
        &stack,
        0,
        &[("GATEWAY_DRAIN_DELAY_MS", "2000".to_owned())],
    )
    .await;
    let client = reqwest::Client::new();
    let ready = client.get(format!("{url}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let chat = || {
        client
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth("sk-test-ready-co-0001")
            .json(&serde_json::json!({
                "model": "llama-3.1-8b",
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 8
            }))
            .send()
    };
    assert_eq!(chat().await.unwrap().status(), 200);

    gateway.signal_term();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let draining = client.get(format!("{url}/readyz")).send().await.unwrap();
    assert_eq!(draining.status(), 503, "readiness fails first");
    let body: serde_json::Value = draining.json().await.unwrap();
    assert_eq!(body["error"]["code"], "draining", "{body}");
    let alive = client.get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(alive.status(), 200, "still alive while draining");
    let late = chat().await.unwrap();
    assert_eq!(late.status(), 200, "still answering during the drain delay");

    let status = gateway.wait_exit(Duration::from_secs(30)).await;
    assert!(status.is_some_and(|s| s.success()), "exit: {status:?}");
    assert!(
        client.get(format!("{url}/healthz")).send().await.is_err(),
        "not accepting after it exited"
    );
}
