#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! Priority preemption through the real gateway, broker and ingest
//! (`GATEWAY_QUEUE=on`), on a small simulated replica: a priority-5
//! request that finds the replica full waits half its budget, then the lowest-priority non-streaming request in
//! flight is preempted — it runs again later and its client gets its
//! answer (delay, not failure); the priority-5 request runs at once. Each
//! request ends with exactly one usage event; the preempted one carries
//! its lost GPU time as `preempted_gpu_seconds` and its preemption count;
//! the replica's reported busy GPU time equals the GPU time billed.
//!
//! And an owner taking back its dedicated replica: its request, waiting
//! for room, preempts the lent work there (whatever the borrower's
//! priority), the replica is not lent again meanwhile, and the owner's lent
//! credit is what the replica counted — the lost attempt included, which
//! the borrower's event (it finished on the shared replica) cannot place.

use std::time::{Duration, Instant};

use rust_decimal::Decimal;
use serde_json::{json, Value};
use tests::gateway::{seed_tenant, start_gateway_with, start_ingest, wait_for_log, TenantLimits};
use tests::{Service, TestStack};

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

/// `replicas` replicas of 128 KV blocks (16 tokens each) whose every step
/// takes 0.25 s, so that a few requests fill one and hold it for about
/// 10 s; `dedicated` is the profile's `dedicated:` value, if any.
fn tiny(replicas: u32, dedicated: Option<&str>) -> String {
    let dedicated = dedicated.map_or(String::new(), |d| format!("    dedicated: {d}\n"));
    format!(
        "profiles:
  - name: tiny
    version: tiny-1
    gpus: 1
    replicas: {replicas}
{dedicated}    weight_bytes: 2500000000
    flops_per_token: 1000000000
    kv_bytes_per_token: 1024
    kv_budget_bytes: 2097152
    hbm_bytes_per_second: 10000000000
    bandwidth_efficiency_percent: 100
    flops_per_second: 100000000000000
    max_context: 1024
"
    )
}

/// Seeds `tenants` (id, key, priority) with generous limits; `slow_lane`
/// gets a 10 s TTFT objective (its wait budget: it preempts at 5 s).
async fn seed(stack: &TestStack, tenants: &[(&str, &str, i16)], slow_lane: &str) {
    for &(tenant, key, priority) in tenants {
        seed_tenant(stack, tenant, key, generous()).await;
        sqlx::query("UPDATE tenants SET priority = $2 WHERE tenant_id = $1")
            .bind(tenant)
            .bind(priority)
            .execute(&stack.pool)
            .await
            .unwrap();
    }
    sqlx::query(
        "UPDATE tenants SET slo_ttft_p95_ms = 10000, slo_e2e_p95_ms = 600000 WHERE tenant_id = $1",
    )
    .bind(slow_lane)
    .execute(&stack.pool)
    .await
    .unwrap();
}

/// The gateway (queues on, a replica report every second) over `profile`,
/// and ingest.
async fn start(stack: &TestStack, profile: &str) -> (Service, String, Service) {
    let profiles = stack.dir.path().join("tiny.yaml");
    std::fs::write(&profiles, profile).unwrap();
    let (gateway, url) = start_gateway_with(
        stack,
        1,
        &[
            ("ENGINE_PROFILES", profiles.display().to_string()),
            ("GATEWAY_QUEUE", "on".into()),
            ("GATEWAY_REPLICA_REPORT_SECS", "1".into()),
            ("GATEWAY_REQUEST_TIMEOUT_SECS", "120".into()),
        ],
    )
    .await;
    (gateway, url, start_ingest(stack))
}

type Answer = tokio::task::JoinHandle<(u16, Duration, String)>;

/// Sends `body` with `key` in the background: its status, how long it
/// took and its body.
fn send(url: &str, key: &'static str, body: Value) -> Answer {
    let chat = format!("{url}/v1/chat/completions");
    tokio::spawn(async move {
        let started = Instant::now();
        let res = reqwest::Client::new()
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
}

/// `/metrics` shows exactly one preemption, of `preempted` for `preempting`.
async fn one_preemption(url: &str, preempted: &str, preempting: &str) {
    let m = tests::gateway::metrics(url).await;
    let preemptions: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("preemptions_total{"))
        .collect();
    assert_eq!(preemptions.len(), 1, "{m}");
    assert!(
        preemptions[0].contains(&format!("preempted_tenant=\"{preempted}\""))
            && preemptions[0].contains(&format!("preempting_tenant=\"{preempting}\""))
            && preemptions[0].ends_with(" 1"),
        "{preemptions:?}"
    );
}

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
    seed(
        &stack,
        &[("batch", BATCH, 1), ("tools", TOOLS, 3), ("prod", PROD, 5)],
        "prod",
    )
    .await;
    let (mut gateway, url, ingest) = start(&stack, &tiny(1, None)).await;
    let send = |key: &'static str, body: Value| send(&url, key, body);
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
    one_preemption(&url, "batch", "prod").await;
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

const OWNER: &str = "sk-test-preempt-owner";
const BORROWER: &str = "sk-test-preempt-borrower";

/// A seed whose simulated answer runs to `max_tokens` (40) for any prompt
/// length in `lengths` (the gateway's chat flattening adds a few tokens).
fn seed_for(lengths: std::ops::RangeInclusive<u64>) -> u64 {
    (0..100_000)
        .find(|&s| {
            lengths
                .clone()
                .all(|pt| engine::simulator::natural_output_tokens(s, pt) >= 40)
        })
        .expect("a seed for a long answer")
}

/// The per-replica gauge `name` of model `tiny`, by replica id.
fn per_replica(m: &str, name: &str) -> std::collections::BTreeMap<String, f64> {
    m.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains("model_name=\"tiny\""))
        .filter_map(|l| {
            let replica = l.split("replica=\"").nth(1)?.split('"').next()?.to_owned();
            Some((replica, l.rsplit(' ').next()?.parse::<f64>().ok()?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_takes_its_lent_replica_back_and_the_lent_time_is_credited_as_the_replica_counted_it(
) {
    let stack = TestStack::new("ownerpreempt").await;
    // The owner is priority 2 (best effort: admitted below 60% of a
    // replica's KV): it preempts nothing but what it lent. The borrower is
    // priority 4, above it: lent work goes first all the same. The owner
    // is charged back by GPU time (the test model has no token prices in
    // the reference book).
    seed(
        &stack,
        &[("owner", OWNER, 2), ("borrower", BORROWER, 4)],
        "owner",
    )
    .await;
    sqlx::query("UPDATE tenants SET billing_mode = 'per_gpu_second' WHERE tenant_id = 'owner'")
        .execute(&stack.pool)
        .await
        .unwrap();
    let (mut gateway, url, ingest) = start(&stack, &tiny(2, Some("{ owner: 1 }"))).await;
    let client = reqwest::Client::new();
    let send = |key: &'static str, body: Value| send(&url, key, body);
    let seed = seed_for(1..=40);
    let borrow_seed = seed_for(600..=700);
    // The owner is idle: its replica is lent. The borrower's four requests
    // (~40 of a replica's 128 blocks each, ~10 s) run two on each replica:
    // both past best effort's 60%.
    let mut fill = Vec::new();
    for i in 0..4 {
        let body = json!({
            "model": "tiny",
            "messages": [{"role": "user", "content": format!("borrow {i}:{}", " hello".repeat(620))}],
            "max_tokens": 40,
            "seed": borrow_seed,
        });
        fill.push(send(BORROWER, body));
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = tests::gateway::metrics(&url).await;
        let running = per_replica(&m, "vllm:num_requests_running");
        let waiting = per_replica(&m, "vllm:num_requests_waiting");
        let runs = |r: &str| running.get(r).copied().unwrap_or(0.0);
        if runs("tiny-r0") == 2.0 && runs("tiny-r1") == 2.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replicas never filled ({running:?} running, {waiting:?} waiting):\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The owner comes back: no replica admits it, so it waits; at half its
    // budget it takes its replica back (the borrower's request there that
    // lost least), and nobody else may start there meanwhile.
    let owner = send(
        OWNER,
        json!({"model": "tiny", "messages": [{"role": "user", "content": "mine"}], "max_tokens": 40, "seed": seed}),
    );
    let (status, took, text) = owner.await.unwrap();
    assert_eq!(status, 200, "{text}\n{}", gateway.log_tail());
    assert!(
        took >= Duration::from_millis(4_900),
        "it waited for the preemption point (5 s) first: {took:?}"
    );
    one_preemption(&url, "borrower", "owner").await;
    // Delay, not failure: every borrowed request gets its answer.
    for f in fill {
        let (status, _, text) = f.await.unwrap();
        assert_eq!(status, 200, "{}", &text[..text.len().min(300)]);
    }
    assert!(gateway.terminate(Duration::from_secs(30)).await.is_some());
    wait_for_log(&stack, "borrower", 4, &[&gateway, &ingest]).await;
    wait_for_log(&stack, "owner", 1, &[&gateway, &ingest]).await;

    // The owner ran on its own replica; the victim was the borrower's work
    // there, and it finished on the shared replica (the owner's replica
    // was not lent again while the owner waited or ran), so its event
    // cannot say that part of its GPU time was spent on the owner's
    // replica.
    let (replica, dedicated_to): (String, Option<String>) = sqlx::query_as(
        "SELECT replica_id, dedicated_to FROM request_log WHERE tenant_id = 'owner'",
    )
    .fetch_one(&stack.pool)
    .await
    .unwrap();
    assert_eq!(
        (replica.as_str(), dedicated_to.as_deref()),
        ("tiny-r0", Some("owner"))
    );
    let victims: Vec<(String, Decimal, Decimal)> = sqlx::query_as(
        "SELECT replica_id, gpu_seconds, preempted_gpu_seconds FROM request_log
         WHERE tenant_id = 'borrower' AND preemptions > 0",
    )
    .fetch_all(&stack.pool)
    .await
    .unwrap();
    assert_eq!(victims.len(), 1, "{victims:?}");
    let (victim_replica, _, lost) = &victims[0];
    assert!(*lost > Decimal::ZERO, "{victims:?}");
    assert_eq!(victim_replica, "tiny-r1", "{victims:?}");

    // Wait for the last replica reports (the graceful stop wrote them).
    let billed = stack
        .decimal("SELECT sum(gpu_seconds) FROM request_log")
        .await;
    let mut busy = Decimal::ZERO;
    for _ in 0..120 {
        busy = stack
            .decimal("SELECT sum(busy_gpu_seconds) FROM replica_reports")
            .await;
        if busy == billed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        busy, billed,
        "attributed + wasted = busy GPU-seconds, exactly"
    );
    // The owner's replica: its busy time is the owner's own usage there
    // plus what it lent — the lost attempt included, which the events that
    // ended there do not hold.
    let r0_busy = stack
        .decimal(
            "SELECT sum(busy_gpu_seconds) FROM dedicated_capacity_hourly WHERE owner_id = 'owner'",
        )
        .await;
    let lent = stack
        .decimal(
            "SELECT sum(lent_gpu_seconds) FROM dedicated_capacity_hourly WHERE owner_id = 'owner'",
        )
        .await;
    let own = stack.decimal("SELECT sum(gpu_seconds) FROM request_log WHERE replica_id = 'tiny-r0' AND tenant_id = 'owner'",
    )
    .await;
    let ended_there = stack.decimal("SELECT sum(gpu_seconds) FROM request_log WHERE dedicated_to = 'owner' AND tenant_id <> 'owner'",
    )
    .await;
    assert_eq!(
        r0_busy,
        own + lent,
        "the owner's replica: own + lent = busy"
    );
    assert!(
        lent > ended_there,
        "the lost attempt ran on the owner's replica: lent {lent} vs {ended_there} by the events"
    );

    // The owner's invoice credits what the replica lent (priority 2: $1.50
    // per GPU-hour), so the borrower's lost GPU time there, billed to the
    // borrower, is not also charged to the owner.
    let finance = "finance-token-for-owner-preemption";
    let billing = tests::billing::start_billing_api(&stack.database_url, finance).await;
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let invoice: Value = client
        .get(format!("{}/v1/tenants/owner/invoices/{month}", billing.url))
        .bearer_auth(finance)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let lent_line: Vec<&Value> = invoice["lines"]
        .as_array()
        .unwrap_or_else(|| panic!("no invoice: {invoice}"))
        .iter()
        .filter(|l| {
            l["kind"] == "credit"
                && l["description"]
                    .as_str()
                    .is_some_and(|d| d.contains("lent to other tenants"))
        })
        .collect();
    assert_eq!(lent_line.len(), 1, "{invoice}");
    let hours: Decimal = lent_line[0]["quantity"].as_str().unwrap().parse().unwrap();
    assert_eq!(hours, (lent / Decimal::from(3600)).round_dp(6), "{invoice}");
    drop(billing);
    drop(ingest);
}
