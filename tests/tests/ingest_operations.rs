//! Running ingest: SIGTERM commits what it holds, bad configuration stops it
//! with a message naming the setting, its metrics count outcomes, dead
//! letters are filed under the topic they came from and re-driven exactly
//! once after a fix, and a conflict keeps the stored version as the
//! contract's canonical JSON.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::time::Duration;

use chrono::Utc;
use rdkafka::producer::FutureRecord;
use rust_decimal::Decimal;
use tests::events::usage_event as event;
use tests::process::{bin_dir, free_port};
use tests::{Service, TestStack};
use usage_contract::UsageEvent;

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
    let counts = ingest::store::apply(&mut tx, usage_contract::TOPIC, decoded)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    counts
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
    Service::start("ingest", "ingest", &[], env, stack.dir.path()).unwrap_or_else(|e| panic!("{e}"))
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
    // Produce once the group has settled: a rebalance flushes the batch
    // (revoked partitions are committed first), which is not what this
    // test is about. A loaded machine can take a while to join.
    let joined = tokio::time::Instant::now() + Duration::from_secs(60);
    while !svc.log_text().contains("partitions assigned") {
        assert!(
            tokio::time::Instant::now() < joined,
            "ingest never joined its group:\n{}",
            svc.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let msgs: Vec<(String, Vec<u8>)> = (0..500)
        .map(|n| ("acme-corp".to_owned(), event("acme-corp", n).to_json()))
        .collect();
    stack.produce(&stack.producer(), &msgs).await;
    // Long enough for the fetch; nothing is committed yet.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        stack.count("SELECT count(*) FROM request_log").await,
        0,
        "linger should hold the batch (a revoke in the log explains an early flush):\n{}",
        svc.log_tail()
    );
    let status = svc
        .terminate(Duration::from_secs(30))
        .await
        .expect("ingest exited");
    assert!(status.success(), "exit {status}:\n{}", svc.log_tail());
    assert_eq!(
        stack.count("SELECT count(*) FROM request_log").await,
        500,
        "{}",
        svc.log_tail()
    );
    assert_eq!(
        stack
            .count("SELECT coalesce(sum(next_offset), 0)::bigint FROM consumer_offsets")
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
    stack
        .wait_count(
            "SELECT coalesce(sum(next_offset), 0)::bigint FROM consumer_offsets",
            11,
            &svc,
            Duration::from_secs(60),
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
    let fresh_db = tests::stack::fresh_database("redrive").await;
    let pool = fresh_db.pool.clone();
    // Five events for a tenant nobody has created yet, and one that is broken for good.
    let mut payloads: Vec<Vec<u8>> = (1..=5).map(|n| event("late-corp", n).to_json()).collect();
    payloads.push(b"{broken".to_vec());
    let counts = apply_batch(&pool, &messages(0, payloads)).await;
    assert_eq!((counts.inserted, counts.dead_lettered), (0, 6));

    add_tenant(&pool, "late-corp").await;
    // Two operators re-drive at the same moment.
    let (a, b) = tokio::join!(
        ingest::redrive::redrive(&pool, None),
        ingest::redrive::redrive(&pool, None)
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
    let again = ingest::redrive::redrive(&pool, None).await.unwrap();
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
    let fresh_db = tests::stack::fresh_database("poison").await;
    let pool = fresh_db.pool.clone();
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
    let fresh_db = tests::stack::fresh_database("resend_fallback").await;
    let pool = fresh_db.pool.clone();
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

/// Two topics feeding one database: a malformed message at the same
/// partition and offset of each is dead-lettered twice, each under the topic
/// it came from, and re-driving them keeps each one once, under its topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_of_two_topics_at_one_offset_are_both_kept() {
    let stack = TestStack::new("two_topics").await;
    let second = format!("{}.second", stack.topic);
    devstack::topic::create(&stack.brokers, &second, 4)
        .await
        .unwrap();
    let first_ingest = ingest(&stack, &[("INGEST_LINGER_MS", "50")]);
    let second_group = format!("{}-second", stack.group);
    let _second_ingest = ingest(
        &stack,
        &[
            ("INGEST_TOPIC", &second),
            ("INGEST_GROUP", &second_group),
            ("INGEST_LINGER_MS", "50"),
        ],
    );
    // Partition 0 of each topic: offset 0 undecodable, offset 1 an event of
    // a tenant that does not exist yet (one tenant per topic).
    let producer = stack.producer();
    for (topic, tenant) in [(&stack.topic, "late-first"), (&second, "late-second")] {
        let payloads = [b"not json".to_vec(), event(tenant, 1).to_json()];
        for (offset, payload) in (0i64..).zip(payloads) {
            let record = FutureRecord::to(topic)
                .partition(0)
                .key(tenant)
                .payload(&payload);
            let landed = producer
                .send(record, Duration::from_secs(30))
                .await
                .map_err(|(e, _)| e)
                .unwrap();
            assert_eq!((landed.partition, landed.offset), (0, offset), "{topic}");
        }
    }
    stack
        .wait_count(
            "SELECT coalesce(sum(next_offset), 0)::bigint FROM consumer_offsets",
            4,
            &first_ingest,
            Duration::from_secs(60),
        )
        .await;
    let expected = |outcome: Option<&str>| {
        let mut rows = Vec::new();
        for topic in [&stack.topic, &second] {
            for (offset, code) in [(0i64, "undecodable"), (1, "unknown_tenant")] {
                rows.push((
                    topic.clone(),
                    0i32,
                    offset,
                    code.to_owned(),
                    outcome.map(|o| o.to_owned()),
                ));
            }
        }
        rows
    };
    let stored = || async {
        sqlx::query_as::<_, (String, i32, i64, String, Option<String>)>(
            "SELECT topic, kafka_partition, kafka_offset, reason_code,
                    left(redrive_outcome, 14)
             FROM dead_letters ORDER BY topic, kafka_partition, kafka_offset",
        )
        .fetch_all(&stack.pool)
        .await
        .unwrap()
    };
    assert_eq!(
        stored().await,
        expected(None),
        "{}",
        first_ingest.log_tail()
    );

    // Re-driven while the tenants are still missing: each stays once, under its topic.
    let report = ingest::redrive::redrive(&stack.pool, None).await.unwrap();
    assert_eq!((report.counted, report.still_rejected), (0, 4));
    assert_eq!(stored().await, expected(Some("still rejected")));

    // After the fix both events count, once each.
    add_tenant(&stack.pool, "late-first").await;
    add_tenant(&stack.pool, "late-second").await;
    let report = ingest::redrive::redrive(&stack.pool, Some("unknown_tenant"))
        .await
        .unwrap();
    assert_eq!(report.counted, 2);
    assert_eq!(
        stack.count("SELECT count(*) FROM request_log").await,
        2,
        "both re-driven events are stored"
    );
    assert_eq!(stack.count("SELECT count(*) FROM dead_letters").await, 4);
}

/// A conflict's stored version is the first stored event in the contract's
/// canonical JSON, byte for byte: decimals as strings, in the gateway's key
/// order, whether the stored version was met in an earlier batch (read back
/// from request_log) or earlier in the same batch.
#[tokio::test]
async fn a_conflicts_stored_version_is_the_first_event_as_canonical_json() {
    let fresh_db = tests::stack::fresh_database("stored_version").await;
    let pool = fresh_db.pool.clone();
    add_tenant(&pool, "acme-corp").await;
    // GPU-seconds at scales other than the column's six places, as any
    // producer may write them: "0.50874" and "0".
    let mut earlier = event("acme-corp", 1);
    earlier.gpu_seconds = Decimal::new(50_874, 5);
    earlier.preempted_gpu_seconds = Decimal::ZERO;
    earlier.ttft_ms = Some(120);
    let mut changed_later = earlier.clone();
    changed_later.completion_tokens += 1;
    let mut same_batch = event("acme-corp", 2);
    same_batch.gpu_seconds = Decimal::new(1_250_000, 6);
    same_batch.preempted_gpu_seconds = Decimal::new(25, 2);
    let mut changed_same_batch = same_batch.clone();
    changed_same_batch.prompt_tokens += 7;

    let first = apply_batch(&pool, &messages(0, vec![earlier.to_json()])).await;
    assert_eq!(first.inserted, 1);
    let second = apply_batch(
        &pool,
        &messages(
            1,
            vec![
                changed_later.to_json(),
                same_batch.to_json(),
                changed_same_batch.to_json(),
            ],
        ),
    )
    .await;
    assert_eq!((second.inserted, second.conflicts), (1, 2));

    let rows: Vec<(uuid::Uuid, Option<String>)> = sqlx::query_as(
        "SELECT request_id, stored_version::text FROM dead_letters
         WHERE reason_code = 'conflict' ORDER BY kafka_offset",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 2);
    for ((id, text), original) in rows.iter().zip([&earlier, &same_batch]) {
        assert_eq!(*id, original.request_id.as_uuid());
        let text = text
            .as_deref()
            .expect("a conflict keeps the stored version");
        let decoded = usage_contract::decode(text.as_bytes(), Utc::now())
            .unwrap_or_else(|v| panic!("stored version does not decode ({v}): {text}"));
        assert_eq!(&decoded, original, "{text}");
        assert_eq!(
            text.as_bytes(),
            original.to_json().as_slice(),
            "not the canonical JSON of the first event"
        );
        let json: serde_json::Value = serde_json::from_str(text).unwrap();
        for field in ["gpu_seconds", "preempted_gpu_seconds"] {
            assert!(json[field].is_string(), "{field} is not a string: {text}");
        }
    }
    // `ingest dead-letters` lists the same versions, as the same JSON.
    let open = ingest::dead_letters::list_open(&pool, Some("conflict"), 10)
        .await
        .unwrap();
    for (dl, original) in open.iter().zip([&earlier, &same_batch]) {
        assert_eq!(dl.stored_version.as_ref(), Some(original));
        let line = serde_json::to_string(dl).unwrap();
        let canonical = format!("\"stored_version\":{}", original.to_json_string());
        assert!(line.contains(&canonical), "{line}");
    }
    assert_eq!(open.len(), 2);
}

/// The dead letters the manual (the README and `docs/`) names (a `` `name`
/// dead letter ``) are named as ingest stores them: a re-run answered under
/// an id already billed, and a message of an unknown tenant, go through
/// ingest's transaction here, and every name the manual gives a dead letter
/// is one of the codes stored.
#[tokio::test]
async fn the_manual_names_dead_letters_by_the_code_ingest_stores() {
    let fresh_db = tests::stack::fresh_database("dead_letter_names").await;
    let pool = fresh_db.pool.clone();
    add_tenant(&pool, "acme-corp").await;
    let first = event("acme-corp", 1);
    let mut rerun = first.clone();
    rerun.completion_tokens += 3;
    let stranger = event("nobody-knows-us", 2);
    apply_batch(&pool, &messages(0, vec![first.to_json()])).await;
    apply_batch(
        &pool,
        &messages(1, vec![rerun.to_json(), stranger.to_json()]),
    )
    .await;
    let stored: Vec<(String,)> =
        sqlx::query_as("SELECT DISTINCT reason_code FROM dead_letters ORDER BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    let stored: Vec<String> = stored.into_iter().map(|(c,)| c).collect();
    assert_eq!(stored, ["conflict", "unknown_tenant"]);

    let manual: String = [
        "README.md",
        "docs/architecture.md",
        "docs/operations.md",
        "docs/billing.md",
    ]
    .iter()
    .map(|file| {
        std::fs::read_to_string(format!("{}/../{file}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    })
    .collect::<Vec<_>>()
    .join("\n");
    let text = manual.split_whitespace().collect::<Vec<_>>().join(" ");
    let named: Vec<&str> = text
        .match_indices("` dead letter")
        .filter_map(|(end, _)| text[..end].rsplit_once('`').map(|(_, name)| name))
        .collect();
    assert!(
        named.contains(&"conflict"),
        "the manual names no `conflict` dead letter"
    );
    for name in named {
        assert!(
            stored.iter().any(|code| code == name),
            "the manual names a `{name}` dead letter; ingest stores {stored:?}"
        );
    }
}
