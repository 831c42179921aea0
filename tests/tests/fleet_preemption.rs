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

/// Where the `tiny` model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Serving {
    /// The gateway's own simulator.
    Simulated,
    /// The `engine` binary over HTTP, as vLLM would be (GPU time from the
    /// gateways' ledger, reported from it).
    Http,
}

/// [`start`] for `serving`; also the engine process (HTTP) and the URL
/// whose `/metrics` has the replica's `vllm:` gauges.
async fn start_serving(
    stack: &TestStack,
    profile: &str,
    serving: Serving,
) -> (Service, String, Service, Option<Service>, String) {
    if serving == Serving::Simulated {
        let (gateway, url, ingest) = start(stack, profile).await;
        return (gateway, url.clone(), ingest, None, url);
    }
    let profiles = stack.dir.path().join("tiny.yaml");
    std::fs::write(&profiles, profile).unwrap();
    let secret = tests::engine::random_secret();
    let (engine, engine_url) = tests::engine::start_engine_with(
        stack.dir.path(),
        1,
        &secret,
        &[("ENGINE_PROFILES", &profiles.display().to_string())],
    )
    .await;
    let upstreams = tests::engine::write_upstreams(
        &stack.dir.path().join("upstreams.yaml"),
        &[tests::engine::vllm_entry(
            "tiny",
            &engine_url,
            1024,
            "tiny-http",
            100,
            "",
        )],
    );
    let (gateway, url) = start_gateway_with(
        stack,
        1,
        &[
            ("GATEWAY_UPSTREAMS", upstreams),
            (tests::engine::SECRET_ENV, secret),
            ("GATEWAY_QUEUE", "on".into()),
            ("GATEWAY_REPLICA_REPORT_SECS", "1".into()),
            ("GATEWAY_REQUEST_TIMEOUT_SECS", "120".into()),
        ],
    )
    .await;
    (gateway, url, start_ingest(stack), Some(engine), engine_url)
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
    priority_5_preempts_the_lowest(Serving::Simulated, "preempt").await;
}

/// The same with the model behind an HTTP engine: the victim's connection
/// is closed (the engine aborts it) and it is sent again from the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_an_http_engine_a_waiting_priority_5_request_preempts_the_lowest_too() {
    priority_5_preempts_the_lowest(Serving::Http, "preempthttp").await;
}

async fn priority_5_preempts_the_lowest(serving: Serving, name: &str) {
    let stack = TestStack::new(name).await;
    seed(
        &stack,
        &[("batch", BATCH, 1), ("tools", TOOLS, 3), ("prod", PROD, 5)],
        "prod",
    )
    .await;
    let (mut gateway, url, ingest, engine, gauges) =
        start_serving(&stack, &tiny(1, None), serving).await;
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
        let m = tests::gateway::metrics(&gauges).await;
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
    busy_reported_equals_billed(&stack).await;
    drop((ingest, engine));
}

/// Waits for the last replica reports (a graceful stop writes them), then
/// checks that the replicas' reported busy GPU time is every request's
/// billed GPU time, lost work included, exactly.
async fn busy_reported_equals_billed(stack: &TestStack) {
    let billed = stack
        .decimal("SELECT coalesce(sum(gpu_seconds), 0) FROM request_log")
        .await;
    let mut busy = Decimal::ZERO;
    for _ in 0..120 {
        busy = stack
            .decimal("SELECT coalesce(sum(busy_gpu_seconds), 0) FROM replica_reports")
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
}

/// The owner's dedicated replicas' (busy, lent) GPU-seconds, as reported.
async fn owners_replica(stack: &TestStack) -> (Decimal, Decimal) {
    let (busy, lent): (Option<Decimal>, Option<Decimal>) = sqlx::query_as(
        "SELECT sum(busy_gpu_seconds), sum(lent_gpu_seconds) FROM dedicated_capacity_hourly
         WHERE owner_id = 'owner'",
    )
    .fetch_one(&stack.pool)
    .await
    .unwrap();
    (busy.unwrap_or_default(), lent.unwrap_or_default())
}

/// The borrower's `i`th request: ~40 of a tiny replica's 128 blocks.
fn borrow(i: usize, seed: u64) -> Value {
    json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": format!("borrow {i}:{}", " hello".repeat(620))}],
        "max_tokens": 40,
        "seed": seed,
    })
}

const OWNER: &str = "sk-test-preempt-owner";

/// The owner comes back to a full pool: its request waits, and at half its
/// budget (5 s) it takes its replica back from the borrower; every
/// borrowed request in `fill` still gets its answer (delay, not failure).
/// Then the gateway stops, every request is billed, and the owner's ran on
/// `its_replica`, which its event names as the owner's.
async fn the_owner_takes_it_back(
    stack: &TestStack,
    url: &str,
    gateway: &mut Service,
    ingest: &Service,
    fill: Vec<Answer>,
    its_replica: &str,
) {
    let borrowed = fill.len();
    let owner = send(
        url,
        OWNER,
        json!({"model": "tiny", "messages": [{"role": "user", "content": "mine"}], "max_tokens": 40, "seed": seed_for(1..=40)}),
    );
    let (status, took, text) = owner.await.unwrap();
    assert_eq!(status, 200, "{text}\n{}", gateway.log_tail());
    assert!(
        took >= Duration::from_millis(4_900),
        "it waited for the preemption point (5 s) first: {took:?}"
    );
    one_preemption(url, "borrower", "owner").await;
    for f in fill {
        let (status, _, text) = f.await.unwrap();
        assert_eq!(status, 200, "{}", &text[..text.len().min(300)]);
    }
    assert!(gateway.terminate(Duration::from_secs(30)).await.is_some());
    wait_for_log(stack, "borrower", borrowed, &[gateway, ingest]).await;
    wait_for_log(stack, "owner", 1, &[gateway, ingest]).await;
    let (replica, dedicated_to): (String, Option<String>) = sqlx::query_as(
        "SELECT replica_id, dedicated_to FROM request_log WHERE tenant_id = 'owner'",
    )
    .fetch_one(&stack.pool)
    .await
    .unwrap();
    assert_eq!(
        (replica.as_str(), dedicated_to.as_deref()),
        (its_replica, Some("owner"))
    );
}

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
    let borrow_seed = seed_for(600..=700);
    // The owner is idle: its replica is lent. The borrower's four requests
    // (~40 of a replica's 128 blocks each, ~10 s) run two on each replica:
    // both past best effort's 60%.
    let mut fill = Vec::new();
    for i in 0..4 {
        fill.push(send(BORROWER, borrow(i, borrow_seed)));
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
    the_owner_takes_it_back(&stack, &url, &mut gateway, &ingest, fill, "tiny-r0").await;

    // The victim was the borrower's work on the owner's replica, and it
    // finished on the shared replica (the owner's replica was not lent
    // again while the owner waited or ran), so its event cannot say that
    // part of its GPU time was spent on the owner's replica.
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

    busy_reported_equals_billed(&stack).await;
    // The owner's replica: its busy time is the owner's own usage there
    // plus what it lent — the lost attempt included, which the events that
    // ended there do not hold.
    let (r0_busy, lent) = owners_replica(&stack).await;
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

/// The same taking back over HTTP: two `engine` processes as two vLLM
/// URLs of `tiny`, one `dedicated_to` the owner. The borrower's work fills
/// both (the owner's is lent while it is idle); the owner's
/// request finds no room, waits, and at half its budget the gateway closes
/// the lent request on the owner's replica (the engine aborts it), which
/// runs again elsewhere. The owner's replica's reported time is its own
/// usage plus what it lent, the aborted attempt included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_takes_its_lent_vllm_replica_back() {
    let stack = TestStack::new("ownerpreempthttp").await;
    seed(
        &stack,
        &[("owner", OWNER, 2), ("borrower", BORROWER, 4)],
        "owner",
    )
    .await;
    let profiles = stack.dir.path().join("tiny.yaml");
    std::fs::write(&profiles, tiny(1, None)).unwrap();
    let secret = tests::engine::random_secret();
    let profiles_env = profiles.display().to_string();
    let tiny_engine = [("ENGINE_PROFILES", profiles_env.as_str())];
    let (own_engine, own_url) =
        tests::engine::start_engine_with(stack.dir.path(), 1, &secret, &tiny_engine).await;
    let (shared_engine, shared_url) =
        tests::engine::start_engine_with(stack.dir.path(), 1, &secret, &tiny_engine).await;
    let upstreams = tests::engine::write_upstreams(
        &stack.dir.path().join("upstreams.yaml"),
        &[
            tests::engine::vllm_entry(
                "tiny",
                &own_url,
                1024,
                "tiny-own",
                100,
                "    dedicated_to: owner\n",
            ),
            tests::engine::vllm_entry("tiny", &shared_url, 1024, "tiny-shared", 100, ""),
        ],
    );
    let (mut gateway, url) = start_gateway_with(
        &stack,
        1,
        &[
            ("GATEWAY_UPSTREAMS", upstreams),
            (tests::engine::SECRET_ENV, secret.clone()),
            ("GATEWAY_QUEUE", "on".into()),
            ("GATEWAY_REPLICA_REPORT_SECS", "1".into()),
            ("GATEWAY_REQUEST_TIMEOUT_SECS", "120".into()),
        ],
    )
    .await;
    let ingest = start_ingest(&stack);
    let send = |key: &'static str, body: Value| send(&url, key, body);
    let borrow_seed = seed_for(600..=700);
    // Five of ~40 blocks each: the shared replica takes three (the third
    // waits there: its blocks would pass 92%), refuses the fourth and the
    // fifth, which the owner's idle replica takes (lent).
    let mut fill = Vec::new();
    for i in 0..5 {
        fill.push(send(BORROWER, borrow(i, borrow_seed)));
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut runs = Vec::new();
        for base in [&own_url, &shared_url] {
            let m = tests::gateway::metrics(base).await;
            runs.push(
                per_replica(&m, "vllm:num_requests_running")
                    .values()
                    .sum::<f64>(),
            );
        }
        if runs == [2.0, 2.0] {
            break;
        }
        if Instant::now() >= deadline {
            let mut done = Vec::new();
            for f in fill {
                if f.is_finished() {
                    done.push(f.await.unwrap());
                }
            }
            panic!(
                "the replicas never filled ({runs:?} running; finished: {done:?}):\n{}",
                gateway.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    the_owner_takes_it_back(&stack, &url, &mut gateway, &ingest, fill, "tiny-own").await;
    let victims: Vec<(String, Decimal)> = sqlx::query_as(
        "SELECT replica_id, preempted_gpu_seconds FROM request_log
         WHERE tenant_id = 'borrower' AND preemptions > 0",
    )
    .fetch_all(&stack.pool)
    .await
    .unwrap();
    assert_eq!(victims.len(), 1, "{victims:?}");
    let (victim_replica, lost) = &victims[0];
    assert!(*lost > Decimal::ZERO, "{victims:?}");

    // Every GPU-second billed is a reported busy one, and the owner's
    // replica's is its own usage plus what it lent — the aborted attempt
    // included, which no event that ended there holds.
    busy_reported_equals_billed(&stack).await;
    let (own_busy, lent) = owners_replica(&stack).await;
    let own = stack
        .decimal("SELECT sum(gpu_seconds) FROM request_log WHERE tenant_id = 'owner'")
        .await;
    let ended_there = stack
        .decimal(
            "SELECT coalesce(sum(gpu_seconds), 0) FROM request_log
             WHERE dedicated_to = 'owner' AND tenant_id <> 'owner'",
        )
        .await;
    assert_eq!(
        own_busy,
        own + lent,
        "the owner's replica: own + lent = busy"
    );
    // The aborted attempt ran on the owner's replica: if the victim then
    // ended on the shared one, no event that ended there holds it.
    let aborted_elsewhere = if victim_replica == "tiny-own" {
        Decimal::ZERO
    } else {
        *lost
    };
    assert_eq!(
        lent,
        ended_there + aborted_elsewhere,
        "lent {lent}: the events that ended there {ended_there}, the victim ended on {victim_replica}"
    );
    drop((ingest, own_engine, shared_engine));
}
