//! The ingest fault drill: tens of thousands of events with identical
//! re-sends, conflicting versions and malformed messages, while ingest
//! processes are SIGKILLed at random moments, two consumers share the topic
//! for a while (rebalances), and the broker and Postgres are each restarted
//! once. Afterwards usage_hourly must equal the ground truth exactly,
//! request_log must hold each valid request once, and every bad message must
//! be in dead_letters with the right reason.
//!
//! The broker and Postgres are the test's own (private instances on free
//! ports; the broker keeps its log in that Postgres, so the Postgres crash
//! hits the broker's storage too), so the drill runs beside other tests.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DurationRound, TimeDelta, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rust_decimal::Decimal;
use tests::process::free_port;
use tests::stack::Private;
use tests::{Service, TestStack};
use usage_contract::{FinishReason, RequestId, UsageEvent};
use workload::tenants::Tenant;
use workload::Generator;

/// A fresh id for a copy of `e` that must count as another request.
fn another_request(e: &UsageEvent) -> UsageEvent {
    let mut c = e.clone();
    c.request_id = RequestId::at(c.started_at);
    c
}

/// One usage_hourly row's figures.
#[derive(Debug, Default, Clone, PartialEq, Eq, sqlx::FromRow)]
struct Sums {
    requests: i64,
    prompt_tokens: i64,
    cached_tokens: i64,
    completion_tokens: i64,
    gpu_seconds: Decimal,
    preempted_gpu_seconds: Decimal,
    cancelled_requests: i64,
    errored_requests: i64,
}

#[derive(sqlx::FromRow)]
struct HourRow {
    tenant_id: String,
    model: String,
    priority: i16,
    hour: chrono::DateTime<Utc>,
    #[sqlx(flatten)]
    sums: Sums,
}

/// Ground truth per (tenant, model, priority, hour).
type Truth = BTreeMap<(String, String, i16, chrono::DateTime<Utc>), Sums>;

fn truth_of(events: &[UsageEvent]) -> Truth {
    let mut t = Truth::new();
    for e in events {
        let hour = e.started_at.duration_trunc(TimeDelta::hours(1)).unwrap();
        let row = t
            .entry((e.tenant_id.clone(), e.model.clone(), e.priority, hour))
            .or_default();
        row.requests += 1;
        row.prompt_tokens += e.prompt_tokens;
        row.cached_tokens += e.cached_tokens;
        row.completion_tokens += e.completion_tokens;
        row.gpu_seconds += e.gpu_seconds;
        row.preempted_gpu_seconds += e.preempted_gpu_seconds;
        row.cancelled_requests += i64::from(e.finish_reason == FinishReason::Cancelled);
        row.errored_requests += i64::from(e.finish_reason == FinishReason::Error);
    }
    for sums in t.values_mut() {
        sums.gpu_seconds = sums.gpu_seconds.normalize();
        sums.preempted_gpu_seconds = sums.preempted_gpu_seconds.normalize();
    }
    t
}

async fn stored(stack: &TestStack) -> Option<Truth> {
    let rows: Vec<HourRow> = sqlx::query_as(
        "SELECT tenant_id, model, priority, hour, requests, prompt_tokens, cached_tokens,
                completion_tokens, gpu_seconds, preempted_gpu_seconds, cancelled_requests,
                errored_requests FROM usage_hourly",
    )
    .fetch_all(&stack.pool)
    .await
    .ok()?;
    Some(
        rows.into_iter()
            .map(|mut r| {
                r.sums.gpu_seconds = r.sums.gpu_seconds.normalize();
                r.sums.preempted_gpu_seconds = r.sums.preempted_gpu_seconds.normalize();
                ((r.tenant_id, r.model, r.priority, r.hour), r.sums)
            })
            .collect(),
    )
}

async fn dead_letter_counts(stack: &TestStack) -> Option<BTreeMap<String, i64>> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT reason_code, count(*) FROM dead_letters GROUP BY reason_code")
            .fetch_all(&stack.pool)
            .await
            .ok()?;
    Some(rows.into_iter().collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_counts_every_event_once_through_kills_rebalances_and_restarts() {
    let seed: u64 = std::env::var("DRILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let total: usize = std::env::var("DRILL_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    println!("fault drill: seed {seed}, {total} events (DRILL_SEED / DRILL_EVENTS to repeat)");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut stack = TestStack::with(
        "drill",
        Private {
            broker: true,
            postgres: true,
        },
    )
    .await;
    for tenant in Tenant::reference() {
        let (tenant, priority) = (tenant.name, tenant.priority);
        sqlx::query(
            "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode)
             VALUES ($1, $1, 'standard', $2, 'per_token')",
        )
        .bind(tenant)
        .bind(priority)
        .execute(&stack.pool)
        .await
        .unwrap();
    }

    // The messages, in the order they will be produced, and what each must become.
    // The reference tenants' mix, spread over the last six hours so several
    // hours and day partitions may be hit.
    let now = Utc::now();
    let valid: Vec<UsageEvent> = Generator::reference(
        seed,
        now - TimeDelta::hours(6),
        now - TimeDelta::minutes(1),
        total as u64,
    )
    .expect("the drill's sample")
    .collect();
    let mut messages: Vec<(String, Vec<u8>)> = Vec::with_capacity(total * 12 / 10);
    let mut expected_dead: BTreeMap<String, i64> = BTreeMap::new();
    let mut bad =
        |messages: &mut Vec<(String, Vec<u8>)>, code: &str, key: String, payload: Vec<u8>| {
            *expected_dead.entry(code.to_owned()).or_default() += 1;
            messages.push((key, payload));
        };
    for (n, e) in valid.iter().enumerate() {
        messages.push((e.tenant_id.clone(), e.to_json()));
        let roll = rng.random_range(0..1000);
        match roll {
            // 10%: an identical re-send, later on the same partition.
            0..=99 => messages.push((e.tenant_id.clone(), e.to_json())),
            // 1%: a conflicting version of the same request.
            100..=109 => {
                let mut c = e.clone();
                c.completion_tokens += 1;
                bad(&mut messages, "conflict", e.tenant_id.clone(), c.to_json());
            }
            110..=114 => bad(
                &mut messages,
                "undecodable",
                e.tenant_id.clone(),
                format!("\u{1}garbage {n}").into_bytes(),
            ),
            115..=119 => {
                let mut v: serde_json::Value = serde_json::from_slice(&e.to_json()).unwrap();
                v["schema_version"] = 3.into();
                v["request_id"] = RequestId::new().to_string().into();
                bad(
                    &mut messages,
                    "unknown_schema_version",
                    e.tenant_id.clone(),
                    serde_json::to_vec(&v).unwrap(),
                );
            }
            120..=124 => {
                let mut c = another_request(e);
                c.cached_tokens = c.prompt_tokens + 1;
                bad(
                    &mut messages,
                    "cached_exceeds_prompt",
                    c.tenant_id.clone(),
                    c.to_json(),
                );
            }
            125..=129 => {
                let mut c = another_request(e);
                c.tenant_id = "nobody-inc".into();
                bad(
                    &mut messages,
                    "unknown_tenant",
                    "nobody-inc".into(),
                    c.to_json(),
                );
            }
            _ => {}
        }
    }
    let truth = truth_of(&valid);

    let mut env = stack.env();
    env.insert("INGEST_MAX_BATCH".into(), "2000".into());
    env.insert("INGEST_LINGER_MS".into(), "100".into());
    let log_dir = stack.dir.path().to_path_buf();
    let start = |name: &str, env: &HashMap<String, String>| {
        let mut env = env.clone();
        env.insert(
            "INGEST_METRICS_ADDR".into(),
            format!("127.0.0.1:{}", free_port()),
        );
        Service::start(name, "ingest", &[], env, &log_dir).unwrap_or_else(|e| panic!("{e}"))
    };
    let producer = stack.producer();
    let chunks: Vec<&[(String, Vec<u8>)]> = messages.chunks(messages.len() / 6 + 1).collect();

    let mut a = start("ingest-a", &env);
    stack.produce(&producer, chunks[0]).await;
    tokio::time::sleep(Duration::from_millis(rng.random_range(500..3_000))).await;
    a.kill9().await;
    println!("killed ingest-a");
    stack.produce(&producer, chunks[1]).await;
    a.restart().unwrap_or_else(|e| panic!("{e}"));
    let mut b = start("ingest-b", &env);
    println!("two consumers share the topic");
    stack.produce(&producer, chunks[2]).await;
    tokio::time::sleep(Duration::from_millis(rng.random_range(2_000..6_000))).await;
    b.kill9().await;
    println!("killed ingest-b");
    stack.broker().kill9().await;
    stack
        .broker()
        .restart()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    println!("killed and restarted the broker");
    stack.produce(&producer, chunks[3]).await;
    tokio::time::sleep(Duration::from_millis(rng.random_range(500..3_000))).await;
    a.kill9().await;
    println!("killed ingest-a again");
    a.restart().unwrap_or_else(|e| panic!("{e}"));
    b.restart().unwrap_or_else(|e| panic!("{e}"));
    stack.produce(&producer, chunks[4]).await;
    tokio::time::sleep(Duration::from_millis(rng.random_range(500..2_000))).await;
    stack.postgres().kill_all().await;
    stack
        .postgres()
        .restart()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    println!("killed and restarted postgres");
    for chunk in &chunks[5..] {
        stack.produce(&producer, chunk).await;
    }
    tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..3_000))).await;
    b.kill9().await;
    println!("killed ingest-b again; ingest-a finishes alone");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    loop {
        let (got, dead) = (stored(&stack).await, dead_letter_counts(&stack).await);
        if got.as_ref() == Some(&truth) && dead.as_ref() == Some(&expected_dead) {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            let got = got.unwrap_or_default();
            let missing = truth.iter().filter(|(k, v)| got.get(*k) != Some(v)).count();
            panic!(
                "after the drill, {missing} of {} hourly rows differ from the truth; dead letters {dead:?}, expected {expected_dead:?}\n--- ingest-a\n{}",
                truth.len(),
                a.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // request_log holds each valid request exactly once, and nothing else.
    let ids: Vec<uuid::Uuid> = valid.iter().map(|e| e.request_id.as_uuid()).collect();
    let (found, all): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE request_id = ANY($1)), count(*) FROM request_log",
    )
    .bind(&ids)
    .fetch_one(&stack.pool)
    .await
    .unwrap();
    assert_eq!((found as usize, all as usize), (total, total));
    // Conflicts keep both versions.
    let (conflicts_with_both,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM dead_letters WHERE reason_code = 'conflict'
           AND stored_version IS NOT NULL AND length(raw) > 0",
    )
    .fetch_one(&stack.pool)
    .await
    .unwrap();
    assert_eq!(
        conflicts_with_both,
        expected_dead.get("conflict").copied().unwrap_or(0)
    );
    // The independent check agrees too.
    let status = std::process::Command::new(tests::process::bin_dir().join("rollup"))
        .env("DATABASE_URL", &stack.database_url)
        // No archiver ran: every billed row is still queued, which is the
        // archive's side of the comparison.
        .env("ARCHIVE_URL", stack.dir.path().join("archive"))
        .args([
            "reconcile",
            "--from",
            "2000-01-01T00:00:00Z",
            "--to",
            "2100-01-01T00:00:00Z",
        ])
        .status()
        .unwrap();
    assert!(status.success(), "rollup reconcile found differences");
    a.terminate(Duration::from_secs(20)).await;
}
