#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! Streaming through the gateway as a real process: SSE chunks in OpenAI's
//! shape, usage in the last chunk, and exactly one usage event per stream,
//! whether it completes or the client disconnects mid-stream.

use std::time::Duration;

use serde_json::json;
use tests::gateway::{
    chunks, read_sse, seed_tenant, start_gateway, start_gateway_with, start_ingest, wait_for_log,
};
use tests::TestStack;

const KEY: &str = "sk-test-stream-0001";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_tokens_are_billed_and_a_disconnect_is_billed_as_cancelled() {
    let stack = TestStack::new("gwstream").await;
    seed_tenant(&stack, "streamer", KEY, Default::default()).await;
    // Real-time pacing, so a client can leave while tokens are still coming.
    let (gateway, url) = start_gateway(&stack, 1).await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");

    // 1. A complete stream with include_usage.
    let mut res = client
        .post(&chat)
        .bearer_auth(KEY)
        .json(&json!({
            "model": "llama-3.1-8b",
            "messages": [{"role": "user", "content": "stream me a short answer"}],
            "max_tokens": 40,
            "stream": true,
            "stream_options": {"include_usage": true},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    for h in [
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    ] {
        assert!(
            !res.headers().contains_key(h),
            "no limits configured, no {h}"
        );
    }
    let complete_id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
    let frames = read_sse(&mut res, 10_000).await;
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    let parsed = chunks(&frames);
    let mut streamed = 0;
    let mut text = String::new();
    for c in &parsed {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        if let Some(content) = c["choices"][0]["delta"]["content"].as_str() {
            streamed += 1;
            text.push_str(content);
        }
    }
    assert_eq!(parsed[0]["choices"][0]["delta"]["role"], "assistant");
    let finish = &parsed[parsed.len() - 2];
    assert!(["stop", "length"].contains(&finish["choices"][0]["finish_reason"].as_str().unwrap()));
    let last = parsed.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    let usage = &last["usage"];
    assert_eq!(usage["completion_tokens"], streamed);
    assert_eq!(
        usage["total_tokens"].as_i64().unwrap(),
        usage["prompt_tokens"].as_i64().unwrap() + streamed
    );
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_i64());
    assert!(streamed > 0 && !text.is_empty());

    // 2. A client that leaves after a few chunks of a long answer.
    let mut res = client
        .post(&chat)
        .bearer_auth(KEY)
        .json(&json!({
            "model": "llama-3.1-70b",
            "messages": [{"role": "user", "content": "write me a very long essay"}],
            "max_tokens": 600,
            "seed": 7,
            "stream": true,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let cancelled_id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
    let first = read_sse(&mut res, 3).await;
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|f| f != "[DONE]"));
    drop(res);
    drop(client);

    let rows = wait_for_log(&stack, "streamer", 2, &[&gateway, &ingest]).await;
    let (reason, prompt, completion, stream) = &rows[&complete_id];
    assert!(["stop", "length"].contains(&reason.as_str()));
    assert_eq!(*completion, streamed, "billed == streamed");
    assert_eq!(*prompt, usage["prompt_tokens"].as_i64().unwrap());
    assert!(stream);
    let (reason, _, completion, stream) = &rows[&cancelled_id];
    assert_eq!(reason, "cancelled");
    assert!(stream);
    assert!(
        (3..600).contains(completion),
        "the tokens produced before the client left, got {completion}"
    );

    // Nothing more arrives later: one event per request.
    tokio::time::sleep(Duration::from_secs(1)).await;
    wait_for_log(&stack, "streamer", 2, &[&gateway, &ingest]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_admitted_streams_finish_and_their_events_reach_the_broker() {
    let stack = TestStack::new("gwsigterm").await;
    seed_tenant(&stack, "leaver", KEY, Default::default()).await;
    let (mut gateway, url) = start_gateway(&stack, 1).await;
    let ingest = start_ingest(&stack);
    let mut res = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({
            "model": "llama-3.1-8b",
            "messages": [{"role": "user", "content": "a stream that outlives the SIGTERM"}],
            "max_tokens": 120,
            "seed": 11,
            "stream": true,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(read_sse(&mut res, 2).await.len(), 2);

    // SIGTERM mid-stream: the gateway stops taking requests but the stream
    // runs to its end, its event is written, relayed, and then it exits 0.
    gateway.signal_term();
    let rest = read_sse(&mut res, 10_000).await;
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"));
    let streamed = 2 + chunks(&rest)
        .iter()
        .filter(|c| c["choices"][0]["delta"]["content"].is_string())
        .count() as i64;
    let status = gateway.terminate(Duration::from_secs(30)).await.unwrap();
    assert!(status.success(), "{status:?}\n{}", gateway.log_tail());
    let rows = wait_for_log(&stack, "leaver", 1, &[&gateway, &ingest]).await;
    assert_eq!(rows[&id].2, streamed);
}

/// A request still running after GATEWAY_REQUEST_TIMEOUT_SECS is stopped at
/// the engine and billed once, as an error, for what it used: a 504 in
/// OpenAI's error shape, or mid-stream an error chunk and `[DONE]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_timeout_are_stopped_and_billed_as_errors() {
    let stack = TestStack::new("gwtimeout").await;
    seed_tenant(&stack, "slowpoke", KEY, Default::default()).await;
    // Real-time pacing: a 600-token 70B answer takes several seconds.
    let (gateway, url) =
        start_gateway_with(&stack, 1, &[("GATEWAY_REQUEST_TIMEOUT_SECS", "1".into())]).await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    let body = |stream: bool| {
        json!({
            "model": "llama-3.1-70b",
            "messages": [{"role": "user", "content": "write me a very long essay"}],
            "max_tokens": 600,
            "seed": 7,
            "stream": stream,
        })
    };

    let started = std::time::Instant::now();
    let res = client
        .post(&chat)
        .bearer_auth(KEY)
        .json(&body(false))
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(res.status(), 504);
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(10),
        "stopped at the deadline, took {took:?}"
    );
    let plain_id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
    let err: serde_json::Value = res.json().await.unwrap();
    assert_eq!(err["error"]["type"], "timeout", "{err}");
    assert_eq!(err["error"]["code"], "request_timeout", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("GATEWAY_REQUEST_TIMEOUT_SECS"),
        "{err}"
    );

    let mut res = client
        .post(&chat)
        .bearer_auth(KEY)
        .json(&body(true))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let stream_id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
    let frames = read_sse(&mut res, 10_000).await;
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    let parsed = chunks(&frames);
    let (last, tokens) = parsed.split_last().unwrap();
    assert_eq!(last["error"]["code"], "request_timeout", "{last}");
    let streamed = tokens
        .iter()
        .filter(|c| c["choices"][0]["delta"]["content"].is_string())
        .count() as i64;
    assert!(streamed > 0, "tokens came before the deadline");

    let rows = wait_for_log(&stack, "slowpoke", 2, &[&gateway, &ingest]).await;
    let (reason, _, completion, stream) = &rows[&plain_id];
    assert_eq!((reason.as_str(), *stream), ("error", false));
    assert!(
        (1..600).contains(completion),
        "what the engine produced before it was stopped, got {completion}"
    );
    let (reason, _, completion, stream) = &rows[&stream_id];
    assert_eq!((reason.as_str(), *stream), ("error", true));
    assert_eq!(*completion, streamed, "billed == streamed");
    let (gpu,): (rust_decimal::Decimal,) =
        sqlx::query_as("SELECT min(gpu_seconds) FROM request_log WHERE tenant_id = 'slowpoke'")
            .fetch_one(&stack.pool)
            .await
            .unwrap();
    assert!(gpu > rust_decimal::Decimal::ZERO, "GPU time used is billed");
}
