//! Running ingest: SIGTERM commits what it holds, bad configuration stops it
//! with a message naming the setting, its metrics count outcomes, and dead
//! letters are re-driven exactly once after a fix.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::time::Duration;

use chrono::{DurationRound, TimeDelta, Utc};
use rust_decimal::Decimal;
use tests::process::{bin_dir, free_port};
use tests::{Service, TestStack};
use usage_contract::{FinishReason, RequestId, UsageEvent};

fn event(tenant: &str, n: i64) -> UsageEvent {
    let started_at = (Utc::now() - TimeDelta::minutes(5))
        .duration_trunc(TimeDelta::milliseconds(1))
        .unwrap();
    UsageEvent {
        schema_version: 1,
        request_id: RequestId::at(started_at),
        tenant_id: tenant.into(),
        api_key_id: "k".into(),
        model: "llama-3.1-8b".into(),
        model_version: "v".into(),
        priority: 3,
        started_at,
        first_token_at: None,
        finished_at: started_at,
        prompt_tokens: 50 + n,
        cached_tokens: 0,
        completion_tokens: n,
        gpu_seconds: Decimal::new(1_000 + n, 6),
        preempted_gpu_seconds: Decimal::ZERO,
        finish_reason: FinishReason::Stop,
        ttft_ms: None,
        tpot_ms: None,
        replica_id: "r".into(),
        gateway_id: "g".into(),
        stream: false,
    }
}

async fn add_tenant(pool: &sqlx::PgPool, tenant: &str) {
    sqlx::query(
        "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode)
         VALUES ($1, $1, 'standard', 3, 'per_token')",
    )
    .bind(tenant)
    .execute(pool)
    .await
    .unwrap();
}

/// Messages of partition 0 at offsets `first..`.
fn messages(first: i64, payloads: Vec<Vec<u8>>) -> Vec<ingest::batch::RawMessage> {
    (first..)
        .zip(payloads)
        .map(|(offset, payload)| ingest::batch::RawMessage {
            decoded: None,
            partition: 0,
            offset,
            payload,
        })
        .collect()
}

/// What ingest's batch transaction does with `msgs`, committed.
async fn apply_batch(
    pool: &sqlx::PgPool,
    msgs: &[ingest::batch::RawMessage],
) -> ingest::store::Counts {
    let decoded = ingest::batch::split(msgs, Utc::now());
    ingest::store::Partitions::default()
        .ensure(pool, decoded.firsts.iter().map(|c| &c.event))
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let counts = ingest::store::apply(&mut tx, decoded).await.unwrap();
    tx.commit().await.unwrap();
    counts
}

async fn count(stack: &TestStack, sql: &str) -> i64 {
    sqlx::query_as::<_, (i64,)>(sql)
        .fetch_one(&stack.pool)
        .await
        .unwrap()
        .0
}

async fn wait_until(stack: &TestStack, sql: &str, expected: i64, service: &Service) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while count(stack, sql).await != expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "`{sql}` never reached {expected}:\n{}",
            service.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ingest(stack: &TestStack, extra: &[(&str, &str)]) -> Service {
    let mut env = stack.env();
    env.insert(
        "INGEST_METRICS_ADDR".into(),
        format!("127.0.0.1:{}", free_port()),
    );
    for (k, v) in extra {
        env.insert((*k).into(), (*v).into());
    }
    Service::start("ingest", "ingest", &[], env, stack.dir.path())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_commits_the_batch_in_memory() {
    let stack = TestStack::new("sigterm").await;
    add_tenant(&stack.pool, "acme-corp").await;
    // A batch that would only be flushed after a minute: only a graceful
    // shutdown can commit it in time.
    let mut svc = ingest(
        &stack,
        &[
            ("INGEST_LINGER_MS", "60000"),
            ("INGEST_MAX_BATCH", "100000"),
        ],
    );
    let msgs: Vec<(String, Vec<u8>)> = (0..500)
        .map(|n| ("acme-corp".to_owned(), event("acme-corp", n).to_json()))
        .collect();
    stack.produce(&stack.producer(), &msgs).await;
    // Long enough for the group join (~3 s) and the fetch; nothing is committed yet.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        count(&stack, "SELECT count(*) FROM request_log").await,
        0,
        "linger should hold the batch"
    );
    let status = svc
        .terminate(Duration::from_secs(30))
        .await
        .expect("ingest exited");
    assert!(status.success(), "exit {status}:\n{}", svc.log_tail());
    assert_eq!(
        count(&stack, "SELECT count(*) FROM request_log").await,
        500,
        "{}",
        svc.log_tail()
    );
    assert_eq!(
        count(
            &stack,
            "SELECT coalesce(sum(next_offset), 0)::bigint FROM consumer_offsets"
        )
        .await,
        500
    );
}

#[tokio::test]
async fn bad_configuration_exits_non_zero_naming_the_setting() {
    for (bin, var, value) in [
        ("ingest", "INGEST_MAX_BATCH", "0"),
        ("ingest", "DATABASE_URL", "mysql://nope"),
        ("gateway-lite", "GATEWAY_KEY_REFRESH_MS", "5"),
        ("gateway-lite", "GATEWAY_REQUEST_TIMEOUT_SECS", "0"),
        ("billing-api", "BILLING_BOOTSTRAP_FINANCE_TOKEN", "short"),
    ] {
        let out = std::process::Command::new(bin_dir().join(bin))
            .env(var, value)
            .env("INGEST_METRICS_ADDR", format!("127.0.0.1:{}", free_port()))
            .env("GATEWAY_ADDR", format!("127.0.0.1:{}", free_port()))
            .env("BILLING_ADDR", format!("127.0.0.1:{}", free_port()))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{bin} with {var}={value} should refuse to start"
        );
        assert!(
            stderr.contains(var),
            "{bin}: the error should name {var}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{bin}: no panic: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_each_outcome() {
    let stack = TestStack::new("metrics").await;
    add_tenant(&stack.pool, "acme-corp").await;
    let port = free_port();
    let svc = ingest(
        &stack,
        &[
            ("INGEST_METRICS_ADDR", &format!("127.0.0.1:{port}")),
            ("INGEST_LINGER_MS", "50"),
        ],
    );
    let good: Vec<UsageEvent> = (0..9).map(|n| event("acme-corp", n)).collect();
    let mut msgs: Vec<(String, Vec<u8>)> = good
        .iter()
        .map(|e| ("acme-corp".to_owned(), e.to_json()))
        .collect();
    msgs.push(("acme-corp".into(), good[0].to_json())); // a re-send
    msgs.push(("acme-corp".into(), b"not json".to_vec()));
    stack.produce(&stack.producer(), &msgs).await;
    wait_until(
        &stack,
        "SELECT coalesce(sum(next_offset), 0)::bigint FROM consumer_offsets",
        11,
        &svc,
    )
    .await;
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        r#"ingest_events_total{outcome="inserted"} 9"#,
        r#"ingest_events_total{outcome="duplicate"} 1"#,
        r#"ingest_events_total{outcome="dead_lettered"} 1"#,
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in\n{text}"
        );
    }
    assert!(text.contains("ingest_commit_seconds"), "{text}");
    assert!(text.contains("ingest_batch_size"), "{text}");
}

#[tokio::test]
async fn dead_letters_are_redriven_exactly_once_after_the_fix() {
    let (_, pool) = tests::stack::fresh_database("redrive").await;
    // Five events for a tenant nobody has created yet, and one that is broken for good.
    let mut payloads: Vec<Vec<u8>> = (1..=5).map(|n| event("late-corp", n).to_json()).collect();
    payloads.push(b"{broken".to_vec());
    let counts = apply_batch(&pool, &messages(0, payloads)).await;
    assert_eq!((counts.inserted, counts.dead_lettered), (0, 6));

    add_tenant(&pool, "late-corp").await;
    // Two operators re-drive at the same moment.
    let (a, b) = tokio::join!(
        ingest::dead_letters::redrive(&pool, None),
        ingest::dead_letters::redrive(&pool, None)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.counted + b.counted, 5);
    let (requests, completion): (i64, i64) = sqlx::query_as(
        "SELECT sum(requests)::bigint, sum(completion_tokens)::bigint FROM usage_hourly WHERE tenant_id = 'late-corp'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((requests, completion), (5, 15));
    // Again: nothing left to count; the broken one stays open with its outcome.
    let again = ingest::dead_letters::redrive(&pool, None).await.unwrap();
    assert_eq!((again.counted, again.still_rejected), (0, 1));
    let open = ingest::dead_letters::list_open(&pool, None, 100)
        .await
        .unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].reason_code, "undecodable");
    assert!(open[0]
        .redrive_outcome
        .as_deref()
        .unwrap_or("")
        .starts_with("still rejected"));
}

#[tokio::test]
async fn poison_bytes_are_dead_lettered_without_failing_the_batch() {
    let (_, pool) = tests::stack::fresh_database("poison").await;
    add_tenant(&pool, "acme-corp").await;
    let good = event("acme-corp", 1);
    let mut nul_tenant = serde_json::to_value(event("acme-corp", 2)).unwrap();
    nul_tenant["tenant_id"] = "acme\u{0}corp".into();
    let mut nul_reason = serde_json::to_value(event("acme-corp", 3)).unwrap();
    nul_reason["finish_reason"] = "st\u{0}op".into();
    let payloads = vec![
        good.to_json(),
        serde_json::to_vec(&nul_tenant).unwrap(),
        serde_json::to_vec(&nul_reason).unwrap(),
        vec![0u8, 0, 0],
    ];
    let counts = apply_batch(&pool, &messages(0, payloads)).await;
    assert_eq!((counts.inserted, counts.dead_lettered), (1, 3));
    let codes: Vec<(String,)> =
        sqlx::query_as("SELECT reason_code FROM dead_letters ORDER BY kafka_offset")
            .fetch_all(&pool)
            .await
            .unwrap();
    let codes: Vec<String> = codes.into_iter().map(|(c,)| c).collect();
    assert_eq!(codes, ["bad_identifier", "invalid_field", "undecodable"]);
}

/// Batches normally go in with a plain INSERT; one that meets ids stored by
/// an earlier batch must fall back without leaving a trace of the refused
/// attempt, and still count each new row once and each re-send as what it is.
#[tokio::test]
async fn a_batch_meeting_stored_ids_counts_only_the_new_rows() {
    let (_, pool) = tests::stack::fresh_database("resend_fallback").await;
    add_tenant(&pool, "acme-corp").await;
    let e: Vec<UsageEvent> = (1..=6).map(|n| event("acme-corp", n)).collect();
    let mut changed = e[2].clone();
    changed.completion_tokens += 100;
    let mut offset = 0i64;
    let mut commit = |batch: Vec<&UsageEvent>| {
        let msgs = messages(offset, batch.iter().map(|ev| ev.to_json()).collect());
        offset += msgs.len() as i64;
        let pool = pool.clone();
        async move {
            let counts = apply_batch(&pool, &msgs).await;
            (counts.inserted, counts.duplicates, counts.conflicts)
        }
    };
    assert_eq!(commit(vec![&e[0], &e[1], &e[2]]).await, (3, 0, 0));
    // New rows around an identical re-send and a changed one.
    assert_eq!(commit(vec![&e[3], &e[1], &changed, &e[4]]).await, (2, 1, 1));
    assert_eq!(commit(vec![&e[5]]).await, (1, 0, 0));
    // The same again, all stored: nothing new.
    assert_eq!(commit(vec![&e[5], &e[0]]).await, (0, 2, 0));

    let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM request_log")
        .fetch_one(&pool)
        .await
        .unwrap();
    let (requests, completion): (i64, i64) = sqlx::query_as(
        "SELECT sum(requests)::bigint, sum(completion_tokens)::bigint FROM usage_hourly",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((rows, requests, completion), (6, 6, 21));
    let (conflicts,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM dead_letters WHERE reason_code = 'conflict'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(conflicts, 1);
}
