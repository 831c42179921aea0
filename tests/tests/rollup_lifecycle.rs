//! What happens to stored usage over time: hours close when the watermark
//! passes them, late usage is still counted and marks its hour adjusted,
//! expired day partitions are dropped without letting a late re-send be
//! counted twice, and reconcile notices any drift. Postgres only: batches
//! go through ingest's own transaction code, no broker needed.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use ingest::batch::{split, RawMessage};
use ingest::store::{apply, Partitions};
use rollup::retention::ArchiveRule;
use rust_decimal::Decimal;
use sqlx::PgPool;
use tests::stack::fresh_database;
use usage_contract::{FinishReason, RequestId, UsageEvent};

fn event(started_at: DateTime<Utc>, completion: i64) -> UsageEvent {
    UsageEvent {
        schema_version: 1,
        request_id: RequestId::at(started_at),
        tenant_id: "acme-corp".into(),
        api_key_id: "k".into(),
        model: "llama-3.1-70b".into(),
        model_version: "v".into(),
        priority: 5,
        started_at,
        first_token_at: None,
        finished_at: started_at,
        prompt_tokens: 100,
        cached_tokens: 0,
        completion_tokens: completion,
        gpu_seconds: Decimal::new(2_500_000, 6),
        preempted_gpu_seconds: Decimal::ZERO,
        finish_reason: FinishReason::Stop,
        ttft_ms: None,
        tpot_ms: None,
        replica_id: "r".into(),
        gateway_id: "g".into(),
        stream: false,
        placement: None,
    }
}

/// A fresh database with tenant acme-corp; dropped with the handle.
async fn setup(name: &str) -> devstack::Database {
    let db = fresh_database(name).await;
    sqlx::query(
        "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode)
         VALUES ('acme-corp', 'Acme', 'enterprise', 5, 'per_token')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    db
}

/// Ingests events exactly as a batch from the topic would be.
async fn ingest(pool: &PgPool, events: &[UsageEvent], first_offset: i64) -> ingest::store::Counts {
    let msgs: Vec<RawMessage> = events
        .iter()
        .enumerate()
        .map(|(i, e)| RawMessage {
            decoded: None,
            partition: 0,
            offset: first_offset + i as i64,
            payload: e.to_json(),
        })
        .collect();
    let decoded = split(&msgs, Utc::now());
    Partitions::default()
        .ensure(pool, decoded.firsts.iter().map(|c| &c.event))
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let counts = apply(&mut tx, usage_contract::TOPIC, decoded)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    counts
}

async fn hour_state(pool: &PgPool, hour: DateTime<Utc>) -> Option<(bool, i64)> {
    sqlx::query_as("SELECT adjusted, late_requests FROM usage_hours WHERE hour = $1")
        .bind(hour)
        .fetch_optional(pool)
        .await
        .unwrap()
}

async fn completion_in(pool: &PgPool, hour: DateTime<Utc>) -> i64 {
    sqlx::query_as::<_, (i64,)>(
        "SELECT coalesce(sum(completion_tokens), 0)::bigint FROM usage_hourly WHERE hour = $1",
    )
    .bind(hour)
    .fetch_one(pool)
    .await
    .unwrap()
    .0
}

#[tokio::test]
async fn late_event_for_a_closed_hour_is_counted_and_marks_it_adjusted() {
    let db = setup("hours").await;
    let pool = db.pool.clone();
    let now = Utc::now()
        .duration_trunc(TimeDelta::milliseconds(1))
        .unwrap();
    let old_hour = (now - TimeDelta::hours(3))
        .duration_trunc(TimeDelta::hours(1))
        .unwrap();
    ingest(
        &pool,
        &[event(old_hour + TimeDelta::minutes(5), 10), event(now, 1)],
        0,
    )
    .await;

    // Nothing stored beyond `now`, so with 10 minutes' lateness every hour
    // that ended at least 10 minutes before `now` closes; the current one stays open.
    let report = rollup::hours::close(&pool, TimeDelta::minutes(10))
        .await
        .unwrap();
    assert_eq!(report.watermark, Some(now));
    assert!(report.closed.contains(&old_hour), "{report:?}");
    let current = now.duration_trunc(TimeDelta::hours(1)).unwrap();
    assert!(!report.closed.contains(&current));
    assert_eq!(hour_state(&pool, old_hour).await, Some((false, 0)));
    // Hours in between with no usage close too, so a late event for them is also seen as late.
    assert!(report.closed.contains(&(old_hour + TimeDelta::hours(1))));

    // A late request for the closed hour: counted, and the hour says so.
    ingest(&pool, &[event(old_hour + TimeDelta::minutes(30), 7)], 2).await;
    assert_eq!(completion_in(&pool, old_hour).await, 17);
    assert_eq!(hour_state(&pool, old_hour).await, Some((true, 1)));
    // Closing again changes nothing that is closed.
    let again = rollup::hours::close(&pool, TimeDelta::minutes(10))
        .await
        .unwrap();
    assert!(!again.closed.contains(&old_hour));
    // An event for the open hour does not mark anything adjusted.
    ingest(&pool, &[event(now, 2)], 3).await;
    assert_eq!(hour_state(&pool, current).await, None);
}

#[tokio::test]
async fn expired_days_are_dropped_and_their_resends_are_not_counted_twice() {
    let db = setup("retention").await;
    let pool = db.pool.clone();
    let today = Utc::now().date_naive();
    let old_time = (Utc::now() - TimeDelta::days(40))
        .duration_trunc(TimeDelta::milliseconds(1))
        .unwrap();
    let recent_time = (Utc::now() - TimeDelta::days(2))
        .duration_trunc(TimeDelta::milliseconds(1))
        .unwrap();
    let old = event(old_time, 5);
    let recent = event(recent_time, 6);
    let counts = ingest(&pool, &[old.clone(), recent.clone()], 0).await;
    assert_eq!(counts.inserted, 2);

    // No archiver here: the archive rule is not what this test is about.
    let dropped = rollup::retention::drop_expired(&pool, today, 30, &ArchiveRule::Ignore)
        .await
        .unwrap();
    assert_eq!(dropped, vec![old_time.date_naive()]);
    let left = rollup::retention::partitions(&pool).await.unwrap();
    assert_eq!(left, vec![recent_time.date_naive()]);

    // A re-send of the dropped day's request cannot be recognised as a
    // duplicate any more: it is dead-lettered, not counted a second time.
    let hour = old_time.duration_trunc(TimeDelta::hours(1)).unwrap();
    let before = completion_in(&pool, hour).await;
    let counts = ingest(&pool, &[old.clone(), recent.clone()], 10).await;
    assert_eq!(
        (counts.inserted, counts.duplicates, counts.dead_lettered),
        (0, 1, 1)
    );
    assert_eq!(completion_in(&pool, hour).await, before);
    let (code,): (String,) =
        sqlx::query_as("SELECT reason_code FROM dead_letters WHERE kafka_offset = 10")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(code, "beyond_retention");
}

fn require_archive() -> ArchiveRule {
    ArchiveRule::Require
}

#[tokio::test]
async fn a_due_day_is_kept_until_the_archive_holds_it() {
    let db = setup("barrier").await;
    let pool = db.pool.clone();
    let today = Utc::now().date_naive();
    let old_time = (Utc::now() - TimeDelta::days(40))
        .duration_trunc(TimeDelta::milliseconds(1))
        .unwrap();
    let events: Vec<_> = (0..3)
        .map(|i| event(old_time + TimeDelta::seconds(i), 1))
        .collect();
    ingest(&pool, &events, 0).await;
    let day = old_time.date_naive();

    // Due, but nothing archived: kept, its three requests queued.
    let dropped = rollup::retention::drop_expired(&pool, today, 30, &require_archive())
        .await
        .unwrap();
    assert!(dropped.is_empty());
    assert_eq!(rollup::retention::queued(&pool, day).await.unwrap(), 3);

    // Two of three archived: still kept.
    let dir = tempfile::tempdir().unwrap();
    let store = archive::store::open(dir.path().to_str().unwrap()).unwrap();
    archive::archiver::archive_batch(&pool, &store, 2, false)
        .await
        .unwrap();
    let dropped = rollup::retention::drop_expired(&pool, today, 30, &require_archive())
        .await
        .unwrap();
    assert!(dropped.is_empty());
    assert_eq!(
        rollup::retention::partitions(&pool).await.unwrap(),
        vec![day]
    );

    // The archive holds the whole day: dropped.
    archive::archiver::archive_batch(&pool, &store, 2, false)
        .await
        .unwrap();
    let dropped = rollup::retention::drop_expired(&pool, today, 30, &require_archive())
        .await
        .unwrap();
    assert_eq!(dropped, vec![day]);
}

#[tokio::test]
async fn without_an_archiver_due_days_are_dropped_as_they_come() {
    let db = setup("noarchive").await;
    let pool = db.pool.clone();
    let old_time = (Utc::now() - TimeDelta::days(40))
        .duration_trunc(TimeDelta::milliseconds(1))
        .unwrap();
    ingest(&pool, &[event(old_time, 1)], 0).await;
    sqlx::query(
        "INSERT INTO consumer_offsets (consumer_group, topic, kafka_partition, next_offset)
         VALUES ('meterline-ingest', 'usage.events.v1', 0, 1)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let today = Utc::now().date_naive();
    assert!(
        rollup::retention::drop_expired(&pool, today, 30, &require_archive())
            .await
            .unwrap()
            .is_empty()
    );
    let dropped = rollup::retention::drop_expired(&pool, today, 30, &ArchiveRule::Ignore)
        .await
        .unwrap();
    assert_eq!(dropped, vec![old_time.date_naive()]);
    // Nothing will ever archive the dropped day's ids: they leave the queue.
    let (queued,): (i64,) = sqlx::query_as("SELECT count(*) FROM archive_queue")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(queued, 0);
}

#[tokio::test]
async fn reconcile_lists_drift_and_exits_non_zero() {
    let db = setup("reconcile").await;
    let (url, pool) = (db.url.clone(), db.pool.clone());
    let now = Utc::now()
        .duration_trunc(TimeDelta::milliseconds(1))
        .unwrap();
    // Two requests of the same hour, whatever the minute the test runs at.
    let hour = now.duration_trunc(TimeDelta::hours(1)).unwrap();
    let earlier = (now - TimeDelta::minutes(1)).max(hour);
    ingest(&pool, &[event(now, 3), event(earlier, 4)], 0).await;
    let from = now - TimeDelta::days(1);
    let to = now + TimeDelta::days(1);
    assert!(rollup::reconcile::reconcile(&pool, None, from, to)
        .await
        .unwrap()
        .is_empty());

    sqlx::query("UPDATE usage_hourly SET completion_tokens = completion_tokens + 1")
        .execute(&pool)
        .await
        .unwrap();
    let diffs = rollup::reconcile::reconcile(&pool, None, from, to)
        .await
        .unwrap();
    assert_eq!(diffs.len(), 1);
    assert_eq!(
        diffs[0].request_log.as_ref().unwrap().completion_tokens + 1,
        diffs[0].usage_hourly.completion_tokens
    );
    assert_eq!(diffs[0].fields, ["completion_tokens"]);

    let status = std::process::Command::new(tests::process::bin_dir().join("rollup"))
        .env("DATABASE_URL", &url)
        .env("ARCHIVE_URL", "off")
        .args([
            "reconcile",
            "--from",
            &from.to_rfc3339(),
            "--to",
            &to.to_rfc3339(),
        ])
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(1));
}
