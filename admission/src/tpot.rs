//! The time per output token each model is running at, for the KV·seconds
//! estimate of a request at admission: the p95 of the TPOT of requests
//! that ended in the last 30 s on this gateway, clamped to [target,
//! 4 × target]; 2 × target when no request ended in the last 60 s. The
//! target is the model's own step time for one decode at an empty batch
//! (its weights over its bandwidth), the best TPOT it can do.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Samples older than this do not count towards the p95.
const WINDOW: Duration = Duration::from_secs(30);
/// With no sample this recent, the estimate is 2 × target.
const STALE: Duration = Duration::from_secs(60);
/// The p95 is recomputed at most this often per model.
const RECOMPUTE: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Model {
    samples: VecDeque<(Instant, Duration)>,
    cached: Option<(Instant, Duration)>,
}

/// Per model, recent TPOTs; cheap to clone.
#[derive(Clone, Default)]
pub struct Tpot {
    models: Arc<Mutex<HashMap<String, Model>>>,
}

impl std::fmt::Debug for Tpot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tpot").finish_non_exhaustive()
    }
}

impl Tpot {
    /// A request on `model` ended at `now` with this TPOT.
    pub fn record(&self, model: &str, tpot: Duration, now: Instant) {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let m = models.entry(model.to_owned()).or_default();
        m.samples.push_back((now, tpot));
        while m
            .samples
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > WINDOW)
        {
            m.samples.pop_front();
        }
    }

    /// The TPOT to estimate with for `model`, whose best is `target`.
    pub fn estimate(&self, model: &str, target: Duration, now: Instant) -> Duration {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(m) = models.get_mut(model) else {
            return target * 2;
        };
        let latest = m.samples.back().map(|(at, _)| *at);
        if latest.is_none_or(|at| now.saturating_duration_since(at) > STALE) {
            return target * 2;
        }
        if let Some((at, p95)) = m.cached {
            if now.saturating_duration_since(at) < RECOMPUTE {
                return p95.clamp(target, target * 4);
            }
        }
        let mut recent: Vec<Duration> = m
            .samples
            .iter()
            .filter(|(at, _)| now.saturating_duration_since(*at) <= WINDOW)
            .map(|(_, d)| *d)
            .collect();
        let p95 = if recent.is_empty() {
            target * 2
        } else {
            let i = (recent.len() * 95).div_ceil(100).saturating_sub(1);
            *recent.select_nth_unstable(i).1
        };
        m.cached = Some((now, p95));
        p95.clamp(target, target * 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p95_clamped_and_stale_falls_back_to_twice_the_target() {
        let t = Tpot::default();
        let target = Duration::from_millis(20);
        let t0 = Instant::now();
        assert_eq!(t.estimate("m", target, t0), target * 2, "nothing measured");
        for i in 1..=100u64 {
            t.record("m", Duration::from_millis(i), t0);
        }
        // p95 of 1..=100 ms is 95 ms, above 4 × 20: clamped.
        assert_eq!(t.estimate("m", target, t0), Duration::from_millis(80));
        let fast = Tpot::default();
        for _ in 0..10 {
            fast.record("m", Duration::from_millis(5), t0);
        }
        assert_eq!(
            fast.estimate("m", target, t0),
            target,
            "never below the target"
        );
        let mid = Tpot::default();
        for i in 0..100u64 {
            mid.record("m", Duration::from_millis(20 + i % 20), t0);
        }
        assert_eq!(mid.estimate("m", target, t0), Duration::from_millis(38));
        assert_eq!(
            mid.estimate("m", target, t0 + Duration::from_secs(61)),
            target * 2,
            "older than 60 s"
        );
    }
}
