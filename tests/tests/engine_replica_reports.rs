#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! An HTTP upstream behind two gateways has its replicas reported once,
//! by one gateway at a time — an `engine` binary (two replicas of a
//! model, one dedicated to a tenant) from its own GPU-time figures, and a
//! vLLM stand-in (the engine without `replica_reports`) from the gateways'
//! shared GPU ledger: each replica's reports tile time from the source's
//! start with no gap and no overlap; the reporter changes only when the
//! one reporting is SIGKILLed (the other takes over within the 15 s
//! liveness expiry and goes on from where the progress in Redis stopped);
//! a restarted gateway does not take the reports back while the other
//! lives; each replica's busy GPU-seconds equal, to the microsecond, the
//! GPU time billed to the requests that ran on it; the dedicated replica's
//! time reaches its owner's reserved capacity, and a shared replica's idle
//! time the fleet's idle pool.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde_json::json;
use tests::engine::{random_secret, start_engine_with, vllm_entry, SECRET_ENV};
use tests::gateway::{seed_tenant, start_gateway_named, start_ingest, wait_for_log, TenantLimits};
use tests::{Service, TestStack};

const OWNER: &str = "sk-test-engine-reports-owner";
const OTHER: &str = "sk-test-engine-reports-other";
const MODEL: &str = "llama-3.1-8b";

/// Where the replicas' GPU time is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The engine serves it (`replica_reports: true`).
    Engine,
    /// The gateways' shared GPU ledger (as for vLLM, which serves none).
    Ledger,
}

/// The replica id the vLLM stand-in's events and reports carry.
const VLLM_REPLICA: &str = "vllm-8b";

/// The upstreams file putting the model behind the engine at `url`.
fn upstreams_file(stack: &TestStack, url: &str, source: Source) -> String {
    let path = stack.dir.path().join("upstreams.yaml");
    let entry = match source {
        Source::Engine => format!(
            "  - model: {MODEL}\n    url: {url}\n    gpus: 1\n    max_context: 131072\n    kv_poll_ms: 0\n    identity_secret_env: {SECRET_ENV}\n    replica_reports: true\n"
        ),
        Source::Ledger => vllm_entry(MODEL, url, 131_072, VLLM_REPLICA, 0, ""),
    };
    tests::engine::write_upstreams(&path, &[entry])
}

/// Gateway `id` on the shared Redis in front of the engine's upstreams file.
async fn gateway(stack: &TestStack, id: &str, upstreams: &str, secret: &str) -> (Service, String) {
    start_gateway_named(
        stack,
        id,
        20,
        &[
            ("GATEWAY_UPSTREAMS", upstreams.to_owned()),
            ("GATEWAY_REPLICA_REPORT_SECS", "1".into()),
            (SECRET_ENV, secret.to_owned()),
        ],
    )
    .await
}

/// Sends `n` requests through `url`, the owner's and the other tenant's in
/// turn, each answered 200.
async fn traffic(url: &str, n: usize, tag: &str) {
    let client = reqwest::Client::new();
    let mut sent = Vec::new();
    for i in 0..n {
        let (client, url) = (client.clone(), url.to_owned());
        let key = if i % 2 == 0 { OWNER } else { OTHER };
        let body = json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": format!("{tag} {i}")}],
            "max_tokens": 30,
            "stream": i % 4 < 2,
        });
        sent.push(tokio::spawn(async move {
            let res = client
                .post(format!("{url}/v1/chat/completions"))
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200);
            res.bytes().await.unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    for s in sent {
        s.await.unwrap();
    }
}

/// One stored report: (replica, dedicated to, reporter, start, end, busy, idle).
type Row = (
    String,
    Option<String>,
    String,
    DateTime<Utc>,
    DateTime<Utc>,
    Decimal,
    Decimal,
);

/// The model's reports in time order per replica.
async fn reports(stack: &TestStack) -> Vec<Row> {
    sqlx::query_as(
        "SELECT replica_id, dedicated_to, reporter_id, interval_start, interval_end,
                busy_gpu_seconds, idle_gpu_seconds
         FROM replica_reports WHERE model = $1
         ORDER BY replica_id, interval_start, interval_end",
    )
    .bind(MODEL)
    .fetch_all(&stack.pool)
    .await
    .unwrap()
}

/// Waits until the stored reports stop changing (the outboxes drained).
async fn settled(stack: &TestStack) -> Vec<Row> {
    let mut last = reports(stack).await;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(750)).await;
        let now = reports(stack).await;
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("replica reports still arriving after 45 s")
}

/// Whether the gateway at `url` is the engine's reporter now
/// (`gateway_replica_reporter` on its `/metrics`).
async fn reports_now(url: &str) -> bool {
    tests::gateway::metrics(url)
        .await
        .lines()
        .any(|l| l.starts_with("gateway_replica_reporter{") && l.ends_with(" 1"))
}

/// Waits until the gateway at `url` is the reporter.
async fn wait_reporter(url: &str, within: Duration, logs: &[&Service]) {
    let deadline = Instant::now() + within;
    while !reports_now(url).await {
        let tails: Vec<String> = logs.iter().map(|s| s.log_tail()).collect();
        assert!(
            Instant::now() < deadline,
            "{url} not the reporter within {within:?}:\n{}",
            tails.join("\n---\n")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Per replica: one reporter (the engine instance), intervals that tile
/// time, busy time equal to its requests' billed GPU time exactly, some
/// idle time. The rows by replica.
async fn check_each_replica<'a>(
    stack: &TestStack,
    rows: &'a [Row],
    reporter: &str,
) -> BTreeMap<&'a str, Vec<&'a Row>> {
    let mut by_replica: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for row in rows {
        by_replica.entry(row.0.as_str()).or_default().push(row);
    }
    for (replica, rows) in &by_replica {
        // The source is the reporter of its replicas, whichever gateway sent it.
        assert!(
            rows.iter()
                .all(|r| r.2 == rows[0].2 && r.2.starts_with(reporter)),
            "{replica}: {rows:?}"
        );
        // The intervals tile time: each starts where the last ended.
        for pair in rows.windows(2) {
            assert_eq!(
                pair[0].4, pair[1].3,
                "{replica}: a gap or an overlap between {:?} and {:?}",
                pair[0], pair[1]
            );
        }
        // Busy time reported = GPU time billed to its requests, exactly.
        let busy: Decimal = rows.iter().map(|r| r.5).sum();
        let billed = stack
            .decimal(&format!(
                "SELECT coalesce(sum(gpu_seconds), 0) FROM request_log WHERE replica_id = '{replica}'"
            ))
            .await;
        assert_eq!(
            busy, billed,
            "{replica}: reported busy vs billed GPU-seconds"
        );
        let idle: Decimal = rows.iter().map(|r| r.6).sum();
        assert!(idle > Decimal::ZERO, "{replica}: idle time is reported");
    }
    by_replica
}

/// Two gateways on the shared Redis in front of `upstreams`, traffic
/// through both, the reporter SIGKILLed and the other taking over, the
/// killed one restarted (it does not take the reports back), both stopped
/// gracefully; every request billed. The stored reports once settled.
async fn reported_across_a_kill(
    stack: &TestStack,
    upstreams: &str,
    secret: &str,
    engine: &Service,
) -> Vec<Row> {
    let (mut a, a_url) = gateway(stack, "gw-a", upstreams, secret).await;
    let (mut b, b_url) = gateway(stack, "gw-b", upstreams, secret).await;
    let ingest = start_ingest(stack);

    traffic(&a_url, 10, "through a").await;
    traffic(&b_url, 10, "through b").await;
    // Both tick every second; exactly one of them is the reporter.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (a_reports, b_reports) = (reports_now(&a_url).await, reports_now(&b_url).await);
    assert!(
        a_reports != b_reports,
        "one reporter while both live (a: {a_reports}, b: {b_reports})\n{}\n---\n{}",
        a.log_tail(),
        b.log_tail()
    );
    let (first, survivor, survivor_url) = if a_reports {
        ("gw-a", "gw-b", b_url.clone())
    } else {
        ("gw-b", "gw-a", a_url.clone())
    };

    // The reporter dies; the other takes over once its liveness key expires.
    let killed = if a_reports { &mut a } else { &mut b };
    killed.kill9().await;
    traffic(&survivor_url, 10, "after the kill").await;
    wait_reporter(&survivor_url, Duration::from_secs(45), &[engine, &ingest]).await;
    // The killed gateway comes back on its own outbox (what it had not yet
    // published goes out) and does not take the reports back.
    let (mut back, back_url) = gateway(stack, first, upstreams, secret).await;
    traffic(&survivor_url, 6, "after the restart").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !reports_now(&back_url).await,
        "{first} took the reports back"
    );
    assert!(
        reports_now(&survivor_url).await,
        "{survivor} stopped reporting"
    );
    assert!(back.terminate(Duration::from_secs(30)).await.is_some());
    // The survivor's graceful stop reports the last interval.
    let survivor_service = if a_reports { &mut b } else { &mut a };
    assert!(survivor_service
        .terminate(Duration::from_secs(30))
        .await
        .is_some());
    wait_for_log(stack, "owner-co", 18, &[&ingest, engine]).await;
    wait_for_log(stack, "other-co", 18, &[&ingest, engine]).await;
    settled(stack).await
}

/// Two tenants with limits far above the traffic.
async fn seed_tenants(stack: &TestStack) {
    let limits = TenantLimits {
        rpm: Some(100_000),
        tpm: Some(100_000_000),
        ..Default::default()
    };
    seed_tenant(stack, "owner-co", OWNER, limits).await;
    seed_tenant(stack, "other-co", OTHER, limits).await;
}

/// owner-co's reserved capacity in billing is its dedicated replicas'
/// reported busy + idle time, `dedicated`, exactly.
async fn reserved_is_reported<'a>(stack: &TestStack, dedicated: impl Iterator<Item = &'a Row>) {
    let reserved = stack
        .decimal(
            "SELECT sum(busy_gpu_seconds + idle_gpu_seconds) FROM dedicated_capacity_hourly
             WHERE owner_id = 'owner-co'",
        )
        .await;
    let reported: Decimal = dedicated.map(|r| r.5 + r.6).sum();
    assert_eq!(reserved, reported, "owner-co's reserved GPU-seconds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_gateway_at_a_time_reports_the_engines_replicas_and_a_killed_one_is_replaced_without_gap_or_overlap(
) {
    let stack = TestStack::new("enginereports").await;
    seed_tenants(&stack).await;
    let secret = random_secret();
    let (engine, engine_url) = start_engine_with(
        stack.dir.path(),
        20,
        &secret,
        &[
            ("ENGINE_REPLICAS", "llama-3.1-8b=2"),
            ("ENGINE_DEDICATED", "llama-3.1-8b:owner-co=1"),
        ],
    )
    .await;
    let upstreams = upstreams_file(&stack, &engine_url, Source::Engine);
    let rows = reported_across_a_kill(&stack, &upstreams, &secret, &engine).await;

    let by_replica = check_each_replica(&stack, &rows, "engine-").await;
    assert_eq!(
        by_replica.keys().copied().collect::<Vec<_>>(),
        ["llama-3.1-8b-r0", "llama-3.1-8b-r1"],
        "both replicas reported"
    );
    // The dedicated replica's time is its owner's reserved capacity.
    let dedicated: Vec<&&Row> = by_replica
        .values()
        .flatten()
        .filter(|r| r.1.as_deref() == Some("owner-co"))
        .collect();
    assert!(
        !dedicated.is_empty(),
        "one replica is dedicated to owner-co"
    );
    reserved_is_reported(&stack, dedicated.iter().copied().copied()).await;
    let owners_on_it = stack
        .count(
            "SELECT count(*) FROM request_log WHERE tenant_id = 'owner-co' AND dedicated_to = 'owner-co'",
        )
        .await;
    assert!(owners_on_it > 0, "the owner's requests ran on its replica");
}

/// vLLM serves no GPU time: the replica's busy time is what the gateways'
/// shared ledger counted over both of them, its idle time the rest, and
/// one gateway at a time reports it, through a SIGKILL, as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vllm_replica_is_reported_once_from_the_gateways_shared_ledger() {
    let stack = TestStack::new("ledgerreports").await;
    seed_tenants(&stack).await;
    let secret = random_secret();
    let (engine, engine_url) = start_engine_with(stack.dir.path(), 20, &secret, &[]).await;
    let upstreams = upstreams_file(&stack, &engine_url, Source::Ledger);
    let rows = reported_across_a_kill(&stack, &upstreams, &secret, &engine).await;

    let by_replica = check_each_replica(&stack, &rows, "ledger-").await;
    assert_eq!(
        by_replica.keys().copied().collect::<Vec<_>>(),
        [VLLM_REPLICA],
        "the one replica, under the name its usage events carry"
    );
    // A shared replica's idle time is the fleet's idle pool, exactly (with
    // the gateways' own simulated replicas of the other models).
    let idle: Decimal = rows.iter().map(|r| r.6).sum();
    let simulated = stack
        .decimal(
            "SELECT coalesce(sum(idle_gpu_seconds), 0) FROM replica_reports
             WHERE dedicated_to IS NULL AND model <> 'llama-3.1-8b'",
        )
        .await;
    let pooled = stack
        .decimal("SELECT coalesce(sum(gpu_seconds), 0) FROM fleet_idle_hourly")
        .await;
    assert_eq!(
        pooled,
        idle + simulated,
        "the idle pool holds the replica's idle time"
    );
    // The reports cover the replica's wall time since the ledger began
    // (from the first gateway's first look, before any traffic), to
    // within the clocks' milliseconds: busy + idle = the span × 1 GPU.
    let first = rows.first().unwrap().3;
    let last = rows.last().unwrap().4;
    let span = Decimal::new((last - first).num_milliseconds(), 3);
    let covered: Decimal = rows.iter().map(|r| r.5 + r.6).sum();
    assert!(
        (covered - span).abs() < Decimal::new(5, 2),
        "busy + idle {covered} GPU-s over a span of {span} s"
    );
}

/// A gateway without Redis (`GATEWAY_LIMITS=local`) is alone: it reports
/// the upstream's replicas with its progress in memory, from the source's
/// start to its own graceful stop. The replicas' ids.
async fn reported_alone(name: &str, source: Source) -> Vec<String> {
    let stack = TestStack::new(name).await;
    seed_tenants(&stack).await;
    let secret = random_secret();
    let (engine, engine_url) = start_engine_with(stack.dir.path(), 20, &secret, &[]).await;
    let upstreams = upstreams_file(&stack, &engine_url, source);
    let (mut gateway, url) = start_gateway_named(
        &stack,
        "gw-alone",
        20,
        &[
            ("GATEWAY_UPSTREAMS", upstreams),
            ("GATEWAY_REPLICA_REPORT_SECS", "1".into()),
            ("GATEWAY_LIMITS", "local".into()),
            (SECRET_ENV, secret.clone()),
        ],
    )
    .await;
    let ingest = start_ingest(&stack);
    traffic(&url, 10, "alone").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(reports_now(&url).await, "{}", gateway.log_tail());
    assert!(gateway.terminate(Duration::from_secs(30)).await.is_some());
    wait_for_log(&stack, "owner-co", 5, &[&ingest, &engine]).await;
    wait_for_log(&stack, "other-co", 5, &[&ingest, &engine]).await;
    let rows = settled(&stack).await;
    let reporter = match source {
        Source::Engine => "engine-",
        Source::Ledger => "ledger-",
    };
    let by_replica = check_each_replica(&stack, &rows, reporter).await;
    by_replica.keys().map(|k| (*k).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_without_redis_reports_the_engines_replicas_alone() {
    let replicas = reported_alone("enginereportslocal", Source::Engine).await;
    assert_eq!(replicas, ["llama-3.1-8b-r0"]);
}

/// The same for vLLM, from the gateway's own ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_without_redis_reports_a_vllm_replica_from_its_own_ledger() {
    let replicas = reported_alone("ledgerreportslocal", Source::Ledger).await;
    assert_eq!(replicas, [VLLM_REPLICA]);
}

/// (tenant, replica, dedicated to, started, finished, GPU-seconds) of every request.
type Ran = (
    String,
    String,
    Option<String>,
    DateTime<Utc>,
    DateTime<Utc>,
    Decimal,
);

async fn ran(stack: &TestStack) -> Vec<Ran> {
    sqlx::query_as(
        "SELECT tenant_id, replica_id, dedicated_to, started_at, finished_at, gpu_seconds
         FROM request_log ORDER BY started_at",
    )
    .fetch_all(&stack.pool)
    .await
    .unwrap()
}

/// A vLLM replica dedicated to a tenant (`dedicated_to` in the upstreams
/// file) next to a shared one: the owner's requests run on it; another
/// tenant's start there only while the owner has nothing on it (lent) —
/// with the shared replica gone they run there, and while the owner runs
/// a long stream there one waits in the queue and starts when the owner's
/// stream ends; the replica's reports are the owner's reserved capacity,
/// and their lent time is exactly what the other tenant was billed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dedicated_vllm_replica_serves_its_owner_first_and_lends_only_while_it_is_idle() {
    let stack = TestStack::new("ledgerdedicated").await;
    seed_tenants(&stack).await;
    // Another tenant may wait up to 10 s for a replica.
    sqlx::query("UPDATE tenants SET slo_ttft_p95_ms = 10000 WHERE tenant_id = 'other-co'")
        .execute(&stack.pool)
        .await
        .unwrap();
    let secret = random_secret();
    let (own_engine, own_url) = start_engine_with(stack.dir.path(), 1, &secret, &[]).await;
    let (mut shared_engine, shared_url) =
        start_engine_with(stack.dir.path(), 1, &secret, &[]).await;
    let upstreams = tests::engine::write_upstreams(
        &stack.dir.path().join("upstreams-dedicated.yaml"),
        &[
            vllm_entry(
                MODEL,
                &own_url,
                131_072,
                "vllm-own",
                0,
                "    dedicated_to: owner-co\n",
            ),
            vllm_entry(MODEL, &shared_url, 131_072, "vllm-shared", 0, ""),
        ],
    );
    let (mut gateway, url) = tests::gateway::start_gateway_with(
        &stack,
        1,
        &[
            ("GATEWAY_UPSTREAMS", upstreams),
            ("GATEWAY_REPLICA_REPORT_SECS", "1".into()),
            (SECRET_ENV, secret.clone()),
        ],
    )
    .await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    let ask = |key: &'static str, text: &str, seed: u64, stream: bool| {
        client.post(&chat).bearer_auth(key).json(&json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 1_000,
            "seed": seed,
            "stream": stream,
        }))
    };

    // Both tenants at once: the owner on its replica, the other wherever
    // it may.
    traffic(&url, 12, "both").await;
    // The shared replica goes away: the other tenant runs on the owner's
    // idle replica.
    shared_engine.kill9().await;
    for i in 0..3 {
        let res = ask(OTHER, "lent", i, false).send().await.unwrap();
        assert_eq!(res.status(), 200, "{}", gateway.log_tail());
        res.bytes().await.unwrap();
    }
    // The owner runs a long stream there: the other tenant's request waits
    // (no replica for it), and starts once the owner's stream ends.
    // 500 tokens or more: several seconds in real time.
    let long = tests::engine::seed_for_long_answer(3, 500);
    let mut owners = ask(OWNER, "a long one", long, true).send().await.unwrap();
    assert_eq!(owners.status(), 200);
    assert_eq!(tests::gateway::read_sse(&mut owners, 2).await.len(), 2);
    let waiting = tokio::spawn(ask(OTHER, "after the owner", 1, false).send());
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    if waiting.is_finished() {
        let res = waiting.await.unwrap().unwrap();
        panic!(
            "it did not wait for the owner's stream: {} {}",
            res.status(),
            res.text().await.unwrap()
        );
    }
    drop(owners);
    let res = waiting.await.unwrap().unwrap();
    assert_eq!(res.status(), 200, "{}", gateway.log_tail());
    res.bytes().await.unwrap();

    assert!(gateway.terminate(Duration::from_secs(30)).await.is_some());
    wait_for_log(&stack, "owner-co", 7, &[&ingest, &own_engine]).await;
    wait_for_log(&stack, "other-co", 10, &[&ingest, &own_engine]).await;
    let rows = settled(&stack).await;
    let requests = ran(&stack).await;

    let on_own: Vec<&Ran> = requests.iter().filter(|r| r.1 == "vllm-own").collect();
    assert!(
        requests
            .iter()
            .filter(|r| r.0 == "owner-co")
            .all(|r| r.1 == "vllm-own" && r.2.as_deref() == Some("owner-co")),
        "the owner ran on its replica: {requests:?}"
    );
    assert!(
        on_own.iter().all(|r| r.2.as_deref() == Some("owner-co")),
        "every request on it names its owner: {on_own:?}"
    );
    // No other tenant's request started there while the owner ran there.
    for lent in on_own.iter().filter(|r| r.0 == "other-co") {
        for owner in on_own.iter().filter(|r| r.0 == "owner-co") {
            assert!(
                !(owner.3 < lent.3 && lent.3 < owner.4),
                "{lent:?} started during {owner:?}"
            );
        }
    }
    let lent_billed: Decimal = on_own
        .iter()
        .filter(|r| r.0 == "other-co")
        .map(|r| r.5)
        .sum();
    assert!(lent_billed > Decimal::ZERO, "it was lent: {requests:?}");

    let by_replica = check_each_replica(&stack, &rows, "ledger-").await;
    assert_eq!(
        by_replica.keys().copied().collect::<Vec<_>>(),
        ["vllm-own", "vllm-shared"]
    );
    assert!(by_replica["vllm-own"]
        .iter()
        .all(|r| r.1.as_deref() == Some("owner-co")));
    assert!(by_replica["vllm-shared"].iter().all(|r| r.1.is_none()));
    let lent_reported = stack
        .decimal("SELECT sum(lent_gpu_seconds) FROM replica_reports WHERE replica_id = 'vllm-own'")
        .await;
    assert_eq!(
        lent_reported, lent_billed,
        "lent time = what the other tenant was billed there"
    );
    reserved_is_reported(&stack, by_replica["vllm-own"].iter().copied()).await;
}
