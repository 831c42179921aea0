//! The retry budget: when retries are more than 20% of the requests this
//! gateway admitted over the last minute, retries of tenants below the
//! reserved class are shed with 503 (`retry_budget_exhausted`, the
//! capacity Retry-After) before any first attempt is — so a retry storm
//! cannot multiply the load it came from.
//!
//! A retry is a request whose `Idempotency-Key` claim was already there
//! and that would run again: the next attempt after a failed one, or a
//! claim taken over from a gateway that died. A replay of a stored answer
//! costs nothing and is never shed; a duplicate while the first runs is a
//! 409 anyway. The window is per gateway (behind a load balancer every
//! gateway sees about the same mix).

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

/// Seconds in the window.
const WINDOW_SECS: usize = 60;
/// Retries may be at most this share of admitted requests, in percent.
pub const MAX_RETRY_PERCENT: u64 = 20;
/// Below this many admitted requests in the window, retries are never shed.
const MIN_ADMITTED: u64 = 20;

#[derive(Debug, Clone, Copy, Default)]
struct Second {
    at: u64,
    admitted: u64,
    retries: u64,
}

/// Per-second counts over the last minute.
#[derive(Debug)]
pub struct RetryBudget {
    origin: Instant,
    seconds: Mutex<[Second; WINDOW_SECS]>,
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            seconds: Mutex::new([Second::default(); WINDOW_SECS]),
        }
    }
}

impl RetryBudget {
    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_secs()
    }

    /// A request was admitted (a retry or a first attempt).
    pub fn admitted(&self, retry: bool, now: Instant) {
        let s = self.second(now);
        let mut seconds = self.seconds.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = &mut seconds[s as usize % WINDOW_SECS];
        if slot.at != s {
            *slot = Second {
                at: s,
                ..Second::default()
            };
        }
        slot.admitted += 1;
        slot.retries += u64::from(retry);
    }

    /// Whether one more retry keeps retries within the budget.
    pub fn allows_retry(&self, now: Instant) -> bool {
        let s = self.second(now);
        let seconds = self.seconds.lock().unwrap_or_else(PoisonError::into_inner);
        let (admitted, retries) = seconds
            .iter()
            .filter(|x| x.at + WINDOW_SECS as u64 > s && x.at <= s && (x.admitted > 0))
            .fold((0, 0), |(a, r), x| (a + x.admitted, r + x.retries));
        admitted < MIN_ADMITTED || (retries + 1) * 100 <= (admitted + 1) * MAX_RETRY_PERCENT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn retries_above_a_fifth_of_the_minute_are_refused_and_the_window_moves_on() {
        let b = RetryBudget::default();
        let t0 = Instant::now();
        assert!(b.allows_retry(t0), "an idle gateway allows retries");
        for _ in 0..80 {
            b.admitted(false, t0);
        }
        // 20 retries of 100 admitted is 20%: the 20th is still allowed.
        let mut allowed = 0;
        while b.allows_retry(t0) {
            b.admitted(true, t0);
            allowed += 1;
            assert!(allowed < 1000);
        }
        assert_eq!(allowed, 20, "80 first attempts carry 20 retries");
        // A minute later those counts are gone.
        assert!(b.allows_retry(t0 + Duration::from_secs(61)));
        // Few requests: never shed.
        let quiet = RetryBudget::default();
        for _ in 0..5 {
            quiet.admitted(true, t0);
        }
        assert!(quiet.allows_retry(t0));
    }
}
