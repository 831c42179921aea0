//! The drill's traffic: every tenant at a steady rate, codegen-platform's
//! burst in the middle, each request timed from the client's side.
//!
//! Request sizes (tokens of prompt, at most this many of output; the
//! simulator picks each answer's natural length in 16..600 from the seed):
//!
//! | tenant | rate | prompt | max output | streamed |
//! |---|---|---|---|---|
//! | acme-corp | 200/s, all along | 120 | 12 | yes |
//! | medai-labs | 50/s | 400 | 16 | no |
//! | finserv-team | 30/s | 300 | 16 | no |
//! | research-squad | 10/s | 600 | 24 | no |
//! | codegen-platform | the burst only (5,000 in 30 s) | 2,000 | 200 | no |
//!
//! The steady tenants' requests are short because their reference caps
//! say so: 50 requests/s within 30 in flight (medai-labs) leaves each about
//! 0.6 s, a dozen decode steps of the 70B; longer ones would be refused by
//! the tenant's own concurrency cap, not by the fleet. codegen's are long:
//! its 40 in flight then admit far fewer than its 100/s, and with its caps
//! lifted (FIFO) the burst offers the pool more than it can serve.
//!
//! Every prompt starts with its tenant and number, so no two share a
//! cached prefix: the pool does all of their work.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::gateway::{MODEL, TENANTS};
use crate::Drill;

/// One tenant's traffic shape.
struct Shape {
    tenant: usize,
    /// Requests per second, and from when to when (seconds into the replay).
    per_second: f64,
    from: f64,
    until: f64,
    prompt_tokens: usize,
    max_tokens: u32,
    stream: bool,
}

/// What one request got, as its client saw it.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Index into [`TENANTS`].
    pub tenant: usize,
    /// When it was sent, since the replay began.
    pub sent_at: Duration,
    pub status: u16,
    /// The OpenAI error `code` of a refusal.
    pub code: Option<String>,
    /// Until the first content arrived (streams) or the answer (others).
    pub ttft: Option<Duration>,
    /// Until the whole answer arrived.
    pub e2e: Duration,
}

fn shapes(drill: &Drill) -> Vec<Shape> {
    let (w, b, c) = (
        drill.warmup_secs as f64,
        drill.burst_secs as f64,
        drill.cooldown_secs as f64,
    );
    let all = w + b + c;
    let steady = |tenant, per_second, prompt_tokens, max_tokens, stream| Shape {
        tenant,
        per_second,
        from: 0.0,
        until: all,
        prompt_tokens,
        max_tokens,
        stream,
    };
    vec![
        steady(0, 200.0, 120, 12, true),
        steady(1, 50.0, 400, 16, false),
        steady(2, 30.0, 300, 16, false),
        steady(3, 10.0, 600, 24, false),
        Shape {
            tenant: 4,
            per_second: drill.burst_requests as f64 / b.max(1.0),
            from: w,
            until: w + b,
            prompt_tokens: 2_000,
            max_tokens: 200,
            stream: false,
        },
    ]
}

/// Replays the drill's traffic against the gateway at `url` and returns
/// every request's outcome once all have ended.
pub async fn replay(url: &str, drill: &Drill) -> Vec<Outcome> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .pool_max_idle_per_host(2_000)
        .build()
        .unwrap_or_default();
    let url = format!("{url}/v1/chat/completions");
    let began = Instant::now();
    let mut senders = Vec::new();
    for shape in shapes(drill) {
        let (client, url) = (client.clone(), url.clone());
        senders.push(tokio::spawn(async move {
            let count = ((shape.until - shape.from) * shape.per_second).round() as u64;
            let mut requests = tokio::task::JoinSet::new();
            for n in 0..count {
                let at = began + Duration::from_secs_f64(shape.from + n as f64 / shape.per_second);
                tokio::time::sleep_until(at.into()).await;
                let t = &TENANTS[shape.tenant];
                let body = json!({
                    "model": MODEL,
                    "messages": [{"role": "user", "content": format!(
                        "[{} #{n}]{}", t.id, " the".repeat(shape.prompt_tokens))}],
                    "max_tokens": shape.max_tokens,
                    "seed": n,
                    "stream": shape.stream,
                });
                let req = client.post(&url).bearer_auth(t.key).json(&body);
                let tenant = shape.tenant;
                requests.spawn(async move { send(req, tenant, began).await });
            }
            requests.join_all().await
        }));
    }
    let mut outcomes = Vec::new();
    for s in senders {
        if let Ok(done) = s.await {
            outcomes.extend(done);
        }
    }
    outcomes
}

async fn send(req: reqwest::RequestBuilder, tenant: usize, began: Instant) -> Outcome {
    let sent = Instant::now();
    let mut outcome = Outcome {
        tenant,
        sent_at: sent - began,
        status: 0,
        code: None,
        ttft: None,
        e2e: Duration::ZERO,
    };
    let mut res = match req.send().await {
        Ok(res) => res,
        Err(_) => {
            outcome.e2e = sent.elapsed();
            return outcome;
        }
    };
    outcome.status = res.status().as_u16();
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = res.chunk().await {
        if outcome.ttft.is_none() && !chunk.is_empty() {
            outcome.ttft = Some(sent.elapsed());
        }
        body.extend_from_slice(&chunk);
    }
    outcome.e2e = sent.elapsed();
    let text = String::from_utf8_lossy(&body);
    if outcome.status != 200 || text.contains("\"error\"") {
        outcome.ttft = None;
        // A rate limit's `type` says which limit (`concurrency`, ...).
        outcome.code = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| {
                let e = &v["error"];
                match e["code"].as_str() {
                    Some("rate_limit_exceeded") => e["type"].as_str().map(str::to_owned),
                    code => code.map(str::to_owned),
                }
            })
            .or_else(|| Some("stream_error".into()));
        if outcome.status == 200 {
            outcome.status = 502;
        }
    }
    outcome
}
