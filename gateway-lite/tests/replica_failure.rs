//! A simulated model on a pool of two replicas behind the gateway, one of
//! which dies mid-traffic: its clients get an error (502 in OpenAI's shape,
//! or an error chunk mid-stream), never a silent regeneration, and every
//! request still has exactly one usage event — the failed ones billed for
//! the GPU time they used on the dead replica.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use admission::upstream::Upstreams;
use engine::{ModelProfile, Simulator};
use gateway_lite::outbox::Outbox;
use gateway_lite::service::{app, AppState};
use gateway_lite::tenants::{Caller, Registry};
use rust_decimal::Decimal;
use serde_json::json;
use usage_contract::{FinishReason, UsageEvent};

const KEY: &str = "sk-replica-failure-test-0001";
const MODEL: &str = "llama-3.1-8b";

#[tokio::test]
async fn a_dead_replicas_requests_get_errors_and_are_billed_for_what_they_used() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::default();
    registry.insert(KEY, Caller::unlimited("acme-corp", "key_acme", 3));
    let outbox = Outbox::open(&dir.path().join("outbox")).unwrap();
    let mut profiles = ModelProfile::reference();
    ModelProfile::set_replicas(&mut profiles, &format!("{MODEL}=2")).unwrap();
    // Real time: the requests are mid-answer when the replica dies.
    let simulator = Arc::new(Simulator::new(profiles, 1));
    let state = AppState {
        speedup: 1,
        ..AppState::alone(
            "gw-test",
            registry,
            Arc::new(Upstreams::new(simulator.clone(), Vec::new()).unwrap()),
            outbox.clone(),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/v1/chat/completions",
        listener.local_addr().unwrap()
    );
    tokio::spawn(serving::serve(
        listener,
        app(state, None),
        serving::HttpSettings::default(),
        std::future::pending(),
    ));

    let client = reqwest::Client::new();
    let mut clients = Vec::new();
    for n in 0..12u64 {
        let stream = n % 2 == 0;
        let req = client.post(&url).bearer_auth(KEY).json(&json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": format!("request {n}: tell me about replicas")}],
            "max_tokens": 400,
            "seed": n,
            "stream": stream,
        }));
        clients.push(tokio::spawn(async move {
            let res = req.send().await.unwrap();
            let status = res.status();
            let id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
            let body = res.text().await.unwrap();
            let failed = if stream {
                assert_eq!(status, 200);
                body.contains("\"error\"")
            } else {
                status != 200
            };
            if failed && !stream {
                assert_eq!(status, 502, "{body}");
            }
            if failed {
                assert!(body.contains("replica_failed"), "{body}");
            }
            (id, failed)
        }));
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    // r1, not r0: r0 is also what the gateway stamps when the engine does
    // not name the replica, so only the engine's own account can say r1.
    let dead = format!("{MODEL}-r1");
    assert!(simulator.fail_replica(&dead));
    let mut told = HashMap::new();
    for c in clients {
        let (id, failed) = c.await.unwrap();
        told.insert(id, failed);
    }

    let events: Vec<UsageEvent> = outbox
        .peek(1_000)
        .unwrap()
        .iter()
        .map(|e| usage_contract::decode(&e.payload, chrono::Utc::now()).unwrap())
        .collect();
    let ids: HashSet<String> = events.iter().map(|e| e.request_id.to_string()).collect();
    assert_eq!(events.len(), 12, "one event per request");
    assert_eq!(ids.len(), 12);
    let failed = told.values().filter(|f| **f).count();
    assert!(failed > 0 && failed < 12, "{failed} of 12 failed");
    for e in &events {
        let was_failed = told[&e.request_id.to_string()];
        if was_failed {
            assert_eq!(e.finish_reason, FinishReason::Error);
            assert_eq!(e.replica_id, dead);
            assert!(e.gpu_seconds > Decimal::ZERO, "billed for what it used");
        } else {
            assert_ne!(e.finish_reason, FinishReason::Error);
            assert_eq!(e.replica_id, format!("{MODEL}-r0"));
        }
    }
}
