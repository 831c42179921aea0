//! The limiter's own tests.

#![allow(clippy::unwrap_used, reason = "tests fail loudly")]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use super::{headers::*, kinds::*, limiter::*};
use crate::caller::Caller;
use crate::caller::ModelLimits;
use crate::cluster::Cluster;

async fn admit(
    l: &Limiter,
    c: &Caller,
    model: &str,
    estimate: u64,
    now: Instant,
) -> Result<Permit, Rejected> {
    let ask = Ask {
        model,
        estimate,
        kv_mib_seconds: 0,
        request_id: "req".into(),
    };
    l.admit_at(c, ask, Some(now)).await
}

fn caller(rpm: Option<u32>, tpm: Option<u64>, conc: Option<u32>) -> Caller {
    let limits = ModelLimits {
        rpm,
        tpm,
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

#[tokio::test]
async fn a_saturated_pool_refuses_priority_1_with_or_without_a_rate_limit_and_only_on_it() {
    let ladder = crate::ladder::Ladder::new();
    let l = Limiter::default().with_ladder(ladder.clone());
    let low = |rate: Option<RequestRate>| Caller {
        priority: 1,
        rate,
        ..caller(None, None, None)
    };
    let limited = low(Some(RequestRate {
        per_second: 100,
        burst: 10,
    }));
    let t0 = Instant::now();
    drop(admit(&l, &low(None), "m", 10, t0).await.unwrap());
    // Requests waiting at one look: not yet (a moment's wait is not
    // saturation); still as many at the next: saturated.
    let windows = fleet::slo::Windows::default();
    ladder.evaluate(&[("m".into(), 3)], &windows, t0);
    assert_eq!(ladder.percent("m", 1), 100, "one look is not enough");
    ladder.evaluate(&[("m".into(), 3), ("other".into(), 0)], &windows, t0);
    assert_eq!(ladder.percent("m", 1), 0);
    // Only that pool: priority 1 keeps its whole rate on another model.
    assert_eq!(ladder.percent("other", 1), 100);
    drop(admit(&l, &low(None), "other", 10, t0).await.unwrap());
    drop(admit(&l, &limited, "other", 10, t0).await.unwrap());
    for c in [low(None), limited] {
        let r = admit(&l, &c, "m", 10, t0).await.unwrap_err();
        assert_eq!(r.limit, LimitKind::Degraded, "{:?}", c.rate);
    }
    // Priority 3 without a rate limit is not slowed (nothing to scale).
    assert!(admit(&l, &caller(None, None, None), "m", 10, t0)
        .await
        .is_ok());
    // The queue empties: priority 1 is back.
    ladder.evaluate(&[("m".into(), 0)], &windows, t0);
    drop(admit(&l, &low(None), "m", 10, t0).await.unwrap());
}

#[tokio::test]
async fn requests_per_minute_trip_and_refill() {
    let l = Limiter::default();
    let c = caller(Some(3), None, None);
    let t0 = Instant::now();
    for _ in 0..3 {
        drop(admit(&l, &c, "m", 10, t0).await.unwrap());
    }
    let r = admit(&l, &c, "m", 10, t0).await.unwrap_err();
    assert_eq!(r.limit, LimitKind::Requests);
    assert_eq!(r.wait, Duration::from_secs(20));
    // 20 s later one request token is back.
    assert!(admit(&l, &c, "m", 10, t0 + Duration::from_secs(20))
        .await
        .is_ok());
    // Another model has its own bucket.
    assert!(admit(&l, &c, "other", 10, t0).await.is_ok());
}

#[tokio::test]
async fn tokens_are_refunded_at_settle() {
    let l = Limiter::default();
    let c = caller(None, Some(1000), None);
    let t0 = Instant::now();
    let mut p = admit(&l, &c, "m", 800, t0).await.unwrap();
    assert_eq!(l.status(&c, "m", t0).tokens.unwrap().remaining, 200);
    let r = admit(&l, &c, "m", 300, t0).await.unwrap_err();
    assert_eq!(r.limit, LimitKind::Tokens);
    p.settle(100, t0);
    p.settle(0, t0);
    assert_eq!(l.status(&c, "m", t0).tokens.unwrap().remaining, 900);
    assert!(admit(&l, &c, "m", 300, t0).await.is_ok());
}

#[tokio::test]
async fn an_estimate_above_a_minute_waits_for_a_full_bucket() {
    let l = Limiter::default();
    let c = caller(None, Some(100), None);
    let t0 = Instant::now();
    let mut p = admit(&l, &c, "m", 250, t0).await.unwrap();
    p.settle(250, t0);
    let r = admit(&l, &c, "m", 250, t0).await.unwrap_err();
    // From -150 back to a full 100 takes 250/100 of a minute.
    assert_eq!(r.wait, Duration::from_secs(150));
    assert!(admit(&l, &c, "m", 250, t0 + Duration::from_secs(150))
        .await
        .is_ok());
}

#[tokio::test]
async fn concurrency_slot_is_released_on_drop() {
    let l = Limiter::default();
    let c = caller(None, None, Some(2));
    let t0 = Instant::now();
    let a = admit(&l, &c, "m", 1, t0).await.unwrap();
    let _b = admit(&l, &c, "x", 1, t0).await.unwrap();
    assert_eq!(
        admit(&l, &c, "m", 1, t0).await.unwrap_err().limit,
        LimitKind::Concurrency
    );
    drop(a);
    assert_eq!(l.in_flight("t"), 1);
    assert!(admit(&l, &c, "m", 1, t0).await.is_ok());
}

#[tokio::test]
async fn rejection_charges_nothing() {
    let l = Limiter::default();
    let c = caller(Some(10), Some(100), Some(1));
    let t0 = Instant::now();
    let _held = admit(&l, &c, "m", 10, t0).await.unwrap();
    assert!(admit(&l, &c, "m", 10, t0).await.is_err());
    let s = l.status(&c, "m", t0);
    assert_eq!(s.requests.unwrap().remaining, 9);
    assert_eq!(s.tokens.unwrap().remaining, 90);
}

#[test]
fn reset_durations_read_like_openai() {
    assert_eq!(format_reset(Duration::from_millis(20)), "20ms");
    assert_eq!(format_reset(Duration::from_secs(1)), "1s");
    assert_eq!(format_reset(Duration::from_millis(1500)), "2s");
    assert_eq!(format_reset(Duration::from_secs(360)), "6m0s");
    assert_eq!(format_reset(Duration::from_secs(3723)), "1h2m3s");
    assert_eq!(format_reset(Duration::ZERO), "0ms");
}

#[test]
fn retry_after_is_jittered_and_at_least_the_wait() {
    let limited: Vec<RetryAfter> = (0..500)
        .map(|_| RetryAfter::rate_limited(Duration::from_micros(1_500_100)))
        .collect();
    // The limit's own wait, rounded up to the millisecond, plus [0, 2 s].
    assert!(
        limited.iter().all(|r| (1_501..=3_501).contains(&r.millis)),
        "{limited:?}"
    );
    assert!(limited.iter().all(|r| r.secs() == r.millis.div_ceil(1_000)));
    let capacity: Vec<RetryAfter> = (0..500).map(|_| RetryAfter::no_capacity()).collect();
    assert!(
        capacity
            .iter()
            .all(|r| (5_000..=10_000).contains(&r.millis)),
        "{capacity:?}"
    );
    let distinct: std::collections::HashSet<u64> = capacity.iter().map(|r| r.millis).collect();
    assert!(
        distinct.len() > 100,
        "jittered, not a constant: {}",
        distinct.len()
    );
    // Spread over the whole window, not bunched at one end.
    assert!(capacity.iter().any(|r| r.millis < 6_000) && capacity.iter().any(|r| r.millis > 9_000));
    assert_eq!(RetryAfter { millis: 0 }.secs(), 1, "never Retry-After: 0");
}

#[tokio::test]
async fn tenant_rate_and_global_rate_are_buckets_with_bursts() {
    let now = Instant::now();
    let mut a = caller(None, None, None);
    a.rate = Some(RequestRate {
        per_second: 2,
        burst: 2,
    });
    let l = Limiter::default();
    let _p1 = admit(&l, &a, "m", 1, now).await.unwrap();
    let _p2 = admit(&l, &a, "m", 1, now).await.unwrap();
    let r = admit(&l, &a, "m", 1, now).await.unwrap_err();
    assert_eq!(r.limit, LimitKind::TenantRequests);
    assert_eq!(r.wait, Duration::from_millis(500));
    assert!(admit(&l, &a, "m", 1, now + Duration::from_millis(500))
        .await
        .is_ok());

    // The global bucket sits above every tenant; a request it turns
    // away is not charged to its tenant's bucket.
    let g = Limiter::new(
        Some(RequestRate {
            per_second: 2,
            burst: 1,
        }),
        Cluster::local("gw"),
    );
    let mut b = caller(None, None, None);
    b.tenant_id = "other".into();
    b.rate = Some(RequestRate {
        per_second: 1,
        burst: 1,
    });
    let _first = admit(&g, &a, "m", 1, now).await.unwrap();
    let r = admit(&g, &b, "m", 1, now).await.unwrap_err();
    assert_eq!(r.limit, LimitKind::GlobalRequests);
    assert_eq!(r.wait, Duration::from_millis(500));
    // Had the rejection taken b's one request, b's bucket (1/s) would
    // hold only half a request now.
    assert!(admit(&g, &b, "m", 1, now + Duration::from_millis(500))
        .await
        .is_ok());
}
