//! The engine's HTTP server on a real socket: errors in OpenAI's shape
//! (unknown paths, wrong methods, too-large bodies) and a NUL in the query
//! or the request refused with 400 naming it, and what the simulator cannot
//! do refused with 400 naming the parameter.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::sync::Arc;

use std::time::{SystemTime, UNIX_EPOCH};

use engine::identity::{self, Secret, Signer};
use engine::{ModelProfile, ServiceClass, Simulator};
use reqwest::StatusCode;
use serde_json::Value;

const SECRET: &str = "http-errors-test-secret-0123456789abcdef";

fn secret() -> Secret {
    Secret::new(SECRET).unwrap()
}

/// A valid identity for tenant `acme`.
fn signed() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    Signer::new(secret()).sign("acme", ServiceClass::Standard, now)
}

async fn start() -> String {
    let sim = Arc::new(Simulator::new(ModelProfile::reference(), 0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Served as the binary serves it: through the shared serving layer.
    tokio::spawn(serving::serve(
        listener,
        engine::server::app(sim, secret()),
        serving::HttpSettings::default(),
        std::future::pending(),
    ));
    format!("http://{addr}")
}

async fn openai_error(res: reqwest::Response, status: StatusCode) -> String {
    assert_eq!(res.status(), status);
    let body: Value = res.json().await.unwrap();
    assert!(body["error"]["type"].is_string(), "{body}");
    body["error"]["message"].as_str().unwrap().to_owned()
}

async fn chat(url: &str, body: String) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header(identity::HEADER, signed())
        .body(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_nul_in_the_request_or_the_query_is_a_400_naming_it() {
    let url = start().await;
    let res = chat(
        &url,
        r#"{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "\u0000"}]}"#
            .into(),
    )
    .await;
    let message = openai_error(res, StatusCode::BAD_REQUEST).await;
    assert!(message.contains("messages[1].content"), "{message}");
    let res = reqwest::get(format!("{url}/v1/models?tenant=%00"))
        .await
        .unwrap();
    let message = openai_error(res, StatusCode::BAD_REQUEST).await;
    assert!(message.contains("`tenant`"), "{message}");
}

#[tokio::test]
async fn unknown_paths_wrong_methods_and_big_bodies_answer_in_openai_shape() {
    let url = start().await;
    let res = reqwest::get(format!("{url}/v1/nothing")).await.unwrap();
    openai_error(res, StatusCode::NOT_FOUND).await;
    let res = reqwest::get(format!("{url}/v1/chat/completions"))
        .await
        .unwrap();
    assert_eq!(res.headers()["allow"], "POST");
    openai_error(res, StatusCode::METHOD_NOT_ALLOWED).await;
    let huge = format!(
        r#"{{"model": "llama-3.1-8b", "messages": [{{"content": "{}"}}]}}"#,
        "a".repeat(3 << 20)
    );
    openai_error(chat(&url, huge).await, StatusCode::PAYLOAD_TOO_LARGE).await;
    let res = chat(&url, "{".into()).await;
    openai_error(res, StatusCode::BAD_REQUEST).await;
}

#[tokio::test]
async fn what_the_simulator_cannot_do_is_a_400_naming_the_parameter() {
    let url = start().await;
    let res = chat(
        &url,
        r#"{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "n": 2}"#
            .into(),
    )
    .await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"]["param"], "n", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let res = chat(
        &url,
        r#"{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "temperature": 0.7, "top_p": 0.5}"#.into(),
    )
    .await;
    assert_eq!(res.status(), StatusCode::OK);
}
