#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! What the fleet layer did reaches billing exactly once, through the real
//! gateway, broker and ingest: every usage event is schema v2 with its
//! placement; each simulated replica's busy and idle GPU time arrives as
//! replica reports (a shared replica's idle time in `fleet_idle_hourly`, a
//! dedicated one's time under its owner); the usage that ran on the
//! dedicated replica is counted by owner and tenant; and the replicas' busy
//! GPU time equals, to the microsecond, the GPU time billed to requests.

use std::time::Duration;

use rust_decimal::Decimal;
use serde_json::json;
use tests::gateway::{seed_tenant, start_gateway_with, start_ingest, wait_for_log, TenantLimits};
use tests::TestStack;

const OWNER: &str = "sk-test-capacity-owner";
const BORROWER: &str = "sk-test-capacity-borrower";

fn generous() -> TenantLimits {
    TenantLimits {
        rpm: Some(100_000),
        tpm: Some(100_000_000),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_reports_and_dedicated_usage_reach_billing_exactly_once() {
    let stack = TestStack::new("fleetcap").await;
    seed_tenant(&stack, "owner-co", OWNER, generous()).await;
    seed_tenant(&stack, "borrower-co", BORROWER, generous()).await;
    let (mut gateway, url) = start_gateway_with(
        &stack,
        20,
        &[
            ("ENGINE_REPLICAS", "llama-3.1-8b=3".into()),
            ("ENGINE_DEDICATED", "llama-3.1-8b:owner-co=1".into()),
            ("GATEWAY_REPLICA_REPORT_SECS", "1".into()),
        ],
    )
    .await;
    let ingest = start_ingest(&stack);
    let client = reqwest::Client::new();
    let chat = format!("{url}/v1/chat/completions");
    let mut sent = Vec::new();
    for i in 0..24 {
        let key = if i % 2 == 0 { OWNER } else { BORROWER };
        let body = json!({
            "model": "llama-3.1-8b",
            "messages": [{"role": "user", "content": format!("capacity {i}")}],
            "max_tokens": 40,
            "stream": i % 3 == 0,
        });
        let client = client.clone();
        let chat = chat.clone();
        sent.push(tokio::spawn(async move {
            let res = client
                .post(&chat)
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200);
            res.bytes().await.unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    for s in sent {
        s.await.unwrap();
    }
    // Let a few reporting intervals pass with the replicas idle.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // A graceful stop reports the last interval, after the last request.
    assert!(gateway.terminate(Duration::from_secs(30)).await.is_some());
    wait_for_log(&stack, "owner-co", 12, &[&gateway, &ingest]).await;
    wait_for_log(&stack, "borrower-co", 12, &[&gateway, &ingest]).await;
    let reports = stack.count("SELECT count(*) FROM replica_reports").await;
    // Reports go out in order per replica; once the outbox is empty and
    // ingest has caught up, their count no longer moves.
    let mut last = -1;
    for _ in 0..40 {
        let now = stack.count("SELECT count(*) FROM replica_reports").await;
        if now == last && now > 0 {
            break;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        reports > 0 && last >= reports,
        "replica reports stored: {last}"
    );

    // Every event is v2: its placement is stored with it.
    let v1_rows = stack
        .count("SELECT count(*) FROM request_log WHERE pool IS NULL OR queue_wait_ms IS NULL OR preemptions IS NULL")
        .await;
    assert_eq!(v1_rows, 0, "every gateway event carries its placement");
    let wrong_pool = stack
        .count("SELECT count(*) FROM request_log WHERE pool <> 'llama-3.1-8b'")
        .await;
    assert_eq!(wrong_pool, 0);
    // The dedicated replica is the pool's first; only it names an owner.
    let misplaced = stack
        .count(
            "SELECT count(*) FROM request_log
             WHERE (replica_id = 'llama-3.1-8b-r0') <> (dedicated_to IS NOT DISTINCT FROM 'owner-co')",
        )
        .await;
    assert_eq!(
        misplaced, 0,
        "dedicated_to names the owner exactly on its replica"
    );
    let on_dedicated = stack
        .count("SELECT count(*) FROM request_log WHERE dedicated_to = 'owner-co' AND tenant_id = 'owner-co'")
        .await;
    assert!(
        on_dedicated > 0,
        "the owner's requests go to its own replica first"
    );

    // Busy GPU time reported by the replicas = GPU time billed to requests, exactly.
    let busy = stack
        .decimal("SELECT sum(busy_gpu_seconds) FROM replica_reports")
        .await;
    let billed = stack
        .decimal("SELECT sum(gpu_seconds) FROM usage_hourly")
        .await;
    assert!(billed > Decimal::ZERO);
    assert_eq!(
        busy, billed,
        "replicas' busy GPU-seconds vs requests' GPU-seconds"
    );
    // Per replica too: the dedicated one's time is its owner's.
    let dedicated_busy = stack.decimal("SELECT sum(busy_gpu_seconds) FROM dedicated_capacity_hourly WHERE owner_id = 'owner-co'",
    )
    .await;
    let ran_there = stack
        .decimal("SELECT sum(gpu_seconds) FROM request_log WHERE replica_id = 'llama-3.1-8b-r0'")
        .await;
    assert_eq!(dedicated_busy, ran_there);
    // Idle: the shared replicas' idle time is the overhead pool's, the
    // dedicated replica's is not.
    let shared_idle = stack
        .decimal("SELECT sum(idle_gpu_seconds) FROM replica_reports WHERE dedicated_to IS NULL")
        .await;
    let pool_idle = stack
        .decimal("SELECT sum(gpu_seconds) FROM fleet_idle_hourly")
        .await;
    assert!(
        shared_idle > Decimal::ZERO,
        "idle shared replicas report idle time"
    );
    assert_eq!(pool_idle, shared_idle);
    let dedicated_idle = stack
        .decimal("SELECT sum(idle_gpu_seconds) FROM dedicated_capacity_hourly")
        .await;
    let reported_dedicated_idle = stack
        .decimal(
            "SELECT sum(idle_gpu_seconds) FROM replica_reports WHERE dedicated_to = 'owner-co'",
        )
        .await;
    assert_eq!(dedicated_idle, reported_dedicated_idle);
    // The usage on the dedicated replica, by owner and tenant.
    let by_tenant: Vec<(String, i64, Decimal)> = sqlx::query_as(
        "SELECT tenant_id, sum(requests)::bigint, sum(gpu_seconds) FROM dedicated_usage_hourly
         WHERE owner_id = 'owner-co' GROUP BY tenant_id ORDER BY tenant_id",
    )
    .fetch_all(&stack.pool)
    .await
    .unwrap();
    let expected: Vec<(String, i64, Decimal)> = sqlx::query_as(
        "SELECT tenant_id, count(*), sum(gpu_seconds) FROM request_log
         WHERE dedicated_to = 'owner-co' GROUP BY tenant_id ORDER BY tenant_id",
    )
    .fetch_all(&stack.pool)
    .await
    .unwrap();
    assert_eq!(by_tenant, expected);
    // What the dedicated replica lent, as it counted it (report v2), is
    // what the borrower's events billed there (nothing was preempted).
    let lent_reported = stack.decimal("SELECT sum(lent_gpu_seconds) FROM dedicated_capacity_hourly WHERE owner_id = 'owner-co'",
    )
    .await;
    let lent_billed = stack.decimal("SELECT sum(gpu_seconds) FROM request_log WHERE dedicated_to = 'owner-co' AND tenant_id <> 'owner-co'",
    )
    .await;
    assert_eq!(
        lent_reported, lent_billed,
        "lent GPU-seconds, replica vs events"
    );
    assert_eq!(
        stack
            .count("SELECT count(*) FROM replica_reports WHERE lent_gpu_seconds IS NULL")
            .await,
        0,
        "every report is v2 and says what it lent"
    );

    // A re-sent report adds nothing; the same id with other figures is a
    // conflict dead letter, and counts nothing either.
    let (raw,): (String,) = sqlx::query_as(
        "SELECT json_build_object(
             'record', 'replica_report', 'report_version', 2, 'report_id', report_id,
             'replica_id', replica_id, 'model', model, 'reporter_id', reporter_id,
             'gpus', gpus,
             'interval_start', to_char(interval_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
             'interval_end', to_char(interval_end AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
             'busy_gpu_seconds', busy_gpu_seconds::text, 'idle_gpu_seconds', idle_gpu_seconds::text,
             'lent_gpu_seconds', lent_gpu_seconds::text)::text
         FROM replica_reports WHERE dedicated_to IS NULL AND idle_gpu_seconds > 0 LIMIT 1",
    )
    .fetch_one(&stack.pool)
    .await
    .unwrap();
    let mut conflicting: serde_json::Value = serde_json::from_str(&raw).unwrap();
    conflicting["idle_gpu_seconds"] = json!("0.000001");
    let producer = stack.producer();
    stack
        .produce(
            &producer,
            &[
                ("r".into(), raw.clone().into_bytes()),
                ("r".into(), serde_json::to_vec(&conflicting).unwrap()),
            ],
        )
        .await;
    stack
        .wait_count(
            "SELECT count(*) FROM dead_letters WHERE reason_code = 'conflict'",
            1,
            &ingest,
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(
        stack.count("SELECT count(*) FROM replica_reports").await,
        last,
        "a re-sent or conflicting report is not stored again"
    );
    assert_eq!(
        stack
            .decimal("SELECT sum(gpu_seconds) FROM fleet_idle_hourly")
            .await,
        pool_idle,
        "nor added again"
    );

    // And on the owner's invoice (billing-api, the reference price book;
    // the owner is priority 5: $3.50 per GPU-hour).
    let finance = "finance-token-for-fleet-capacity";
    let billing = tests::billing::start_billing_api(&stack.database_url, finance).await;
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let invoice: serde_json::Value = client
        .get(format!(
            "{}/v1/tenants/owner-co/invoices/{month}",
            billing.url
        ))
        .bearer_auth(finance)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let line = |kind: &str| -> Vec<serde_json::Value> {
        invoice["lines"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["kind"] == kind)
            .cloned()
            .collect()
    };
    let dec = |v: &serde_json::Value| -> Decimal { v.as_str().unwrap().parse().unwrap() };
    let rate = Decimal::new(350, 2);
    let hour = Decimal::from(3600);
    let cents = |d: Decimal| {
        d.round_dp_with_strategy(2, rust_decimal::RoundingStrategy::MidpointAwayFromZero)
    };
    let reserved = line("reserved");
    assert_eq!(reserved.len(), 1, "{invoice}");
    let capacity = dedicated_busy + dedicated_idle;
    assert_eq!(dec(&reserved[0]["quantity"]), (capacity / hour).round_dp(6));
    assert_eq!(dec(&reserved[0]["amount"]), cents(capacity * rate / hour));
    let lent = stack.decimal("SELECT sum(gpu_seconds) FROM request_log WHERE dedicated_to = 'owner-co' AND tenant_id <> 'owner-co'",
    )
    .await;
    let credits: Vec<Decimal> = line("credit").iter().map(|l| dec(&l["amount"])).collect();
    if lent > Decimal::ZERO {
        assert!(
            credits.contains(&-cents(lent * rate / hour)),
            "lent credit: {credits:?}"
        );
    }
    let sum: Decimal = invoice["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| dec(&l["amount"]))
        .sum();
    assert_eq!(dec(&invoice["total"]), sum);
    drop(billing);
    drop(ingest);
}
