//! Token-bucket arithmetic, for the buckets a gateway keeps in memory (all
//! of them in local mode). Time is passed in, so it is tested with a
//! virtual clock.

use std::time::{Duration, Instant};

use super::Window;

/// A bucket's shape: how much it holds and how fast it refills.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub capacity: f64,
    pub per_sec: f64,
}

impl Rate {
    /// A per-minute limit: holds one minute's allowance.
    pub fn per_minute(limit: f64) -> Self {
        Self {
            capacity: limit,
            per_sec: limit / 60.0,
        }
    }

    /// Requests per second with a burst.
    pub fn requests(r: super::RequestRate) -> Self {
        Self {
            capacity: f64::from(r.burst.max(1)),
            per_sec: f64::from(r.per_second),
        }
    }

    /// This gateway's share when `peers` gateways split the limit (local
    /// mode); it still holds at least one request.
    pub fn share(self, peers: u32) -> Self {
        let n = f64::from(peers.max(1));
        Self {
            capacity: (self.capacity / n).max(1.0),
            per_sec: self.per_sec / n,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    pub level: f64,
    at: Instant,
}

impl Bucket {
    pub fn full(rate: Rate, now: Instant) -> Self {
        Self {
            level: rate.capacity,
            at: now,
        }
    }

    /// Refills for the time since the last look; the rate may have
    /// changed since (limits are reloaded), so the level is clamped to it.
    pub fn refill(&mut self, rate: Rate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + rate.per_sec * elapsed).min(rate.capacity);
        self.at = now.max(self.at);
    }

    /// Time until the level reaches `need` (zero if it already has).
    pub fn wait_for(&self, need: f64, rate: Rate) -> Duration {
        if self.level >= need || rate.per_sec <= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((need - self.level) / rate.per_sec)
    }

    pub fn window(&self, rate: Rate) -> Window {
        Window {
            limit: rate.capacity as u64,
            remaining: self.level.max(0.0).floor() as u64,
            reset: self.wait_for(rate.capacity, rate),
        }
    }
}
