//! The limiter's Redis side against the machine's real Redis (`REDIS_URL`,
//! else 127.0.0.1:6379), each test under its own key prefix: two limiters
//! (two gateways) on one key stay within the limit together, where two
//! in-memory ones admit twice; a capacity is shared and comes back when a
//! gateway's liveness lapses, or at once when it restarts under its id; a
//! gateway holds what its requests use and one block, not the cap; after
//! Redis lost its state (a private one, flushed or restarted) no capacity
//! is leased until the holders registered; a Redis that is not there
//! means local mode.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use admission::cluster::{Cluster, FailClosed, Mode, SETTLE};
use admission::limits::{Ask, LimitKind, Limiter};
use gateway_lite::tenants::{Caller, ModelLimits};

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn prefix() -> String {
    format!("mt-test-{}:", uuid::Uuid::now_v7().simple())
}

fn caller(rpm: Option<u32>, conc: Option<u32>) -> Caller {
    let limits = ModelLimits {
        rpm,
        tpm: None,
        max_context: None,
        max_output: None,
    };
    Caller {
        tenant_id: "t".into(),
        api_key_id: "k".into(),
        priority: 3,
        weight: 1,
        max_concurrency: conc,
        max_kv_mib_seconds: None,
        slo: Default::default(),
        rate: None,
        limits: Arc::new(HashMap::from([("*".to_owned(), limits)])),
    }
}

fn ask(n: usize) -> Ask<'static> {
    Ask {
        model: "m",
        estimate: 10,
        kv_mib_seconds: 0,
        request_id: format!("req_{n}"),
    }
}

async fn gateway(prefix: &str, id: &str) -> Limiter {
    let cluster = Cluster::connect(&redis_url(), prefix, id, FailClosed::alone()).unwrap();
    let limiter = Limiter::new(None, cluster);
    limiter.renew(true).await;
    assert_eq!(
        limiter.cluster().mode(),
        Mode::Shared,
        "Redis at {}",
        redis_url()
    );
    limiter
}

/// One gateway sharing the reference global bucket (400/s, burst 60)
/// under `prefix`.
async fn with_reference_global(prefix: &str) -> Limiter {
    let global = Some(admission::limits::RequestRate {
        per_second: 400,
        burst: 60,
    });
    let l = Limiter::new(
        global,
        Cluster::connect(&redis_url(), prefix, "gw-a", FailClosed::alone()).unwrap(),
    );
    l.renew(true).await;
    l
}

/// Admits on `limiters` in turn until every one has been refused; returns
/// how many each admitted.
async fn admit_until_refused(limiters: &[Limiter], c: &Caller) -> Vec<u32> {
    let mut admitted = vec![0; limiters.len()];
    let mut refused = vec![false; limiters.len()];
    let mut n = 0;
    while refused.iter().any(|r| !r) {
        for (i, l) in limiters.iter().enumerate() {
            if refused[i] {
                continue;
            }
            n += 1;
            match l.admit(c, ask(n)).await {
                Ok(p) => {
                    admitted[i] += 1;
                    drop(p);
                }
                Err(r) => {
                    assert_eq!(r.limit, LimitKind::Requests);
                    refused[i] = true;
                }
            }
        }
    }
    admitted
}

#[tokio::test]
async fn two_gateways_on_one_key_stay_within_its_limit_together() {
    let p = prefix();
    let a = gateway(&p, "gw-a").await;
    let b = gateway(&p, "gw-b").await;
    // The heartbeat of both: each now knows there are two.
    a.renew(true).await;
    assert_eq!(a.cluster().peers(), 2);
    let c = caller(Some(600), None);
    let started = std::time::Instant::now();
    let shared = admit_until_refused(&[a, b], &c).await;
    let total: u32 = shared.iter().sum();
    // 600/min refills 10/s: the limit plus what refilled while we ran.
    let refilled = (started.elapsed().as_secs_f64() * 10.0).ceil() as u32;
    assert!(
        (600..=600 + refilled).contains(&total),
        "together {shared:?} = {total}, limit 600 + {refilled} refilled"
    );
    assert!(shared.iter().all(|n| *n > 0), "both admitted: {shared:?}");

    // The same two gateways with their limits in memory admit the limit each.
    let local = [
        Limiter::new(None, Cluster::local("gw-a")),
        Limiter::new(None, Cluster::local("gw-b")),
    ];
    let alone = admit_until_refused(&local, &c).await;
    assert!(alone.iter().all(|n| *n >= 600), "{alone:?}");
}

#[tokio::test]
async fn concurrency_is_shared_and_a_silent_gateways_share_comes_back() {
    let p = prefix();
    let a = gateway(&p, "gw-a").await;
    let b = gateway(&p, "gw-b").await;
    let c = caller(None, Some(4));
    let mut held = Vec::new();
    for n in 0..3 {
        held.push(a.admit(&c, ask(n)).await.unwrap());
    }
    let on_b = b.admit(&c, ask(10)).await.unwrap();
    let refused = b.admit(&c, ask(11)).await.unwrap_err();
    assert_eq!(refused.limit, LimitKind::Concurrency);
    assert!(
        a.admit(&c, ask(12)).await.is_err(),
        "4 in flight across both"
    );
    drop(on_b);
    // Released on b: b may use its unit again at once.
    let again = b.admit(&c, ask(13)).await.unwrap();
    drop(again);

    // Gateway a goes silent holding 3 (its liveness key lapses as after a
    // SIGKILL; deleting it stands for the 15 s without renewal).
    let mut conn = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let alive = format!("{p}gw:gw-a");
    let removed: i64 = redis::cmd("DEL")
        .arg(&alive)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(removed, 1, "gateway a's liveness key was {alive}");
    std::mem::forget(held);
    let mut took = Vec::new();
    for n in 20..24 {
        took.push(b.admit(&c, ask(n)).await.unwrap());
    }
    assert!(b.admit(&c, ask(30)).await.is_err(), "the cap is still 4");
}

#[tokio::test]
async fn no_redis_means_local_mode_and_the_gateway_keeps_answering() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cluster = Cluster::connect(
        &format!("redis://127.0.0.1:{port}"),
        &prefix(),
        "gw",
        FailClosed::alone(),
    )
    .unwrap();
    let l = Limiter::new(None, cluster);
    let started = std::time::Instant::now();
    l.renew(true).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(l.cluster().mode(), Mode::Local);
    let c = caller(Some(5), None);
    let admitted = admit_until_refused(std::slice::from_ref(&l), &c).await;
    assert_eq!(admitted, vec![5], "alone, its share is the whole limit");
}

async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Admits `c` on `l` once Redis has settled after losing its state (at
/// most [`SETTLE`] and a second); refused as settling until then. Runs
/// `l`'s renewal tick between tries, as its background task would.
async fn admit_after_settling(l: &Limiter, c: &Caller, n: usize) -> admission::limits::Permit {
    let deadline = std::time::Instant::now() + SETTLE + Duration::from_secs(1);
    loop {
        match l.admit(c, ask(n)).await {
            Ok(p) => return p,
            Err(r) => {
                assert_eq!(r.limit, LimitKind::Concurrency);
                assert!(r.message.contains("registering"), "{}", r.message);
                assert!(
                    std::time::Instant::now() < deadline,
                    "still settling after {SETTLE:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
                l.renew(false).await;
            }
        }
    }
}

#[tokio::test]
async fn requests_in_flight_are_held_again_after_redis_came_back_empty() {
    let mut redis = devstack::PrivateRedis::start().await.unwrap();
    let p = prefix();
    let url = redis.url();
    let connect = |id: &str| {
        Limiter::new(
            None,
            Cluster::connect(&url, &p, id, FailClosed::alone()).unwrap(),
        )
    };
    let a = connect("gw-a");
    a.renew(true).await;
    assert_eq!(a.cluster().mode(), Mode::Shared);
    let c = caller(None, Some(3));
    let first = a.admit(&c, ask(1)).await.unwrap();
    let second = a.admit(&c, ask(2)).await.unwrap();
    redis.kill9().await;
    a.renew(true).await;
    assert_eq!(a.cluster().mode(), Mode::Local, "Redis is gone");
    // One ends and another starts while Redis is away: in local mode.
    drop(first);
    let third = a.admit(&c, ask(5)).await.unwrap();
    let held = (second, third);
    redis.restart().await.unwrap();
    a.renew(true).await;
    assert_eq!(a.cluster().mode(), Mode::Shared, "back by itself");
    // Redis came back empty; a registered its two requests in flight, so
    // another gateway gets only the one unit left of the tenant's 3 (once
    // the gateways had their heartbeat's time to register).
    let b = connect("gw-b");
    b.renew(true).await;
    let one = admit_after_settling(&b, &c, 3).await;
    let refused = b.admit(&c, ask(4)).await.unwrap_err();
    assert_eq!(refused.limit, LimitKind::Concurrency);
    drop((held, one));
}

#[tokio::test]
async fn after_a_flush_no_capacity_is_leased_until_the_holders_registered() {
    let redis = devstack::PrivateRedis::start().await.unwrap();
    let p = prefix();
    let url = redis.url();
    let connect = |id: &str| {
        Limiter::new(
            None,
            Cluster::connect(&url, &p, id, FailClosed::alone()).unwrap(),
        )
    };
    let (a, b) = (connect("gw-a"), connect("gw-b"));
    a.renew(true).await;
    b.renew(true).await;
    let c = caller(None, Some(3));
    let held = (
        a.admit(&c, ask(1)).await.unwrap(),
        a.admit(&c, ask(2)).await.unwrap(),
    );
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut redis_conn(&url).await)
        .await
        .unwrap();
    // b leases before a's heartbeat noticed: Redis forgot a's two units,
    // yet b gets none of them, nor anything, until the gateways settled.
    let refused = b.admit(&c, ask(3)).await.unwrap_err();
    assert_eq!(refused.limit, LimitKind::Concurrency);
    assert!(
        refused.message.contains("registering"),
        "{}",
        refused.message
    );
    assert!(refused.wait > Duration::from_secs(4), "{:?}", refused.wait);
    // a's heartbeat (every 5 s) finds its liveness gone and registers.
    a.renew(true).await;
    let one = admit_after_settling(&b, &c, 4).await;
    assert_eq!(
        b.admit(&c, ask(5)).await.unwrap_err().limit,
        LimitKind::Concurrency,
        "a's two and b's one: the cap of 3"
    );
    // A rate is not held back: every bucket starts full.
    let rated = caller(Some(60), None);
    drop(b.admit(&rated, ask(6)).await.unwrap());
    drop((held, one));
}

#[tokio::test]
async fn a_gateway_restarted_under_its_id_drops_what_its_previous_life_held() {
    let p = prefix();
    let c = caller(None, Some(3));
    let crashed = gateway(&p, "gw-a").await;
    let held: Vec<_> = futures_util::future::join_all((0..3).map(|n| crashed.admit(&c, ask(n))))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // SIGKILL: nothing given back, its liveness key still alive.
    std::mem::forget(held);
    std::mem::forget(crashed);
    let again = gateway(&p, "gw-a").await;
    let three: Vec<_> = futures_util::future::join_all((3..6).map(|n| again.admit(&c, ask(n))))
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|r| panic!("the restarted gateway holds nothing: {r:?}"));
    assert_eq!(
        again.admit(&c, ask(7)).await.unwrap_err().limit,
        LimitKind::Concurrency
    );
    drop(three);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_holds_what_its_requests_use_and_one_block_not_the_cap() {
    let p = prefix();
    let l = gateway(&p, "gw-a").await;
    let c = caller(None, Some(2000));
    // 24 at once, as the drill's streams: their leases race.
    let held: Vec<_> = futures_util::future::join_all((0..24).map(|n| {
        let (l, c) = (l.clone(), c.clone());
        tokio::spawn(async move { l.admit(&c, ask(n)).await.unwrap() })
    }))
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();
    // Requests keep arriving (the lease is never a second idle); the
    // renewal keeps at most two blocks (2000 / 10 each) beyond the 24 in use.
    drop(l.admit(&c, ask(100)).await.unwrap());
    l.renew(false).await;
    let units: i64 = redis::cmd("HGET")
        .arg(format!("{p}inflight:t"))
        .arg(l.cluster().holder())
        .query_async(&mut redis_conn(&redis_url()).await)
        .await
        .unwrap();
    assert!(
        (24..=24 + 400).contains(&units),
        "holds {units} for 24 requests in flight"
    );
    drop(held);
}

#[tokio::test]
async fn a_gateway_shutting_down_gives_back_what_it_holds_at_once() {
    let p = prefix();
    let a = gateway(&p, "gw-a").await;
    let b = gateway(&p, "gw-b").await;
    let c = caller(None, Some(2));
    // a's two requests ended; it still holds their units (given back only
    // after a second of disuse by its renewal, which this test never runs).
    drop((
        a.admit(&c, ask(1)).await.unwrap(),
        a.admit(&c, ask(2)).await.unwrap(),
    ));
    assert_eq!(
        b.admit(&c, ask(3)).await.unwrap_err().limit,
        LimitKind::Concurrency,
        "a still holds the tenant's two units"
    );
    // SIGTERM: a gives everything back and leaves; b has the cap at once.
    a.release().await;
    let both = (
        b.admit(&c, ask(4)).await.unwrap(),
        b.admit(&c, ask(5)).await.unwrap(),
    );
    drop(both);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_admissions_under_the_burst_are_never_refused() {
    let l = with_reference_global(&prefix()).await;
    let c = caller(None, None);
    // 50 at once, under the burst of 60: leases race each other in Redis,
    // yet every one is admitted from what this gateway holds.
    let tries = (0..50).map(|n| {
        let (l, c) = (l.clone(), c.clone());
        tokio::spawn(async move { l.admit(&c, ask(n)).await.map(drop) })
    });
    let refused = futures_util::future::join_all(tries)
        .await
        .into_iter()
        .filter(|r| !matches!(r, Ok(Ok(()))))
        .count();
    assert_eq!(refused, 0, "{refused} of 50 refused under a burst of 60");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_is_not_refused_for_global_tokens_its_own_gateway_holds() {
    // The demo's stray 429 `global_requests`: a request of a tenant whose
    // own bucket also needs a lease asks Redis for both; Redis is short of
    // global tokens because this very gateway's concurrent leases hold
    // them. The request must lease its tenant's tokens again, not be
    // refused by the global limit.
    for round in 0..60 {
        let l = with_reference_global(&prefix()).await;
        let with_rate = |tenant: &str, per_second, burst| Caller {
            tenant_id: tenant.into(),
            rate: Some(admission::limits::RequestRate { per_second, burst }),
            ..caller(None, None)
        };
        let (big, small) = (with_rate("big", 1_000, 10_000), with_rate("small", 10, 5));
        // Three of one tenant and one of another at once, under every
        // burst; the three's leases (1 + a block of 20 each) take the
        // whole global burst of 60 whenever Redis runs them first.
        let tries = (0..4).map(|n| {
            let (l, c) = (l.clone(), if n == 3 { small.clone() } else { big.clone() });
            tokio::spawn(async move { l.admit(&c, ask(n)).await.map(drop) })
        });
        let refused: Vec<String> = futures_util::future::join_all(tries)
            .await
            .into_iter()
            .filter_map(|r| match r {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("{:?}: {}", e.limit, e.message)),
                Err(e) => Some(e.to_string()),
            })
            .collect();
        assert!(refused.is_empty(), "round {round}: refused {refused:?}");
    }
}

/// Keeps Redis busy for ARGV[1] ms (scripts run alone): what is sent
/// meanwhile waits in its socket.
const SPIN: &str = r"
local t = redis.call('TIME')
local until_us = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1]) * 1000
repeat t = redis.call('TIME') until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= until_us
return 1
";

#[tokio::test]
async fn an_admission_dropped_mid_lease_loses_nothing_redis_granted() {
    let redis = devstack::PrivateRedis::start().await.unwrap();
    let (p, url) = (prefix(), redis.url());
    let connect = |id: &str| {
        Limiter::new(
            None,
            Cluster::connect(&url, &p, id, FailClosed::alone()).unwrap(),
        )
    };
    let (a, b) = (connect("gw-a"), connect("gw-b"));
    a.renew(true).await;
    b.renew(true).await;
    let c = caller(None, Some(1));
    // The lease script is loaded (another tenant's admission), so the
    // call below is one EVALSHA.
    let warm = Caller {
        tenant_id: "warm".into(),
        ..c.clone()
    };
    drop(a.admit(&warm, ask(0)).await.unwrap());
    // Redis busy for 150 ms (under the 250 ms a gateway waits for it).
    let mut conn = redis_conn(&url).await;
    let busy = tokio::spawn(async move {
        redis::cmd("EVAL")
            .arg(SPIN)
            .arg(0)
            .arg(150)
            .query_async::<i64>(&mut conn)
            .await
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    // A client goes away while its admission's lease waits in Redis's
    // socket: the lease still runs and grants a the tenant's one unit.
    let mut gone = Box::pin(a.admit(&c, ask(1)));
    assert!(futures_util::poll!(gone.as_mut()).is_pending());
    tokio::time::sleep(Duration::from_millis(30)).await;
    drop(gone);
    busy.await.unwrap().unwrap();
    // a knows it holds that unit, unused: its renewal gives it back after
    // a second, and b may have it.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    a.renew(false).await;
    let on_b = b
        .admit(&c, ask(2))
        .await
        .unwrap_or_else(|r| panic!("the unit a was granted never came back: {r:?}"));
    drop(on_b);
}

/// Holds `c`'s requests on `l` until one is refused; returns how many ran
/// at once.
async fn hold_until_refused(l: &Limiter, c: &Caller) -> usize {
    let mut held = Vec::new();
    loop {
        match l.admit(c, ask(held.len())).await {
            Ok(p) => held.push(p),
            Err(r) => {
                assert_eq!(r.limit, LimitKind::Concurrency, "{}", r.message);
                return held.len();
            }
        }
    }
}

/// Fail-closed that is closed: three gateways see one another, Redis
/// dies, one of them restarts. Each, the restarted one included, holds at
/// most a third of the concurrency cap (the most it has seen, kept in its
/// file), never the whole cap; a gateway that never saw Redis divides by
/// `GATEWAY_EXPECTED_PEERS`.
#[tokio::test]
async fn without_redis_concurrency_is_divided_by_the_most_gateways_seen_even_after_a_restart() {
    let mut redis = devstack::PrivateRedis::start().await.unwrap();
    let (url, p) = (redis.url(), prefix());
    let dir = tempfile::tempdir().unwrap();
    let fail_closed = |id: &str| FailClosed {
        expected_peers: 1,
        seen_file: Some(dir.path().join(format!("{id}-peers-seen"))),
    };
    let connect = |id: &str| {
        Limiter::new(
            None,
            Cluster::connect(&url, &p, id, fail_closed(id)).unwrap(),
        )
    };
    let gateways = [connect("gw-a"), connect("gw-b"), connect("gw-c")];
    for _ in 0..2 {
        for g in &gateways {
            g.renew(true).await;
        }
    }
    assert_eq!(gateways[0].cluster().peers(), 3);
    let c = caller(None, Some(7));
    redis.kill9().await;
    for g in &gateways {
        g.renew(true).await;
        assert_eq!(g.cluster().mode(), Mode::Local);
    }
    // 7 ÷ 3 gateways: 2 each, 6 together, never 7 on one.
    for g in &gateways {
        assert_eq!(hold_until_refused(g, &c).await, 2);
    }
    // gw-a restarts while Redis is still down: it has seen nobody in this
    // life, and still divides by 3.
    let restarted = connect("gw-a");
    restarted.renew(true).await;
    assert_eq!(restarted.cluster().mode(), Mode::Local);
    assert_eq!(restarted.cluster().closed_peers(), 3);
    assert_eq!(hold_until_refused(&restarted, &c).await, 2);
    // A new gateway that never reached Redis divides by the expected count.
    let new = Limiter::new(
        None,
        Cluster::connect(&url, &p, "gw-new", FailClosed::expect(3)).unwrap(),
    );
    new.renew(true).await;
    assert_eq!(hold_until_refused(&new, &c).await, 2);
    // Rates still fail open to the gateways last seen (a new one: alone).
    assert_eq!(new.cluster().peers(), 1);
}
