//! The archive queue's upkeep, on a server with autovacuum off (as the dev
//! stack's and some operators' are): the queue holds a row per statement
//! and the archiver reclaims the rows it drains by itself, its idle poll
//! asks the queue alone (never request_log's day partitions), and the
//! tables every batch churns carry their own autovacuum settings for
//! servers where autovacuum runs.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use sqlx::PgPool;
use tests::TestStack;

/// Inserts `n` request_log rows of the last two minutes straight into
/// request_log (so into the archive queue, through its trigger), in
/// statements of `per_statement` rows: one queue row each.
async fn insert_rows(pool: &PgPool, n: i64, per_statement: i64) {
    let day = (Utc::now() - TimeDelta::hours(1)).date_naive();
    for d in [day, day.succ_opt().unwrap()] {
        sqlx::query("SELECT ensure_request_log_partition($1)")
            .bind(d)
            .execute(pool)
            .await
            .unwrap();
    }
    let now_ms = Utc::now().timestamp_millis() - 60_000 - n;
    for first in (0..n).step_by(per_statement as usize) {
        // Valid UUIDv7s, one millisecond apart, ending a minute ago.
        sqlx::query(
            "INSERT INTO request_log (request_id, tenant_id, api_key_id, model, model_version,
                 priority, started_at, finished_at, prompt_tokens, cached_tokens,
                 completion_tokens, gpu_seconds, preempted_gpu_seconds, finish_reason,
                 replica_id, gateway_id, stream, content_hash, kafka_partition, kafka_offset)
             SELECT (lpad(to_hex($1 + g), 12, '0') || '7' || lpad(to_hex(g % 4096), 3, '0')
                     || '8' || lpad(to_hex(g), 15, '0'))::uuid,
                    'acme-corp', 'k', 'llama-3.1-8b', 'v', 3, t, t, 10, 0, 5, 0.5, 0, 'stop',
                    'r', 'g', false, sha256(g::text::bytea), 0, g
             FROM generate_series($2, $3) g,
                  LATERAL (SELECT to_timestamp(($1 + g) / 1000.0) AS t) s",
        )
        .bind(now_ms)
        .bind(first)
        .bind((first + per_statement).min(n) - 1)
        .execute(pool)
        .await
        .unwrap();
    }
}

/// Dead rows of the archive queue's table and of its TOAST table (where
/// the ids live), read from their pages (pgstattuple).
async fn dead_in_queue(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT dead_tuple_count FROM pgstattuple('archive_queue_batches')),
                (SELECT dead_tuple_count FROM pgstattuple(
                     (SELECT reltoastrelid FROM pg_class WHERE relname = 'archive_queue_batches')))",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A drained queue is vacuumed by the archiver that drained it: with
/// autovacuum off, its dead rows would otherwise stay, and every poll read
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archiver_reclaims_the_queue_rows_it_drains() {
    let stack = TestStack::new("queue_reclaimed").await;
    let pool = &stack.pool;
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        .execute(pool)
        .await
        .unwrap();
    // 30 statements of 1,000 rows (an ingest batch each).
    let n = 30_000;
    insert_rows(pool, n, 1000).await;
    let (statements, queued) = (
        stack
            .count("SELECT count(*) FROM archive_queue_batches")
            .await,
        stack.count("SELECT count(*) FROM archive_queue").await,
    );
    assert_eq!((statements, queued), (30, n), "one queue row per statement");
    let root = stack.dir.path().join("archive");
    let (archiver, _) = tests::archive::start_archiver(
        &stack,
        "archiver",
        root.to_str().unwrap(),
        &[
            ("ARCHIVE_MAX_BATCH".into(), "10000".into()),
            ("ARCHIVE_LINGER_MS".into(), "100".into()),
            ("ARCHIVE_COMPACT_EVERY_SECS".into(), "0".into()),
        ],
    );
    tests::archive::wait_archived(&stack, &archiver).await;
    let archived = stack
        .count("SELECT coalesce(sum(rows), 0)::bigint FROM archive_manifest")
        .await;
    assert_eq!(archived, n);
    // The vacuum follows the batch that drained the queue.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let dead = loop {
        let dead = dead_in_queue(pool).await;
        if dead == (0, 0) || tokio::time::Instant::now() > deadline {
            break dead;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        dead,
        (0, 0),
        "the drained queue still holds dead rows (table, TOAST):\n{}",
        archiver.log_tail()
    );
}

/// The idle poll asks the queue alone: with a day partition of request_log
/// locked (as rollup locks one to drop it), an archiver finding nothing to
/// do returns at once instead of waiting to plan request_log.
#[tokio::test]
async fn an_idle_poll_does_not_touch_request_log() {
    let db = tests::stack::fresh_database("idle_poll").await;
    let pool = &db.pool;
    insert_rows(pool, 10, 10).await;
    let dir = tempfile::tempdir().unwrap();
    let store = archive::store::open(dir.path().to_str().unwrap()).unwrap();
    let batch = archive::archiver::archive_batch(pool, &store, 1000, false)
        .await
        .unwrap();
    assert_eq!((batch.rows, batch.committed), (10, true));

    let day = (Utc::now() - TimeDelta::hours(1)).date_naive();
    let partition = format!("request_log_{}", day.format("%Y%m%d"));
    let mut locker = pool.begin().await.unwrap();
    sqlx::query(&format!("LOCK TABLE {partition} IN ACCESS EXCLUSIVE MODE"))
        .execute(&mut *locker)
        .await
        .unwrap();
    let idle = tokio::time::timeout(
        Duration::from_secs(10),
        archive::archiver::archive_batch(pool, &store, 1000, false),
    )
    .await
    .expect("the idle poll waited on a lock of request_log")
    .unwrap();
    assert_eq!(idle.rows, 0);
    locker.rollback().await.unwrap();
}

/// The tables every batch churns carry their own autovacuum thresholds
/// (and the rollups the default fillfactor: their updates stay on the page).
#[tokio::test]
async fn churning_tables_carry_their_own_vacuum_settings() {
    let db = tests::stack::fresh_database("churn_settings").await;
    let options = |table: &'static str| {
        let pool = db.pool.clone();
        async move {
            let (options,): (Option<Vec<String>>,) =
                sqlx::query_as("SELECT reloptions FROM pg_class WHERE relname = $1")
                    .bind(table)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            options.unwrap_or_default()
        }
    };
    let queue = options("archive_queue_batches").await;
    assert!(
        queue.contains(&"autovacuum_vacuum_scale_factor=0".to_owned())
            && queue.contains(&"autovacuum_vacuum_threshold=1000".to_owned()),
        "archive_queue_batches: {queue:?}"
    );
    for table in ["usage_hourly", "usage_key_hourly", "dedicated_usage_hourly"] {
        let rollup = options(table).await;
        assert_eq!(
            rollup,
            [
                "autovacuum_vacuum_scale_factor=0.01",
                "autovacuum_vacuum_threshold=1000",
                "autovacuum_analyze_scale_factor=0.02"
            ],
            "{table}"
        );
    }
}
