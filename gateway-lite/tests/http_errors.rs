//! The gateway's HTTP edge in process, on a real socket: every error in
//! OpenAI's shape (unknown paths, wrong methods, bodies too large, rejected
//! JSON), a NUL anywhere it reads refused with 400 naming it, and the
//! `Bearer` scheme matched case-insensitively.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::sync::Arc;
use std::time::Duration;

use admission::upstream::Upstreams;
use engine::{ModelProfile, Simulator};
use gateway_lite::outbox::Outbox;
use gateway_lite::service::{app, AppState};
use gateway_lite::tenants::{Caller, Registry};
use reqwest::StatusCode;
use serde_json::{json, Value};

const KEY: &str = "sk-http-errors-test-0001";
const MODEL: &str = "llama-3.1-8b";

struct Gateway {
    url: String,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

async fn start() -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::default();
    registry.insert(KEY, Caller::unlimited("acme-corp", "key_acme", 3));
    let outbox = Outbox::open(&dir.path().join("outbox")).unwrap();
    let simulator = Arc::new(Simulator::new(ModelProfile::reference(), 0));
    let state = AppState {
        request_timeout: Duration::from_secs(60),
        ..AppState::alone(
            "gw-test",
            registry,
            Arc::new(Upstreams::new(simulator, Vec::new()).unwrap()),
            outbox,
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Served as the binary serves it: through the shared serving layer.
    tokio::spawn(serving::serve(
        listener,
        app(state, None),
        serving::HttpSettings::default(),
        std::future::pending(),
    ));
    Gateway {
        url: format!("http://{addr}"),
        client: reqwest::Client::new(),
        _dir: dir,
    }
}

/// Asserts OpenAI's error shape and returns `error`.
async fn openai_error(res: reqwest::Response, status: StatusCode) -> Value {
    assert_eq!(res.status(), status);
    assert!(
        res.headers().contains_key("x-request-id"),
        "errors carry X-Request-Id"
    );
    let body: Value = res.json().await.unwrap();
    let error = &body["error"];
    assert!(error["message"].is_string(), "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert!(
        error.get("param").is_some() && error.get("code").is_some(),
        "{body}"
    );
    error.clone()
}

impl Gateway {
    async fn chat(&self, body: &str) -> reqwest::Response {
        self.client
            .post(format!("{}/v1/chat/completions", self.url))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap()
    }
}

#[tokio::test]
async fn a_nul_in_the_body_is_a_400_naming_the_field() {
    let gw = start().await;
    let res = gw
        .chat(r#"{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "a\u0000b"}]}"#)
        .await;
    let error = openai_error(res, StatusCode::BAD_REQUEST).await;
    assert_eq!(error["param"], "messages");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("messages[0].content"),
        "{error}"
    );
    let res = gw
        .chat(r#"{"model": "llama\u0000", "messages": [{"role": "user", "content": "hi"}]}"#)
        .await;
    assert_eq!(
        openai_error(res, StatusCode::BAD_REQUEST).await["param"],
        "model"
    );
}

#[tokio::test]
async fn a_nul_in_the_query_is_a_400_naming_the_parameter() {
    let gw = start().await;
    for path in ["/v1/models?user=a%00", "/v1/chat/completions?user=%00"] {
        let res = gw
            .client
            .request(
                if path.contains("chat") {
                    reqwest::Method::POST
                } else {
                    reqwest::Method::GET
                },
                format!("{}{path}", gw.url),
            )
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap();
        let error = openai_error(res, StatusCode::BAD_REQUEST).await;
        assert_eq!(error["param"], "user", "{path}");
        assert!(
            error["message"].as_str().unwrap().contains("NUL"),
            "{error}"
        );
    }
}

#[tokio::test]
async fn a_nul_in_a_header_never_reaches_the_gateway() {
    // HTTP/1 parsing (hyper) refuses a header value holding a NUL with 400
    // before any handler runs, so an Idempotency-Key can't carry one.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gw = start().await;
    let addr = gw.url.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        format!(
            "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nIdempotency-Key: a\0b\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = vec![0; 256];
    let n = conn.read(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
}

#[tokio::test]
async fn an_idempotency_key_that_is_not_visible_ascii_is_a_400_naming_it() {
    let gw = start().await;
    let res = gw
        .client
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth(KEY)
        .header(
            "idempotency-key",
            reqwest::header::HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        )
        .json(&json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    let error = openai_error(res, StatusCode::BAD_REQUEST).await;
    assert_eq!(error["param"], "Idempotency-Key");
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let gw = start().await;
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let res = gw
            .client
            .get(format!("{}/v1/models", gw.url))
            .header("authorization", format!("{scheme} {KEY}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{scheme}");
    }
    let res = gw
        .client
        .get(format!("{}/v1/models", gw.url))
        .header("authorization", format!("Basic {KEY}"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        openai_error(res, StatusCode::UNAUTHORIZED).await["code"],
        "invalid_api_key"
    );
}

#[tokio::test]
async fn unknown_paths_and_methods_answer_in_openai_shape() {
    let gw = start().await;
    let res = gw
        .client
        .get(format!("{}/v1/completions", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(
        openai_error(res, StatusCode::NOT_FOUND).await["code"],
        "unknown_url"
    );
    let res = gw
        .client
        .get(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["allow"], "POST");
    assert_eq!(
        openai_error(res, StatusCode::METHOD_NOT_ALLOWED).await["code"],
        "method_not_allowed"
    );
}

#[tokio::test]
async fn malformed_and_too_large_bodies_answer_in_openai_shape() {
    let gw = start().await;
    let res = gw.chat(r#"{"model": "llama-3.1-8b", "messages": ["#).await;
    let error = openai_error(res, StatusCode::BAD_REQUEST).await;
    assert_eq!(error["type"], "invalid_request_error");
    let huge = format!(
        r#"{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "{}"}}]}}"#,
        "a".repeat(3 << 20)
    );
    let res = gw.chat(&huge).await;
    openai_error(res, StatusCode::PAYLOAD_TOO_LARGE).await;
}
