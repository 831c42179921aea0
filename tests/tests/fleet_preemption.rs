#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! Priority preemption through the real gateway, broker and ingest
//! (`GATEWAY_QUEUE=on`), on a small simulated replica: a priority-5
//! request that finds the replica full waits half its budget, then the lowest-priority non-streaming request in
//! flight is preempted — it runs again later and its client gets its
//! answer (delay, not failure); the priority-5 request runs at once. Each
//! request ends with exactly one usage event; the preempted one carries
//! its lost GPU time as `preempted_gpu_seconds` and its preemption count;
//! the replica's reported busy GPU time equals the GPU time billed.

use std::time::{Duration, Instant};

use rust_decimal::Decimal;
use serde_json::{json, Value};
use tests::gateway::{seed_tenant, start_gateway_with, start_ingest, wait_for_log, TenantLimits};
use tests::TestStack;

const BATCH: &str = "sk-test-preempt-batch";
const TOOLS: &str = "sk-test-preempt-tools";
const PROD: &str = "sk-test-preempt-prod";

fn generous() -> TenantLimits {
    TenantLimits {
        rpm: Some(100_000),
        tpm: Some(100_000_000),
        ..Default::default()
    }
}

/// A replica of 128 KV blocks (16 tokens each) whose every step takes
/// 0.25 s, so that a few requests fill it and hold it for about 10 s.
const TINY: &str = "profiles:
  - name: tiny
    version: tiny-1
    gpus: 1
    weight_bytes: 2500000000
    flops_per_token: 1000000000
    kv_bytes_per_token: 1024
    kv_budget_bytes: 2097152
    hbm_bytes_per_second: 10000000000
    bandwidth_efficiency_percent: 100
    flops_per_second: 100000000000000
    max_context: 1024
";

/// About 30 of the 128 blocks: two run together under best effort's 60%.
fn long(i: usize) -> Value {
    json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": format!("batch {i}:{}", " hello".repeat(462))}],
        "max_tokens": 40,
    })
}

/// About 58 blocks: admitted (under standard's 85%), but it waits in the
/// replica for room to start, and its blocks count against admission.
fn big() -> Value {
    json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": format!("tools:{}", " hello".repeat(925))}],
        "max_tokens": 40,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_priority_5_request_preempts_the_lowest_and_the_victim_still_gets_its_answer() {
    let stack = TestStack::new("preempt").await;
    for (tenant, key, priority) in [("batch", BATCH, 1), ("tools", TOOLS, 3), ("prod", PROD, 5)] {
        seed_tenant(&stack, tenant, key, generous()).await;
        sqlx::query("UPDATE tenants SET priority = $2 WHERE tenant_id = $1")
            .bind(tenant)
            .bind(priority)
            .execute(&stack.pool)
            .await
            .unwrap();
    }
    // prod's TTFT objective is 10 s: its wait budget; it preempts at 5 s.
    sqlx::query("UPDATE tenants SET slo_ttft_p95_ms = 10000, slo_e2e_p95_ms = 600000 WHERE tenant_id = 'prod'")
        .execute(&stack.pool)
        .await
        .unwrap();
    let profiles = stack.dir.path().join("tiny.yaml");
    std::fs::write(&profiles, TINY).unwrap();
    let (mut gateway, url) = start_gateway_with(
        &stack,
        1,
        &[
            ("ENGINE_PROFILES", profiles.display().to_string()),
            ("GATEWAY_QUEUE", "on".into()),
            ("GATEWAY_REPLICA_REPORT_SECS", "1".into()),
            ("GATEWAY_REQUEST_TIMEOUT_SECS", "120".into()),
        ],
    )
    .await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    let send = |key: &'static str, body: Value| {
        let (client, chat) = (client.clone(), chat.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let res = client
                .post(&chat)
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            let text = res.text().await.unwrap();
            (status, started.elapsed(), text)
        })
    };
    // Two best-effort requests and one standard fill the replica past 92%.
    let mut fill = Vec::new();
    for i in 0..2 {
        fill.push(send(BATCH, long(i)));
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    fill.push(send(TOOLS, big()));
    tokio::time::sleep(Duration::from_millis(400)).await;

    // The two best-effort requests run (47% of the blocks); the standard
    // one waits inside the replica for room under its 85%, and its blocks
    // count against admission: used + waiting = 92.2% is past the reserved
    // class's 92%, so a priority-5 request finds no room.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = tests::gateway::metrics(&url).await;
        let gauge = |name: &str| {
            m.lines()
                .find(|l| l.starts_with(&format!("{name}{{model_name=\"tiny\"")))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let (running, waiting) = (
            gauge("vllm:num_requests_running"),
            gauge("vllm:num_requests_waiting"),
        );
        if running == 2.0 && waiting == 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never filled ({running} running, {waiting} waiting):\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let prod = send(
        PROD,
        json!({"model": "tiny", "messages": [{"role": "user", "content": "urgent"}], "max_tokens": 4}),
    );
    let (status, took, text) = prod.await.unwrap();
    assert_eq!(status, 200, "{text}\n{}", gateway.log_tail());
    assert!(
        took >= Duration::from_millis(4_900),
        "it waited for the preemption point (5 s) first: {took:?}"
    );
    let m = tests::gateway::metrics(&url).await;
    let preemptions: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("preemptions_total{"))
        .collect();
    assert_eq!(preemptions.len(), 1, "{m}");
    assert!(
        preemptions[0].contains("preempted_tenant=\"batch\"")
            && preemptions[0].contains("preempting_tenant=\"prod\"")
            && preemptions[0].ends_with(" 1"),
        "{preemptions:?}"
    );
    // Every request of the fill gets its answer: the preempted one later.
    for f in fill {
        let (status, _, text) = f.await.unwrap();
        assert_eq!(
            status,
            200,
            "delay, not failure: {}",
            &text[..text.len().min(300)]
        );
    }
    assert!(gateway.terminate(Duration::from_secs(30)).await.is_some());
    let batch = wait_for_log(&stack, "batch", 2, &[&gateway, &ingest]).await;
    assert!(
        batch.values().all(|r| r.0 == "stop" || r.0 == "length"),
        "{batch:?}"
    );
    wait_for_log(&stack, "tools", 1, &[&gateway, &ingest]).await;
    wait_for_log(&stack, "prod", 1, &[&gateway, &ingest]).await;
    // The engine took it right after the preemption point: its queue wait.
    let waited = stack
        .count("SELECT queue_wait_ms FROM request_log WHERE tenant_id = 'prod'")
        .await;
    assert!(
        (4_900..7_000).contains(&waited),
        "prod waited {waited} ms in the queue"
    );
    let rows: Vec<(String, i64, Decimal, Decimal)> = sqlx::query_as(
        "SELECT tenant_id, preemptions, gpu_seconds, preempted_gpu_seconds FROM request_log ORDER BY tenant_id",
    )
    .fetch_all(&stack.pool)
    .await
    .unwrap();
    let preempted: Vec<_> = rows.iter().filter(|r| r.1 > 0).collect();
    assert_eq!(preempted.len(), 1, "one request was preempted: {rows:?}");
    let (tenant, _, gpu, lost) = preempted[0];
    assert_eq!(tenant, "batch");
    assert!(
        *lost > Decimal::ZERO && gpu > lost,
        "its lost work stays on it: {rows:?}\n{}",
        gateway.log_text()
    );
    // The replica's busy GPU time = every request's GPU time, lost work included.
    let mut busy = Decimal::ZERO;
    for _ in 0..60 {
        let (b,): (Option<Decimal>,) =
            sqlx::query_as("SELECT sum(busy_gpu_seconds) FROM replica_reports")
                .fetch_one(&stack.pool)
                .await
                .unwrap();
        busy = b.unwrap_or_default();
        let billed: Decimal = rows.iter().map(|r| r.2).sum();
        if busy == billed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let billed: Decimal = rows.iter().map(|r| r.2).sum();
    assert_eq!(
        busy, billed,
        "attributed + wasted = busy GPU-seconds, exactly"
    );
    drop(ingest);
}
