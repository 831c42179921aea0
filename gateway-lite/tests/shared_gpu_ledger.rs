//! The shared GPU ledger's Lua against the machine's real Redis
//! (`REDIS_URL`, else 127.0.0.1:6379), each test under its own key prefix:
//! shares follow the requests' in-flight tokens and add up to the busy
//! time exactly, also across a rebase of the per-weight integral, which
//! the scripts keep in integers (Lua's numbers are doubles).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::time::Duration;

use admission::cluster::{Cluster, FailClosed, Mode};
use admission::gpu_ledger::{RedisLedger, REBASE_AT};
use admission::upstream::ledger::SharedLedger;

const REPLICA: &str = "r-1";
const GPUS: u32 = 2;

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

async fn ledger() -> (RedisLedger, Cluster, String) {
    let prefix = format!("mt-test-{}:", uuid::Uuid::now_v7().simple());
    let cluster = Cluster::connect(&redis_url(), &prefix, "gw", FailClosed::alone()).unwrap();
    cluster.heartbeat().await.unwrap();
    assert_eq!(cluster.mode(), Mode::Shared, "Redis at {}", redis_url());
    (RedisLedger::new(cluster.clone()), cluster, prefix)
}

async fn hget(cluster: &Cluster, key: &str, field: &str) -> i64 {
    let mut conn = cluster.conn().unwrap();
    let v: Option<i64> = redis::cmd("HGET")
        .arg(key)
        .arg(field)
        .query_async(&mut conn)
        .await
        .unwrap();
    v.unwrap_or(0)
}

/// Two requests of 1 and 3 tokens in flight together: 1:3 of the time
/// they shared (within what the calls' own round trips add to the first
/// one's time alone), and their shares add up to the busy time exactly.
async fn one_to_three(ledger: &RedisLedger, cluster: &Cluster, key: &str) {
    let busy_before = hget(cluster, key, "busy").await;
    let a = ledger.join(REPLICA, GPUS, 1).await.unwrap();
    let b = ledger.join(REPLICA, GPUS, 3).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let share_b = ledger.leave(REPLICA, GPUS, b, false).await.unwrap();
    let share_a = ledger.leave(REPLICA, GPUS, a, false).await.unwrap();
    let busy = hget(cluster, key, "busy").await - busy_before;
    assert_eq!(
        (share_a + share_b) as i64,
        busy,
        "shares {share_a} + {share_b} against busy {busy}"
    );
    // b held 3/4 of the shared time; a had the moments alone (a few round
    // trips of this test's calls) to itself.
    assert!(share_b >= 2 * 200_000 * 3 / 4, "b's share {share_b} µs");
    let ratio = share_a as f64 / share_b as f64;
    assert!(
        (0.30..0.40).contains(&ratio),
        "a:b = {share_a}:{share_b} = {ratio}, expected about 1:3"
    );
}

#[tokio::test]
async fn shares_follow_in_flight_tokens_and_add_up_to_busy_time() {
    let (ledger, cluster, prefix) = ledger().await;
    let key = format!("{prefix}gpu-ledger:{REPLICA}");
    one_to_three(&ledger, &cluster, &key).await;
    // Every value the scripts keep is an integer.
    let mut conn = cluster.conn().unwrap();
    let fields: Vec<String> = redis::cmd("HVALS")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    for f in fields {
        assert!(f.parse::<i64>().is_ok(), "{f:?} in {key} is not an integer");
    }
}

/// Moves the integral to `to`, and every member's snapshot with it, so
/// what each owes is unchanged (as if the replica had been busy for days).
async fn move_integral(cluster: &Cluster, key: &str, to: u64) {
    let mut conn = cluster.conn().unwrap();
    let pw: u64 = redis::cmd("HGET")
        .arg(key)
        .arg("pw")
        .query_async(&mut conn)
        .await
        .unwrap();
    let members = format!("{key}:members");
    let all: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(&members)
        .query_async(&mut conn)
        .await
        .unwrap();
    for (id, raw) in all {
        let mut v: Vec<String> = raw.split(' ').map(str::to_owned).collect();
        v[1] = (v[1].parse::<u64>().unwrap() + to - pw).to_string();
        let () = redis::cmd("HSET")
            .arg(&members)
            .arg(id)
            .arg(v.join(" "))
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let () = redis::cmd("HSET")
        .arg(key)
        .arg("pw")
        .arg(to)
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_rebase_of_the_integral_keeps_every_share() {
    let (ledger, cluster, prefix) = ledger().await;
    let key = format!("{prefix}gpu-ledger:{REPLICA}");
    // Two requests of equal weight in flight while the integral passes the
    // rebase point: each has owed 100 ms since it last settled when the
    // next call's interval carries the integral past it.
    let a = ledger.join(REPLICA, GPUS, 2).await.unwrap();
    let b = ledger.join(REPLICA, GPUS, 2).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    move_integral(&cluster, &key, REBASE_AT - 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let share_b = ledger.leave(REPLICA, GPUS, b, false).await.unwrap();
    let mut conn = cluster.conn().unwrap();
    let pw_after: u64 = redis::cmd("HGET")
        .arg(&key)
        .arg("pw")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        pw_after < REBASE_AT / 2,
        "the integral was not rebased: {pw_after}"
    );
    let share_a = ledger.leave(REPLICA, GPUS, a, false).await.unwrap();
    let busy = hget(&cluster, &key, "busy").await;
    assert_eq!(
        (share_a + share_b) as i64,
        busy,
        "shares {share_a} + {share_b}"
    );
    // Equal weights over the same 200 ms (a alone for a round trip first,
    // and after b left): b had half of the time they shared.
    assert!(
        share_b >= 2 * 200_000 / 2,
        "b's share {share_b} µs of 2 GPUs × 200 ms"
    );
    let ratio = share_b as f64 / share_a as f64;
    assert!((0.9..=1.0).contains(&ratio), "b:a = {share_b}:{share_a}");
    // And the ledger works on after it: a fresh period splits 1:3.
    one_to_three(&ledger, &cluster, &key).await;
}

/// A gateway restarted under the same `GATEWAY_ID` is a new life: what
/// the previous one left in flight on a replica is reaped at the next
/// heartbeat's reap (its share counted as reaped, never billed), instead
/// of holding a share of every later busy period for good.
#[tokio::test]
async fn a_restarted_gateways_previous_life_is_reaped() {
    let (before, _, prefix) = ledger().await;
    let key = format!("{prefix}gpu-ledger:{REPLICA}");
    let orphan = before.join(REPLICA, GPUS, 5).await.unwrap();
    // The same id, a new process: its first heartbeat takes the liveness key.
    let cluster = Cluster::connect(&redis_url(), &prefix, "gw", FailClosed::alone()).unwrap();
    cluster.heartbeat().await.unwrap();
    let after = RedisLedger::new(cluster.clone());
    let own = after.join(REPLICA, GPUS, 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    after.reap().await;
    let mut conn = cluster.conn().unwrap();
    let left: bool = redis::cmd("HEXISTS")
        .arg(format!("{key}:members"))
        .arg(orphan)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!left, "the previous life's request is still in the ledger");
    assert!(hget(&cluster, &key, "reaped").await > 0);
    // The new life's own request is still there, and alone now.
    let share = after.leave(REPLICA, GPUS, own, false).await.unwrap();
    assert!(share > 0);
}
