//! The engine's HTTP server takes the tenant and class only from a signed
//! `x-meterline-identity`: a chat completion without a valid one is 401
//! `invalid_identity` in OpenAI's shape and starts nothing; the read-only
//! endpoints stay open; an HTTP upstream configured with the same secret is
//! served as the tenant it signed for.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use admission::upstream::http::HttpUpstream;
use admission::upstream::RemoteModel;
use engine::identity::{self, Secret, Signer, LIFETIME_SECS, SKEW_SECS};
use engine::{CompletionRequest, ModelProfile, ServiceClass, Simulator};
use reqwest::StatusCode;
use serde_json::{json, Value};

const SECRET: &str = "identity-test-secret-0123456789abcdef";
/// The env var an upstream reads the secret from; only this file sets it.
const SECRET_ENV: &str = "ENGINE_TEST_IDENTITY_SECRET";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn signer(secret: &str) -> Signer {
    Signer::new(Secret::new(secret).unwrap())
}

async fn start() -> (String, Arc<Simulator>) {
    let sim = Arc::new(Simulator::new(ModelProfile::reference(), 0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serving::serve(
        listener,
        engine::server::app(sim.clone(), Secret::new(SECRET).unwrap()),
        serving::HttpSettings::default(),
        std::future::pending(),
    ));
    (format!("http://{addr}"), sim)
}

async fn chat(url: &str, identity: Option<String>) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-tenant-id", "acme")
        .header("x-service-class", "reserved")
        .json(&json!({"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}));
    if let Some(identity) = identity {
        req = req.header(identity::HEADER, identity);
    }
    req.send().await.unwrap()
}

/// The 401's message, after checking its shape.
async fn refused(res: reqwest::Response) -> String {
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(body["error"]["code"], "invalid_identity", "{body}");
    assert!(body["error"]["param"].is_null(), "{body}");
    body["error"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_chat_completion_without_a_valid_identity_is_401_and_starts_nothing() {
    let (url, sim) = start().await;
    let t = now();
    let good = signer(SECRET);
    let tampered = {
        let token = good.sign("acme", ServiceClass::BestEffort, t);
        token.replace(".best-effort.", ".reserved.")
    };
    let cases = [
        (None, "x-meterline-identity is missing"),
        (
            Some(signer(&SECRET.replace('i', "j")).sign("acme", ServiceClass::Standard, t)),
            "x-meterline-identity has a bad signature",
        ),
        (
            Some(good.sign_until("acme", ServiceClass::Standard, t - SKEW_SECS - 10)),
            "x-meterline-identity has expired",
        ),
        (
            Some(good.sign("acme", ServiceClass::Standard, t + LIFETIME_SECS)),
            "x-meterline-identity expires too far in the future",
        ),
        (Some(tampered), "x-meterline-identity has a bad signature"),
        (
            Some("acme".to_owned()),
            "x-meterline-identity is malformed: expected five dot-separated fields",
        ),
    ];
    for (identity, expected) in cases {
        let message = refused(chat(&url, identity).await).await;
        assert_eq!(message, expected);
    }
    let touched = sim
        .snapshots()
        .iter()
        .any(|s| s.prompt_tokens > 0 || !s.tenants.is_empty() || s.stats.rejected > 0);
    assert!(!touched, "nothing reached the simulator");

    for path in ["/v1/models", "/metrics", "/health"] {
        let res = reqwest::get(format!("{url}{path}")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
    }
    let res = chat(&url, Some(good.sign("acme", ServiceClass::Standard, t))).await;
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn an_http_upstream_with_the_secret_is_served_as_the_tenant_it_signed_for() {
    let (url, _sim) = start().await;
    std::env::set_var(SECRET_ENV, SECRET);
    let config: RemoteModel = serde_norway::from_str(&format!(
        "model: llama-3.1-8b\nurl: {url}\ngpus: 1\nmax_context: 131072\nkv_poll_ms: 0\nidentity_secret_env: {SECRET_ENV}\n"
    ))
    .unwrap();
    let upstream = HttpUpstream::new(config).unwrap();
    let req = CompletionRequest {
        model: "llama-3.1-8b".into(),
        prompt: "hello".into(),
        max_tokens: Some(4),
        tenant_id: "eu.acme".into(),
        class: ServiceClass::Reserved,
        ..CompletionRequest::default()
    };
    let done = upstream
        .start(&req, false)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(done.completion_tokens, 4);
    let metrics = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("tenant=\"eu.acme\""),
        "the engine billed the signed tenant:\n{metrics}"
    );
}
