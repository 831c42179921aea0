//! The in-process engine and its HTTP API.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use engine::identity::{self, Secret, Signer};
use engine::{CompletionRequest, EngineError, ModelProfile, ServiceClass, Simulator};
use rust_decimal::Decimal;

const SECRET: &str = "simulator-test-secret-0123456789abcdef";

/// A valid identity for `tenant`.
fn signed(tenant: &str) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    Signer::new(Secret::new(SECRET).unwrap()).sign(tenant, ServiceClass::Standard, now)
}

fn sim() -> Simulator {
    Simulator::new(ModelProfile::reference(), 0)
}

fn req(tenant: &str, prompt: &str, max_tokens: Option<u32>) -> CompletionRequest {
    CompletionRequest {
        model: "llama-3.1-70b".into(),
        prompt: prompt.into(),
        max_tokens,
        seed: 7,
        tenant_id: tenant.into(),
        class: ServiceClass::Standard,
        body: None,
    }
}

#[tokio::test]
async fn same_seed_same_answer() {
    let a = sim()
        .complete(&req("t", "tell me about GPUs", None))
        .await
        .unwrap();
    let b = sim()
        .complete(&req("t", "tell me about GPUs", None))
        .await
        .unwrap();
    assert_eq!(a, b);
    assert_eq!(engine::tokenizer::count(&a.text), a.completion_tokens);
}

#[tokio::test]
async fn max_tokens_caps_and_says_so() {
    let c = sim()
        .complete(&req("t", "a long answer please", Some(3)))
        .await
        .unwrap();
    assert_eq!(c.completion_tokens, 3);
    assert!(c.length_capped);
}

#[tokio::test]
async fn a_lone_request_is_billed_its_busy_time_times_gpus() {
    let c = sim().complete(&req("t", "hello", Some(10))).await.unwrap();
    let busy = Decimal::from(c.total.as_micros() as i64) / Decimal::from(1_000_000);
    assert_eq!(c.gpu_seconds, busy * Decimal::from(4));
    assert_eq!(c.preempted_gpu_seconds, Decimal::ZERO);
    assert!(c.gpu_seconds.scale() <= 6);
}

#[tokio::test]
async fn the_prefix_cache_serves_the_same_tenant_only() {
    let s = sim();
    let prompt = "You are a careful assistant. ".repeat(400);
    let first = s.complete(&req("acme", &prompt, Some(5))).await.unwrap();
    assert_eq!(first.cached_tokens, 0);
    let other = s.complete(&req("medai", &prompt, Some(5))).await.unwrap();
    assert_eq!(other.cached_tokens, 0, "another tenant's cache was hit");
    let again = s.complete(&req("acme", &prompt, Some(5))).await.unwrap();
    assert!(again.cached_tokens > 0 && again.cached_tokens < again.prompt_tokens);
    assert!(
        again.gpu_seconds < first.gpu_seconds,
        "a hit skips prefill work"
    );
}

#[tokio::test]
async fn unknown_model_is_an_error() {
    let mut r = req("t", "x", None);
    r.model = "gpt-9".into();
    assert_eq!(
        sim().complete(&r).await,
        Err(EngineError::UnknownModel("gpt-9".into()))
    );
}

#[tokio::test]
async fn dropping_a_generation_cancels_it() {
    let s = Simulator::new(ModelProfile::reference(), 1);
    let mut g = s
        .start(&req("t", "stream to me", Some(500)), true)
        .await
        .unwrap();
    assert!(matches!(g.next().await.unwrap(), engine::Piece::Token(_)));
    drop(g);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let snap = &s.snapshots()[1];
    assert_eq!((snap.running, snap.stats.cancelled), (0, 1));
    assert!(
        snap.stats.tenant_gpu_micros[0] > 0,
        "work done before the cancel stays billed"
    );
}

async fn serve() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sim = Arc::new(sim());
    tokio::spawn(engine::server::run(
        listener,
        sim,
        Secret::new(SECRET).unwrap(),
        serving::HttpSettings::default(),
        std::future::pending(),
    ));
    format!("http://{addr}")
}

#[tokio::test]
async fn http_answers_in_openai_shape_with_cached_tokens() {
    let base = serve().await;
    let client = reqwest::Client::new();
    let body = serde_json::json!({
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": "hello ".repeat(50)}],
        "max_tokens": 8,
    });
    let mut last = serde_json::Value::Null;
    for _ in 0..2 {
        last = client
            .post(format!("{base}/v1/chat/completions"))
            .header(identity::HEADER, signed("acme"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    }
    assert_eq!(last["object"], "chat.completion");
    assert_eq!(last["usage"]["completion_tokens"], 8);
    assert!(
        last["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(last["choices"][0]["finish_reason"], "length");

    let stream = serde_json::json!({
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": "stream"}],
        "max_tokens": 4,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let text = client
        .post(format!("{base}/v1/chat/completions"))
        .header(identity::HEADER, signed("acme"))
        .json(&stream)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(text.matches("chat.completion.chunk").count(), 6, "{text}");
    assert!(text.contains("\"completion_tokens\":4"), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");

    let bad = client
        .post(format!("{base}/v1/chat/completions"))
        .header(identity::HEADER, signed("acme"))
        .json(&serde_json::json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 404);
    let err: serde_json::Value = bad.json().await.unwrap();
    assert_eq!(err["error"]["code"], "model_not_found");

    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "meterline_engine_attributed_gpu_seconds_total{model_name=\"llama-3.1-8b\",replica=\"llama-3.1-8b-r0\",tenant=\"acme\"}",
        "meterline_engine_idle_gpu_seconds_total",
    ] {
        assert!(metrics.contains(name), "{name} missing from\n{metrics}");
    }
}

#[test]
fn no_capacity_is_503_with_retry_after() {
    use axum::response::IntoResponse;
    let res = EngineError::NoCapacity {
        model: "m".into(),
        class: "best-effort",
        why: engine::error::NoRoom::Full {
            occupancy_percent: 61,
        },
    }
    .into_response();
    assert_eq!(res.status(), 503);
    let secs: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3).contains(&secs));
}
