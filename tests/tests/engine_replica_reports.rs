#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! An `engine` binary behind two gateways — two replicas of a model, one
//! dedicated to a tenant — has its replicas reported once, by one gateway
//! at a time: each replica's reports tile time from the engine's start with
//! no gap and no overlap; the reporter changes only when the one reporting
//! is SIGKILLed (the other takes over within the 15 s liveness expiry and
//! goes on from where the progress in Redis stopped); a restarted gateway
//! does not take the reports back while the other lives; each replica's
//! busy GPU-seconds equal, to the microsecond, the GPU time billed to the
//! requests that ran on it; and the dedicated replica's time reaches its
//! owner's reserved capacity.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde_json::json;
use tests::engine::{random_secret, start_engine_with, SECRET_ENV};
use tests::gateway::{seed_tenant, start_gateway_named, start_ingest, wait_for_log, TenantLimits};
use tests::{Service, TestStack};

const OWNER: &str = "sk-test-engine-reports-owner";
const OTHER: &str = "sk-test-engine-reports-other";
const MODEL: &str = "llama-3.1-8b";

/// The upstreams file putting the model behind the engine at `url`, its
/// replicas reported.
fn upstreams_file(stack: &TestStack, url: &str) -> String {
    let path = stack.dir.path().join("upstreams.yaml");
    std::fs::write(
        &path,
        format!(
            "upstreams:\n  - model: {MODEL}\n    url: {url}\n    gpus: 1\n    max_context: 131072\n    kv_poll_ms: 0\n    identity_secret_env: {SECRET_ENV}\n    replica_reports: true\n"
        ),
    )
    .unwrap();
    path.display().to_string()
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
) -> BTreeMap<&'a str, Vec<&'a Row>> {
    let mut by_replica: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for row in rows {
        by_replica.entry(row.0.as_str()).or_default().push(row);
    }
    for (replica, rows) in &by_replica {
        // The engine is the reporter of its replicas, whichever gateway sent it.
        assert!(
            rows.iter()
                .all(|r| r.2 == rows[0].2 && r.2.starts_with("engine-")),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_gateway_at_a_time_reports_the_engines_replicas_and_a_killed_one_is_replaced_without_gap_or_overlap(
) {
    let stack = TestStack::new("enginereports").await;
    let limits = TenantLimits {
        rpm: Some(100_000),
        tpm: Some(100_000_000),
        ..Default::default()
    };
    seed_tenant(&stack, "owner-co", OWNER, limits).await;
    seed_tenant(&stack, "other-co", OTHER, limits).await;
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
    let upstreams = upstreams_file(&stack, &engine_url);
    let (mut a, a_url) = gateway(&stack, "gw-a", &upstreams, &secret).await;
    let (mut b, b_url) = gateway(&stack, "gw-b", &upstreams, &secret).await;
    let ingest = start_ingest(&stack);

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
    wait_reporter(&survivor_url, Duration::from_secs(45), &[&engine, &ingest]).await;
    // The killed gateway comes back on its own outbox (what it had not yet
    // published goes out) and does not take the reports back.
    let (mut back, back_url) = gateway(&stack, first, &upstreams, &secret).await;
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
    wait_for_log(&stack, "owner-co", 18, &[&ingest, &engine]).await;
    wait_for_log(&stack, "other-co", 18, &[&ingest, &engine]).await;
    let rows = settled(&stack).await;

    let by_replica = check_each_replica(&stack, &rows).await;
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
    let reserved = stack
        .decimal(
            "SELECT sum(busy_gpu_seconds + idle_gpu_seconds) FROM dedicated_capacity_hourly
             WHERE owner_id = 'owner-co'",
        )
        .await;
    let reported: Decimal = dedicated.iter().map(|r| r.5 + r.6).sum();
    assert_eq!(reserved, reported, "owner-co's reserved GPU-seconds");
    let owners_on_it = stack
        .count(
            "SELECT count(*) FROM request_log WHERE tenant_id = 'owner-co' AND dedicated_to = 'owner-co'",
        )
        .await;
    assert!(owners_on_it > 0, "the owner's requests ran on its replica");
}

/// A gateway without Redis (`GATEWAY_LIMITS=local`) is alone: it reports
/// the engine's replicas with its progress in memory, from the engine's
/// start to its own graceful stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_without_redis_reports_the_engines_replicas_alone() {
    let stack = TestStack::new("enginereportslocal").await;
    let limits = TenantLimits {
        rpm: Some(100_000),
        tpm: Some(100_000_000),
        ..Default::default()
    };
    seed_tenant(&stack, "owner-co", OWNER, limits).await;
    seed_tenant(&stack, "other-co", OTHER, limits).await;
    let secret = random_secret();
    let (engine, engine_url) = start_engine_with(stack.dir.path(), 20, &secret, &[]).await;
    let upstreams = upstreams_file(&stack, &engine_url);
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
    let by_replica = check_each_replica(&stack, &rows).await;
    assert_eq!(
        by_replica.keys().copied().collect::<Vec<_>>(),
        ["llama-3.1-8b-r0"]
    );
}
