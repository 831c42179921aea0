//! What a refused or admitted client is told: the `x-ratelimit-*`
//! headers and `Retry-After` / `retry-after-ms` with jitter.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::kinds::*;

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
pub(super) const NO_CAPACITY_WAIT_MS: u64 = 5_000;
pub(super) const NO_CAPACITY_JITTER_MS: u64 = 5_000;
/// A 429 waits for its limit, plus up to 2 s more.
pub(super) const RATE_LIMITED_JITTER_MS: u64 = 2_000;

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
