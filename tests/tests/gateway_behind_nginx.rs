#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! Two gateways behind nginx (`tests/src/nginx.rs`, retrying only what was
//! never sent to a gateway), ingest running. Eight clients send plain and
//! streamed requests through nginx while one gateway is told SIGTERM,
//! drains, exits 0 and is started again on the same outbox. No client sees
//! an error it would not have seen from a single gateway (every answer is
//! 200, every stream ends with `[DONE]` and no error chunk), and what the
//! clients were told is billed once: usage_hourly per tenant equals the
//! sum of their usage, and request_log holds exactly the answered request
//! ids.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::gateway::{hourly, seed_tenant, start_gateway_with, start_ingest, wait_for_log, Told};
use tests::nginx::Nginx;
use tests::process::wait_healthy;
use tests::{Service, TestStack};

const TENANTS: [(&str, &str); 2] = [
    ("nginx-a", "sk-test-nginx-a-0001"),
    ("nginx-b", "sk-test-nginx-b-0001"),
];
const CLIENTS: usize = 8;
const DRAIN_DELAY_MS: u64 = 1500;

/// What one request through nginx came to.
#[derive(Debug)]
enum Outcome {
    /// 200, and (streamed) `[DONE]` with a usage chunk and no error chunk.
    Answered {
        tenant: &'static str,
        request_id: String,
        stream: bool,
        /// (prompt, cached, completion) as the client was told.
        usage: (i64, i64, i64),
    },
    /// Anything else, with what the client got.
    Failed {
        stream: bool,
        status: u16,
        body: String,
    },
}

async fn gateway(stack: &TestStack, id: &str) -> (Service, String) {
    let outbox = stack.dir.path().join(format!("outbox-{id}"));
    start_gateway_with(
        stack,
        10,
        &[
            ("GATEWAY_ID", id.to_owned()),
            ("GATEWAY_OUTBOX", outbox.display().to_string()),
            ("GATEWAY_DRAIN_DELAY_MS", DRAIN_DELAY_MS.to_string()),
        ],
    )
    .await
}

fn usage_of(u: &Value) -> Option<(i64, i64, i64)> {
    Some((
        u["prompt_tokens"].as_i64()?,
        u["prompt_tokens_details"]["cached_tokens"]
            .as_i64()
            .unwrap_or(0),
        u["completion_tokens"].as_i64()?,
    ))
}

async fn one_request(
    client: &reqwest::Client,
    url: &str,
    (tenant, key): (&'static str, &'static str),
    stream: bool,
    content: String,
    max_tokens: u32,
    seed: u64,
) -> Outcome {
    // The simulator's output length comes from the seed and prompt length.
    let mut body = json!({
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "seed": seed,
    });
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let failed = |status: u16, body: String| Outcome::Failed {
        stream,
        status,
        body,
    };
    let mut res = match client
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
    {
        Ok(res) => res,
        Err(e) => return failed(0, format!("request failed: {e}")),
    };
    let status = res.status().as_u16();
    let request_id = res
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut text = String::new();
    loop {
        match res.chunk().await {
            Ok(Some(bytes)) => text.push_str(&String::from_utf8_lossy(&bytes)),
            Ok(None) => break,
            Err(e) => return failed(status, format!("{text}\n(body cut: {e})")),
        }
    }
    if status != 200 {
        return failed(status, text);
    }
    let usage = if stream {
        let frames: Vec<&str> = text
            .split("\n\n")
            .filter_map(|f| f.trim().strip_prefix("data: "))
            .collect();
        if frames.last() != Some(&"[DONE]") {
            return failed(status, format!("stream without [DONE]:\n{text}"));
        }
        let chunks: Vec<Value> = frames
            .iter()
            .filter(|f| **f != "[DONE]")
            .filter_map(|f| serde_json::from_str(f).ok())
            .collect();
        if chunks.len() + 1 != frames.len() || chunks.iter().any(|c| !c["error"].is_null()) {
            return failed(status, format!("error or garbled chunk:\n{text}"));
        }
        chunks
            .iter()
            .rev()
            .find(|c| c["usage"].is_object())
            .and_then(|c| usage_of(&c["usage"]))
    } else {
        serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| usage_of(&v["usage"]))
    };
    match usage {
        Some(usage) if request_id.starts_with("req_") => Outcome::Answered {
            tenant,
            request_id,
            stream,
            usage,
        },
        _ => failed(status, format!("no usage or X-Request-Id:\n{text}")),
    }
}

/// Client `n`: requests one after another until `stop`, alternating
/// plain and streamed, of 96 to 255 output tokens (some hundreds of ms
/// at speedup 10).
async fn client_loop(n: usize, url: String, stop: Arc<AtomicBool>) -> Vec<Outcome> {
    let client = reqwest::Client::new();
    let mut outcomes = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let stream = (n + i) % 2 == 0;
        let max_tokens = 96 + ((n * 37 + i * 53) % 160) as u32;
        let content = format!("client {n} request {i}: tell me about load balancers");
        outcomes.push(
            one_request(
                &client,
                &url,
                TENANTS[n % TENANTS.len()],
                stream,
                content,
                max_tokens,
                (n * 100_000 + i) as u64,
            )
            .await,
        );
        i += 1;
    }
    outcomes
}

/// Waits until usage_hourly equals `expected`, or panics with the logs.
async fn wait_billed(stack: &TestStack, expected: &Told, services: &[&Service]) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got = hourly(stack).await;
        if &got == expected {
            return;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = services.iter().map(|s| s.log_tail()).collect();
            panic!(
                "usage_hourly never matched what clients were told.\nexpected {expected:?}\ngot      {got:?}\n{}",
                logs.join("\n---\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_behind_nginx_loses_no_request_and_bills_each_once() {
    let stack = TestStack::new("behind_nginx").await;
    for (tenant, key) in TENANTS {
        seed_tenant(&stack, tenant, key, Default::default()).await;
    }
    let ingest = start_ingest(&stack);
    let (mut first, first_url) = gateway(&stack, "gw-a").await;
    let (second, second_url) = gateway(&stack, "gw-b").await;
    let addr = |url: &str| url.trim_start_matches("http://").to_owned();
    let nginx = Nginx::start(stack.dir.path(), &[addr(&first_url), addr(&second_url)]).await;
    let url = nginx.url().to_owned();

    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| tokio::spawn(client_loop(n, url.clone(), stop.clone())))
        .collect();

    // Midway, gw-a is told to stop: it fails readiness, answers for the
    // drain delay, stops accepting (nginx is refused and goes to gw-b),
    // finishes what it admitted and exits 0; then it starts again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let told_at = Instant::now();
    first.signal_term();
    let status = first.wait_exit(Duration::from_secs(40)).await;
    let drained_in = told_at.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "gw-a did not exit 0 on SIGTERM ({status:?}):\n{}",
        first.log_tail()
    );
    assert!(
        drained_in >= Duration::from_millis(DRAIN_DELAY_MS),
        "gw-a exited after {drained_in:?}, before its drain delay"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.restart().unwrap_or_else(|e| panic!("{e}"));
    wait_healthy(
        &format!("{first_url}/healthz"),
        &mut first,
        Duration::from_secs(60),
    )
    .await;
    // Long enough for nginx to take gw-a back (fail_timeout=2s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let mut outcomes = Vec::new();
    for client in clients {
        outcomes.extend(client.await.unwrap());
    }

    let access = nginx.access_log();
    let chats: Vec<&String> = access
        .iter()
        .filter(|l| l.ends_with("/v1/chat/completions"))
        .collect();
    let retried = chats.iter().filter(|l| l.contains(", ")).count();
    let served_by = |gw: &str| chats.iter().filter(|l| l.contains(&addr(gw))).count();
    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Failed {
                stream,
                status,
                body,
            } => Some(format!("status {status} (stream: {stream}): {body}")),
            Outcome::Answered { .. } => None,
        })
        .collect();
    let streamed = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Answered { stream: true, .. }))
        .count();
    eprintln!(
        "sent {}, answered 200 {} ({streamed} streamed), failed {}; gw-a drained in {drained_in:?}; \
         nginx: {} chat requests, {retried} retried on the next gateway, gw-a tried {}, gw-b tried {}",
        outcomes.len(),
        outcomes.len() - failures.len(),
        failures.len(),
        chats.len(),
        served_by(&first_url),
        served_by(&second_url),
    );
    assert!(
        failures.is_empty(),
        "{} of {} requests failed through nginx:\n{}\n--- nginx error log\n{}\n--- gw-a\n{}\n--- gw-b\n{}",
        failures.len(),
        outcomes.len(),
        failures.join("\n"),
        nginx.error_log_tail(),
        first.log_tail(),
        second.log_tail()
    );
    assert!(
        retried >= 1,
        "no request was refused by the stopped gateway and retried: the drain was not exercised\n{}",
        access.join("\n")
    );
    assert!(
        served_by(&first_url) > retried,
        "gw-a answered nothing before or after its restart"
    );

    // Billed once, nothing lost.
    let mut told = Told::new();
    let mut ids: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for outcome in &outcomes {
        if let Outcome::Answered {
            tenant,
            request_id,
            usage: (prompt, cached, completion),
            ..
        } = outcome
        {
            let entry = told.entry((*tenant).to_owned()).or_default();
            entry.0 += 1;
            entry.1 += prompt;
            entry.2 += cached;
            entry.3 += completion;
            ids.entry(tenant).or_default().insert(request_id.clone());
        }
    }
    wait_billed(&stack, &told, &[&first, &second, &ingest]).await;
    for (tenant, answered) in &ids {
        let logged =
            wait_for_log(&stack, tenant, answered.len(), &[&first, &second, &ingest]).await;
        let logged: BTreeSet<String> = logged.into_keys().collect();
        assert_eq!(
            &logged, answered,
            "request_log of {tenant} is not the answered requests"
        );
    }
}
