//! Request limits, checked together at admission (nothing is charged when
//! any of them says no):
//!
//! - per (API key, model): requests/min and tokens/min;
//! - per tenant: requests/s with a burst (the reference config's
//!   `rateLimit`), and a cap on concurrent in-flight requests;
//! - for the whole gateway: requests/s with a burst (400/s, burst 60 in the
//!   reference fleet), above every tenant's bucket.
//!
//! Both per-minute limits are token buckets that hold at most one minute's
//! allowance and refill continuously (`limit / 60` per second). A request
//! takes one request token and, at admission, its token *estimate*
//! (prompt + min(max_tokens, max_output)); when it ends, [`Permit::settle`]
//! puts back the difference between the estimate and what it actually used,
//! at once. A request whose estimate is larger than a whole minute's
//! allowance is admitted when the bucket is full and leaves it in debt, so
//! it is slow, never impossible.
//!
//! Time is passed in (`now: Instant`), so the arithmetic is tested with a
//! virtual clock. All state is in memory: a gateway restart starts every
//! bucket full.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::tenants::Caller;

/// Which limit turned a request away; also the OpenAI error `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitKind {
    Requests,
    Tokens,
    Concurrency,
    TenantRequests,
    GlobalRequests,
}

impl LimitKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::Tokens => "tokens",
            Self::Concurrency => "concurrency",
            Self::TenantRequests => "tenant_requests",
            Self::GlobalRequests => "global_requests",
        }
    }
}

/// A request turned away, and how long until it could pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub limit: LimitKind,
    /// The least time until the limit would let this request through.
    pub wait: Duration,
    pub message: String,
}

/// One limit's figures for the `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub limit: u64,
    pub remaining: u64,
    /// Until the bucket is full again.
    pub reset: Duration,
}

/// The figures behind the `x-ratelimit-*` headers for one key and model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RateStatus {
    pub requests: Option<Window>,
    pub tokens: Option<Window>,
}

/// Requests per second with a burst: a token bucket holding `burst`,
/// refilled at `per_second`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRate {
    pub per_second: u32,
    pub burst: u32,
}

/// A bucket's shape: how much it holds and how fast it refills.
#[derive(Debug, Clone, Copy)]
struct Rate {
    capacity: f64,
    per_sec: f64,
}

impl Rate {
    /// A per-minute limit: holds one minute's allowance.
    fn per_minute(limit: f64) -> Self {
        Self {
            capacity: limit,
            per_sec: limit / 60.0,
        }
    }

    fn requests(r: RequestRate) -> Self {
        Self {
            capacity: f64::from(r.burst.max(1)),
            per_sec: f64::from(r.per_second),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    level: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: Rate, now: Instant) -> Self {
        Self {
            level: rate.capacity,
            at: now,
        }
    }

    /// Refills for the time since the last look; the rate may have
    /// changed since (limits are reloaded), so the level is clamped to it.
    fn refill(&mut self, rate: Rate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + rate.per_sec * elapsed).min(rate.capacity);
        self.at = now.max(self.at);
    }

    /// Time until the level reaches `need` (zero if it already has).
    fn wait_for(&self, need: f64, rate: Rate) -> Duration {
        if self.level >= need || rate.per_sec <= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((need - self.level) / rate.per_sec)
    }

    fn window(&self, rate: Rate) -> Window {
        Window {
            limit: rate.capacity as u64,
            remaining: self.level.max(0.0).floor() as u64,
            reset: self.wait_for(rate.capacity, rate),
        }
    }
}

/// Takes one request from `bucket` (created full), or says how long until it could.
fn take_request(bucket: &mut Option<Bucket>, rate: Rate, now: Instant) -> Result<(), Duration> {
    let b = bucket.get_or_insert_with(|| Bucket::full(rate, now));
    b.refill(rate, now);
    if b.level < 1.0 {
        return Err(b.wait_for(1.0, rate));
    }
    Ok(())
}

#[derive(Default)]
struct KeyBuckets {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

#[derive(Default)]
struct State {
    /// (api_key_id, model) → buckets.
    buckets: HashMap<(String, String), KeyBuckets>,
    /// tenant → requests in flight.
    in_flight: HashMap<String, u32>,
    /// tenant → its requests/s bucket.
    tenant_rate: HashMap<String, Option<Bucket>>,
    global: Option<Bucket>,
}

/// The limiter; cheap to clone.
#[derive(Clone, Default)]
pub struct Limiter {
    state: Arc<Mutex<State>>,
    global: Option<RequestRate>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter").finish_non_exhaustive()
    }
}

impl Limiter {
    /// A limiter with a gateway-wide requests/s bucket (`None`: no global limit).
    pub fn new(global: Option<RequestRate>) -> Self {
        Self {
            state: Arc::default(),
            global,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is plain numbers, always consistent between statements.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits one request of `estimate` tokens for `caller` on `model`, or
    /// says which limit it is over. Nothing is charged when it is rejected.
    pub fn admit(
        &self,
        caller: &Caller,
        model: &str,
        estimate: u64,
        now: Instant,
    ) -> Result<Permit, Rejected> {
        let limits = caller.limits_for(model);
        let mut state = self.lock();
        let key = (caller.api_key_id.clone(), model.to_owned());
        let entry = state.buckets.entry(key.clone()).or_default();
        let rpm = limits.rpm.map(|r| Rate::per_minute(f64::from(r)));
        let tpm = limits.tpm.map(|t| Rate::per_minute(t as f64));
        if let Some(rate) = rpm {
            take_request(&mut entry.requests, rate, now).map_err(|wait| Rejected {
                limit: LimitKind::Requests,
                wait,
                message: format!(
                    "rate limit reached for requests on {model}: {} per minute for this key",
                    rate.capacity as u64
                ),
            })?;
        }
        if let Some(rate) = tpm {
            let b = entry.tokens.get_or_insert_with(|| Bucket::full(rate, now));
            b.refill(rate, now);
            let need = (estimate as f64).min(rate.capacity);
            if b.level < need {
                return Err(Rejected {
                    limit: LimitKind::Tokens,
                    wait: b.wait_for(need, rate),
                    message: format!(
                        "rate limit reached for tokens on {model}: {} per minute for this key, \
                         this request needs about {estimate}",
                        rate.capacity as u64
                    ),
                });
            }
        }
        if let Some(r) = caller.rate {
            let bucket = state
                .tenant_rate
                .entry(caller.tenant_id.clone())
                .or_default();
            take_request(bucket, Rate::requests(r), now).map_err(|wait| Rejected {
                limit: LimitKind::TenantRequests,
                wait,
                message: format!(
                    "rate limit reached for this tenant: {} requests per second, burst {}",
                    r.per_second, r.burst
                ),
            })?;
        }
        let in_flight = state.in_flight.get(&caller.tenant_id).copied().unwrap_or(0);
        if let Some(cap) = caller.max_concurrency {
            if in_flight >= cap {
                return Err(Rejected {
                    limit: LimitKind::Concurrency,
                    wait: Duration::from_secs(1),
                    message: format!(
                        "too many concurrent requests: this tenant may have {cap} in flight"
                    ),
                });
            }
        }
        if let Some(r) = self.global {
            take_request(&mut state.global, Rate::requests(r), now).map_err(|wait| Rejected {
                limit: LimitKind::GlobalRequests,
                wait,
                message: format!(
                    "the gateway is at its limit of {} requests per second, burst {}",
                    r.per_second, r.burst
                ),
            })?;
        }
        // Every limit said yes: charge them all.
        if let Some(b) = state.global.as_mut().filter(|_| self.global.is_some()) {
            b.level -= 1.0;
        }
        if let Some(b) = state
            .tenant_rate
            .get_mut(&caller.tenant_id)
            .and_then(Option::as_mut)
            .filter(|_| caller.rate.is_some())
        {
            b.level -= 1.0;
        }
        let entry = state.buckets.entry(key.clone()).or_default();
        if let Some(b) = entry.requests.as_mut().filter(|_| rpm.is_some()) {
            b.level -= 1.0;
        }
        let charged = match entry.tokens.as_mut().filter(|_| tpm.is_some()) {
            Some(b) => {
                b.level -= estimate as f64;
                estimate
            }
            None => 0,
        };
        state
            .in_flight
            .insert(caller.tenant_id.clone(), in_flight + 1);
        crate::telemetry::active_requests(&caller.tenant_id, in_flight + 1);
        Ok(Permit {
            limiter: self.clone(),
            key,
            tenant: caller.tenant_id.clone(),
            tpm,
            charged,
            settled: false,
        })
    }

    /// The current figures for `caller` on `model` (buckets not yet used are full).
    pub fn status(&self, caller: &Caller, model: &str, now: Instant) -> RateStatus {
        let limits = caller.limits_for(model);
        let mut state = self.lock();
        let mut entry = state
            .buckets
            .get_mut(&(caller.api_key_id.clone(), model.to_owned()));
        let mut window = |rate: Option<Rate>, pick: fn(&mut KeyBuckets) -> &mut Option<Bucket>| {
            let rate = rate?;
            let bucket = match entry.as_deref_mut().and_then(|e| pick(e).as_mut()) {
                Some(b) => {
                    b.refill(rate, now);
                    *b
                }
                None => Bucket::full(rate, now),
            };
            Some(bucket.window(rate))
        };
        let requests = window(limits.rpm.map(|r| Rate::per_minute(f64::from(r))), |e| {
            &mut e.requests
        });
        let tokens = window(limits.tpm.map(|t| Rate::per_minute(t as f64)), |e| {
            &mut e.tokens
        });
        RateStatus { requests, tokens }
    }

    /// Requests in flight for `tenant`.
    pub fn in_flight(&self, tenant: &str) -> u32 {
        self.lock().in_flight.get(tenant).copied().unwrap_or(0)
    }
}

/// An admitted request's hold on its limits: releases its concurrency slot
/// when dropped; [`Permit::settle`] reconciles the token estimate.
#[derive(Debug)]
pub struct Permit {
    limiter: Limiter,
    key: (String, String),
    tenant: String,
    tpm: Option<Rate>,
    charged: u64,
    settled: bool,
}

impl Permit {
    /// Replaces the estimate charged at admission with the tokens actually
    /// used (prompt + completion): the difference is refunded at once (or,
    /// if it used more, charged). Only the first call counts.
    pub fn settle(&mut self, actual: u64, now: Instant) {
        if self.settled {
            return;
        }
        self.settled = true;
        let Some(rate) = self.tpm else { return };
        let mut state = self.limiter.lock();
        if let Some(b) = state
            .buckets
            .get_mut(&self.key)
            .and_then(|e| e.tokens.as_mut())
        {
            b.refill(rate, now);
            b.level = (b.level + self.charged as f64 - actual as f64).min(rate.capacity);
        }
    }

    /// The tokens charged at admission.
    pub fn charged(&self) -> u64 {
        self.charged
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut state = self.limiter.lock();
        if let Some(n) = state.in_flight.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            crate::telemetry::active_requests(&self.tenant, *n);
            if *n == 0 {
                state.in_flight.remove(&self.tenant);
            }
        }
    }
}

/// A duration as OpenAI writes it in `x-ratelimit-reset-*`: `20ms`, `1s`,
/// `6m0s`, `1h2m3s` (seconds rounded up).
pub fn format_reset(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        let ms = d.as_millis() + u128::from(d.subsec_nanos() % 1_000_000 != 0);
        return if ms >= 1000 {
            "1s".to_owned()
        } else {
            format!("{ms}ms")
        };
    }
    let secs = d.as_secs() + u64::from(d.subsec_nanos() != 0);
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// Sets the `x-ratelimit-*` headers a limit applies to.
pub fn apply_headers(headers: &mut HeaderMap, status: &RateStatus) {
    for (suffix, window) in [("requests", status.requests), ("tokens", status.tokens)] {
        let Some(w) = window else { continue };
        for (name, value) in [
            (format!("x-ratelimit-limit-{suffix}"), w.limit.to_string()),
            (
                format!("x-ratelimit-remaining-{suffix}"),
                w.remaining.to_string(),
            ),
            (format!("x-ratelimit-reset-{suffix}"), format_reset(w.reset)),
        ] {
            if let (Ok(n), Ok(v)) = (
                HeaderName::try_from(name),
                HeaderValue::try_from(value.as_str()),
            ) {
                headers.insert(n, v);
            }
        }
    }
}

/// How long a refused client is told to wait before retrying, to the
/// millisecond: sent as `retry-after-ms` (exact; the OpenAI SDK reads it)
/// and as `Retry-After` in whole seconds rounded up (RFC 9110). Jittered, so
/// refused clients do not come back in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryAfter {
    pub millis: u64,
}

/// A 503 for capacity waits 5 s plus up to 5 s more.
const NO_CAPACITY_WAIT_MS: u64 = 5_000;
const NO_CAPACITY_JITTER_MS: u64 = 5_000;
/// A 429 waits for its limit, plus up to 2 s more.
const RATE_LIMITED_JITTER_MS: u64 = 2_000;

impl RetryAfter {
    /// After a 503 for capacity: uniform in [5 s, 10 s].
    pub fn no_capacity() -> Self {
        Self {
            millis: NO_CAPACITY_WAIT_MS + rand::random_range(0..=NO_CAPACITY_JITTER_MS),
        }
    }

    /// After a 429: the limit's own `wait` (rounded up to the millisecond)
    /// plus uniform jitter in [0, 2 s].
    pub fn rate_limited(wait: Duration) -> Self {
        let wait_ms = u64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        Self {
            millis: wait_ms.saturating_add(rand::random_range(0..=RATE_LIMITED_JITTER_MS)),
        }
    }

    /// `Retry-After`: whole seconds, rounded up, at least 1.
    pub fn secs(self) -> u64 {
        self.millis.div_ceil(1_000).max(1)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;
    use crate::tenants::ModelLimits;

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
            max_concurrency: conc,
            rate: None,
            limits: Arc::new(HashMap::from([("*".to_owned(), limits)])),
        }
    }

    #[test]
    fn requests_per_minute_trip_and_refill() {
        let l = Limiter::default();
        let c = caller(Some(3), None, None);
        let t0 = Instant::now();
        for _ in 0..3 {
            drop(l.admit(&c, "m", 10, t0).unwrap());
        }
        let r = l.admit(&c, "m", 10, t0).unwrap_err();
        assert_eq!(r.limit, LimitKind::Requests);
        assert_eq!(r.wait, Duration::from_secs(20));
        // 20 s later one request token is back.
        assert!(l.admit(&c, "m", 10, t0 + Duration::from_secs(20)).is_ok());
        // Another model has its own bucket.
        assert!(l.admit(&c, "other", 10, t0).is_ok());
    }

    #[test]
    fn tokens_are_refunded_at_settle() {
        let l = Limiter::default();
        let c = caller(None, Some(1000), None);
        let t0 = Instant::now();
        let mut p = l.admit(&c, "m", 800, t0).unwrap();
        assert_eq!(l.status(&c, "m", t0).tokens.unwrap().remaining, 200);
        let r = l.admit(&c, "m", 300, t0).unwrap_err();
        assert_eq!(r.limit, LimitKind::Tokens);
        p.settle(100, t0);
        p.settle(0, t0);
        assert_eq!(l.status(&c, "m", t0).tokens.unwrap().remaining, 900);
        assert!(l.admit(&c, "m", 300, t0).is_ok());
    }

    #[test]
    fn an_estimate_above_a_minute_waits_for_a_full_bucket() {
        let l = Limiter::default();
        let c = caller(None, Some(100), None);
        let t0 = Instant::now();
        let mut p = l.admit(&c, "m", 250, t0).unwrap();
        p.settle(250, t0);
        let r = l.admit(&c, "m", 250, t0).unwrap_err();
        // From -150 back to a full 100 takes 250/100 of a minute.
        assert_eq!(r.wait, Duration::from_secs(150));
        assert!(l.admit(&c, "m", 250, t0 + Duration::from_secs(150)).is_ok());
    }

    #[test]
    fn concurrency_slot_is_released_on_drop() {
        let l = Limiter::default();
        let c = caller(None, None, Some(2));
        let t0 = Instant::now();
        let a = l.admit(&c, "m", 1, t0).unwrap();
        let _b = l.admit(&c, "x", 1, t0).unwrap();
        assert_eq!(
            l.admit(&c, "m", 1, t0).unwrap_err().limit,
            LimitKind::Concurrency
        );
        drop(a);
        assert_eq!(l.in_flight("t"), 1);
        assert!(l.admit(&c, "m", 1, t0).is_ok());
    }

    #[test]
    fn rejection_charges_nothing() {
        let l = Limiter::default();
        let c = caller(Some(10), Some(100), Some(1));
        let t0 = Instant::now();
        let _held = l.admit(&c, "m", 10, t0).unwrap();
        assert!(l.admit(&c, "m", 10, t0).is_err());
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
        assert!(
            capacity.iter().any(|r| r.millis < 6_000) && capacity.iter().any(|r| r.millis > 9_000)
        );
        assert_eq!(RetryAfter { millis: 0 }.secs(), 1, "never Retry-After: 0");
    }

    #[test]
    fn tenant_rate_and_global_rate_are_buckets_with_bursts() {
        let now = Instant::now();
        let mut a = caller(None, None, None);
        a.rate = Some(RequestRate {
            per_second: 2,
            burst: 2,
        });
        let l = Limiter::default();
        let _p1 = l.admit(&a, "m", 1, now).unwrap();
        let _p2 = l.admit(&a, "m", 1, now).unwrap();
        let r = l.admit(&a, "m", 1, now).unwrap_err();
        assert_eq!(r.limit, LimitKind::TenantRequests);
        assert_eq!(r.wait, Duration::from_millis(500));
        assert!(l
            .admit(&a, "m", 1, now + Duration::from_millis(500))
            .is_ok());

        // The global bucket sits above every tenant; a request it turns
        // away is not charged to its tenant's bucket.
        let g = Limiter::new(Some(RequestRate {
            per_second: 2,
            burst: 1,
        }));
        let mut b = caller(None, None, None);
        b.tenant_id = "other".into();
        b.rate = Some(RequestRate {
            per_second: 1,
            burst: 1,
        });
        let _first = g.admit(&a, "m", 1, now).unwrap();
        let r = g.admit(&b, "m", 1, now).unwrap_err();
        assert_eq!(r.limit, LimitKind::GlobalRequests);
        assert_eq!(r.wait, Duration::from_millis(500));
        // Had the rejection taken b's one request, b's bucket (1/s) would
        // hold only half a request now.
        assert!(g
            .admit(&b, "m", 1, now + Duration::from_millis(500))
            .is_ok());
    }
}
