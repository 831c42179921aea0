//! Helpers for gateway tests: a tenant with chosen limits, the gateway and
//! ingest as processes, an SSE reader, and request_log lookups.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::process::{free_port, wait_healthy};
use crate::{Service, TestStack};

/// Limits for [`seed_tenant`]; `None` is no limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct TenantLimits {
    pub rpm: Option<i32>,
    pub tpm: Option<i64>,
    pub max_concurrency: Option<i32>,
    pub max_output: Option<i32>,
}

/// Inserts a tenant with one key (`api_key_id` = `key_<tenant>`) and a `*` limits row.
pub async fn seed_tenant(stack: &TestStack, tenant: &str, key: &str, limits: TenantLimits) {
    sqlx::query(
        "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode, max_concurrency)
         VALUES ($1, $1, 'enterprise', 5, 'per_token', $2)",
    )
    .bind(tenant)
    .bind(limits.max_concurrency)
    .execute(&stack.pool)
    .await
    .expect("insert tenant");
    sqlx::query(
        "INSERT INTO api_keys (api_key_id, tenant_id, key_hash, key_prefix)
         VALUES ('key_' || $1, $1, sha256($2::bytea), left($2, 8))",
    )
    .bind(tenant)
    .bind(key)
    .execute(&stack.pool)
    .await
    .expect("insert key");
    sqlx::query(
        "INSERT INTO limits (tenant_id, model, rpm, tpm, max_output) VALUES ($1, '*', $2, $3, $4)",
    )
    .bind(tenant)
    .bind(limits.rpm)
    .bind(limits.tpm)
    .bind(limits.max_output)
    .execute(&stack.pool)
    .await
    .expect("insert limits");
}

/// Starts the gateway (engine paced at `speedup`) and waits until it is healthy.
pub async fn start_gateway(stack: &TestStack, speedup: u32) -> (Service, String) {
    start_gateway_with(stack, speedup, &[]).await
}

/// [`start_gateway`] with more settings.
pub async fn start_gateway_with(
    stack: &TestStack,
    speedup: u32,
    settings: &[(&str, String)],
) -> (Service, String) {
    let port = free_port();
    let mut env = stack.env();
    env.insert("GATEWAY_ADDR".into(), format!("127.0.0.1:{port}"));
    env.insert(
        "GATEWAY_OUTBOX".into(),
        stack.dir.path().join("outbox").display().to_string(),
    );
    env.insert("ENGINE_SPEEDUP".into(), speedup.to_string());
    // Tests send bursts; a test of the global limit sets its own.
    env.insert("GATEWAY_GLOBAL_RPS".into(), "0".into());
    // Last, so a test's own settings (a second gateway's id, outbox, …) win.
    env.extend(settings.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    let name = env
        .get("GATEWAY_ID")
        .map_or_else(|| "gateway".to_owned(), |id| format!("gateway-{id}"));
    let mut gateway = Service::start(&name, "gateway-lite", &[], env, stack.dir.path())
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!("http://127.0.0.1:{port}");
    wait_healthy(
        &format!("{url}/healthz"),
        &mut gateway,
        Duration::from_secs(60),
    )
    .await;
    (gateway, url)
}

/// [`start_gateway_with`] as gateway `id` (`GATEWAY_ID`) with an outbox
/// of its own, as one of several gateways on the stack.
pub async fn start_gateway_named(
    stack: &TestStack,
    id: &str,
    speedup: u32,
    settings: &[(&str, String)],
) -> (Service, String) {
    let mut all = vec![
        ("GATEWAY_ID", id.to_owned()),
        (
            "GATEWAY_OUTBOX",
            stack
                .dir
                .path()
                .join(format!("outbox-{id}"))
                .display()
                .to_string(),
        ),
    ];
    all.extend(settings.iter().cloned());
    start_gateway_with(stack, speedup, &all).await
}

/// Starts ingest for the stack's topic.
pub fn start_ingest(stack: &TestStack) -> Service {
    let mut env = stack.env();
    env.insert(
        "INGEST_METRICS_ADDR".into(),
        format!("127.0.0.1:{}", free_port()),
    );
    env.insert("INGEST_LINGER_MS".into(), "50".into());
    Service::start("ingest", "ingest", &[], env, stack.dir.path()).unwrap_or_else(|e| panic!("{e}"))
}

/// One request_log row: (finish_reason, prompt, completion, stream).
pub type LogRow = (String, i64, i64, bool);

/// Waits until request_log holds exactly `n` rows for `tenant`, and returns them by request id.
pub async fn wait_for_log(
    stack: &TestStack,
    tenant: &str,
    n: usize,
    services: &[&Service],
) -> std::collections::HashMap<String, LogRow> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let rows: Vec<(uuid::Uuid, String, i64, i64, bool)> = sqlx::query_as(
            "SELECT request_id, finish_reason, prompt_tokens, completion_tokens, stream
             FROM request_log WHERE tenant_id = $1",
        )
        .bind(tenant)
        .fetch_all(&stack.pool)
        .await
        .expect("read request_log");
        if rows.len() >= n || tokio::time::Instant::now() > deadline {
            let logs: Vec<String> = services.iter().map(|s| s.log_tail()).collect();
            assert_eq!(
                rows.len(),
                n,
                "request_log rows for {tenant}; logs:\n{}",
                logs.join("\n---\n")
            );
            return rows
                .into_iter()
                .map(|(id, f, p, c, s)| (format!("req_{id}"), (f, p, c, s)))
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads SSE `data:` payloads from a streaming response, `limit` at most.
pub async fn read_sse(res: &mut reqwest::Response, limit: usize) -> Vec<String> {
    let mut buf = String::new();
    let mut out = Vec::new();
    while out.len() < limit {
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            if let Some(data) = frame.trim_end().strip_prefix("data: ") {
                out.push(data.to_owned());
            }
            if out.len() >= limit {
                return out;
            }
        }
        match res.chunk().await.expect("read stream") {
            Some(bytes) => buf.push_str(std::str::from_utf8(&bytes).expect("utf-8 stream")),
            None => break,
        }
    }
    out
}

/// The JSON payloads of `frames`, `[DONE]` excluded.
pub fn chunks(frames: &[String]) -> Vec<Value> {
    frames
        .iter()
        .filter(|f| f.as_str() != "[DONE]")
        .map(|f| serde_json::from_str(f).expect("chunk is JSON"))
        .collect()
}

/// What clients were told, or what is billed, per tenant: (requests, prompt,
/// cached, completion tokens).
pub type Told = BTreeMap<String, (i64, i64, i64, i64)>;

/// usage_hourly per tenant: (requests, prompt, cached, completion).
pub async fn hourly(stack: &TestStack) -> Told {
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT tenant_id, sum(requests)::bigint, sum(prompt_tokens)::bigint,
                sum(cached_tokens)::bigint, sum(completion_tokens)::bigint
         FROM usage_hourly GROUP BY tenant_id",
    )
    .fetch_all(&stack.pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(t, r, p, c, o)| (t, (r, p, c, o)))
        .collect()
}

pub async fn wait_for(stack: &TestStack, expected: &Told, gateway: &Service, ingest: &Service) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let got = hourly(stack).await;
        if &got == expected {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "usage_hourly never matched.\nexpected {expected:?}\ngot      {got:?}\n--- gateway\n{}\n--- ingest\n{}",
                gateway.log_tail(),
                ingest.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The Prometheus text a service serves at `{base}/metrics`.
pub async fn metrics(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("/metrics text")
}

/// One unlabelled gauge of the gateway's, from its metrics.
pub async fn gauge(base: &str, name: &str) -> f64 {
    let text = metrics(base).await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map(|v| v.trim().parse::<f64>().expect("a gauge is a number"))
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

/// The gateway's `gateway_outbox_depth`, from its metrics.
pub async fn outbox_depth(base: &str) -> u64 {
    gauge(base, "gateway_outbox_depth").await as u64
}
