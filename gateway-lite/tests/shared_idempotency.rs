//! Idempotency claims across two gateways on the machine's real Redis
//! (`REDIS_URL`, else 127.0.0.1:6379), each with its own outbox: an answer
//! published by one is replayed by the other with its request id; a
//! duplicate while it runs is in flight; an answer too large to share makes
//! the other run it again under the same request id (billed once); an
//! attempt refused before it ran uses no attempt number, so the id of the
//! one answered is derived again without Redis.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use admission::cluster::{Cluster, FailClosed, Mode};
use axum::body::Bytes;
use gateway_lite::idempotency::{Begin, Idempotency, Stored, MAX_SHARED_ANSWER};
use gateway_lite::outbox::Outbox;

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

async fn gateway(dir: &std::path::Path, prefix: &str, id: &str) -> (Idempotency, Outbox) {
    let cluster = Cluster::connect(&redis_url(), prefix, id, FailClosed::alone()).unwrap();
    cluster.heartbeat().await.unwrap();
    assert_eq!(cluster.mode(), Mode::Shared);
    let outbox = Outbox::open(&dir.join(id)).unwrap();
    (Idempotency::new(outbox.clone(), cluster), outbox)
}

fn answer(id: &str, bytes: usize) -> Stored {
    Stored {
        content_type: "application/json",
        request_id: id.to_owned(),
        body: Bytes::from(vec![b'x'; bytes]),
    }
}

#[tokio::test]
async fn answers_cross_gateways_and_a_large_one_runs_again_under_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("mt-test-{}:", uuid::Uuid::now_v7().simple());
    let (a, a_outbox) = gateway(dir.path(), &prefix, "gw-a").await;
    let (b, _) = gateway(dir.path(), &prefix, "gw-b").await;
    let now = chrono::Utc::now().timestamp_millis();

    let Begin::New(mut guard) = a.begin("key", "order-1", b"body", now, true).await.unwrap() else {
        panic!("a new key")
    };
    let id = guard.request_id();
    assert!(!guard.is_retry());
    assert!(matches!(
        b.begin("key", "order-1", b"body", now, true).await.unwrap(),
        Begin::InFlight
    ));
    let small = answer(&id.to_string(), 100);
    a_outbox
        .append_with_answer("t".into(), b"{}".to_vec(), Some(guard.answer(&small, now)))
        .await
        .unwrap();
    guard.publish(&small).await;
    drop(guard);
    match b.begin("key", "order-1", b"body", now, true).await.unwrap() {
        Begin::Replay(s) => assert_eq!(s, small),
        other => panic!("expected the replay, got {other:?}"),
    }

    // Too large to share: b runs it again, under the same id, as a retry.
    let Begin::New(mut big_guard) = a.begin("key", "order-2", b"body", now, true).await.unwrap()
    else {
        panic!("a new key")
    };
    let big_id = big_guard.request_id();
    let big = answer(&big_id.to_string(), MAX_SHARED_ANSWER + 1);
    big_guard.publish(&big).await;
    drop(big_guard);
    match b.begin("key", "order-2", b"body", now, true).await.unwrap() {
        Begin::New(g) => {
            assert_eq!(g.request_id(), big_id, "the same id: ingest bills it once");
            assert!(g.is_retry());
        }
        other => panic!("expected a re-run, got {other:?}"),
    }
}

/// Begins `key` on `g` until the claim is no longer in flight (a dropped
/// guard releases it in the background).
async fn begin_when_released(g: &Idempotency, key: &str, now: i64) -> Begin {
    for tries in 1.. {
        match g.begin("key", key, b"body", now, true).await.unwrap() {
            Begin::InFlight => {
                assert!(tries < 100, "{key} stayed in flight");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
    unreachable!()
}

#[tokio::test]
async fn a_refused_attempt_uses_no_attempt_and_a_billed_one_does() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("mt-test-{}:", uuid::Uuid::now_v7().simple());
    let (a, _) = gateway(dir.path(), &prefix, "gw-a").await;
    let (b, _) = gateway(dir.path(), &prefix, "gw-b").await;
    let now = chrono::Utc::now().timestamp_millis();

    // Refused twice before it ran (a 429, say): never billed.
    let Begin::New(first) = a.begin("key", "order-1", b"body", now, true).await.unwrap() else {
        panic!("a new key")
    };
    let id = first.request_id();
    first.refused().await;
    // Put back before the refusal was sent: free at once on another gateway.
    let Begin::New(second) = b.begin("key", "order-1", b"body", now, true).await.unwrap() else {
        panic!("a refused attempt leaves the key free")
    };
    assert_eq!(second.request_id(), id, "a refused attempt used no attempt");
    assert!(!second.is_retry(), "nothing ran before: not a retry");
    // A guard merely dropped puts the claim back too, in the background.
    drop(second);
    // The attempt that is answered runs under the same id; Redis then
    // loses the claim (flushed): another gateway derives the same id.
    let Begin::New(mut answered) = begin_when_released(&a, "order-1", now).await else {
        panic!("free again")
    };
    assert_eq!(answered.request_id(), id);
    answered.billed();
    std::mem::forget(answered);
    let mut conn = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let claims: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}idem:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(claims.len(), 1, "{claims:?}");
    let _: () = redis::cmd("DEL")
        .arg(&claims)
        .query_async(&mut conn)
        .await
        .unwrap();
    match b.begin("key", "order-1", b"body", now, true).await.unwrap() {
        Begin::New(g) => assert_eq!(g.request_id(), id, "derived without Redis"),
        other => panic!("expected a run, got {other:?}"),
    }

    // A billed attempt that failed (cancelled mid-stream) used its id:
    // the retry runs under the next one.
    let Begin::New(mut failed) = a.begin("key", "order-2", b"body", now, true).await.unwrap()
    else {
        panic!("a new key")
    };
    let failed_id = failed.request_id();
    failed.billed();
    drop(failed);
    let Begin::New(retry) = begin_when_released(&a, "order-2", now).await else {
        panic!("the retry runs")
    };
    assert_ne!(retry.request_id(), failed_id);
    assert!(retry.is_retry());
}
