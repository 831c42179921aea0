//! Time for replicas. A replica only knows virtual microseconds; this
//! module decides how they relate to the wall clock:
//!
//! - [`run_virtual`] drives a replica through a timeline of arrivals and
//!   cancellations as fast as the CPU allows (tests, the benchmark): hours
//!   of traffic in seconds, and the same timeline always gives the same
//!   results.
//! - [`Pacer`] paces a replica against the wall clock with a speed factor
//!   (1 = real time, N = N times faster, 0 = no waiting), for the demo.

use std::time::Duration;

use tokio::time::Instant;

use crate::replica::{Event, Outcome, Replica, SeqRequest};
use crate::scheduler::SeqId;

/// Something that happens to a replica at a virtual time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Arrive {
        tenant: String,
        req: SeqRequest,
    },
    /// Cancels the `arrival`-th arrival of the timeline (0-based), if it
    /// was admitted and has not finished.
    Cancel {
        arrival: usize,
    },
}

/// What a virtual run produced, indexed by arrival.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunReport {
    /// One entry per arrival: its outcome, or None if it was not admitted.
    pub outcomes: Vec<Option<Outcome>>,
    pub rejected: usize,
    pub busy_micros: u64,
    pub idle_micros: u64,
    pub end: u64,
}

/// Runs `timeline` (sorted by time, µs) on `replica` until everything
/// admitted has finished or been cancelled.
pub fn run_virtual(replica: &mut Replica, timeline: Vec<(u64, Input)>) -> RunReport {
    let mut report = RunReport::default();
    let mut seqs: Vec<Option<SeqId>> = Vec::new();
    // (id, arrival) of admitted requests; a replica hands out increasing
    // ids, so this stays sorted for binary search.
    let mut index: Vec<(SeqId, usize)> = Vec::new();
    let mut items = timeline.into_iter().peekable();
    loop {
        while let Some((at, _)) = items.peek() {
            if *at > replica.now() {
                break;
            }
            let Some((at, input)) = items.next() else {
                break;
            };
            match input {
                Input::Arrive { tenant, req } => {
                    let n = seqs.len();
                    report.outcomes.push(None);
                    match replica.submit(&tenant, req, at) {
                        Ok(id) => {
                            seqs.push(Some(id));
                            debug_assert!(index.last().is_none_or(|&(last, _)| last < id));
                            index.push((id, n));
                        }
                        Err(_) => {
                            seqs.push(None);
                            report.rejected += 1;
                        }
                    }
                }
                Input::Cancel { arrival } => {
                    if let Some(Some(id)) = seqs.get(arrival) {
                        replica.cancel(*id);
                    }
                }
            }
        }
        // Cancellations finish requests too, so collect before deciding.
        for event in replica.drain_events() {
            if let Event::Finished(o) = event {
                if let Ok(k) = index.binary_search_by_key(&o.id, |&(id, _)| id) {
                    report.outcomes[index[k].1] = Some(o);
                }
            }
        }
        if replica.has_work() {
            if replica.step().is_none() {
                break;
            }
        } else if let Some((at, _)) = items.peek() {
            replica.advance_idle(*at);
        } else {
            break;
        }
    }
    let stats = replica.stats();
    report.busy_micros = stats.busy_micros;
    report.idle_micros = stats.idle_micros;
    report.end = replica.now();
    report
}

/// Maps a replica's virtual time to the wall clock.
#[derive(Debug, Clone, Copy)]
pub struct Pacer {
    origin: Instant,
    speedup: u32,
}

impl Pacer {
    /// Virtual time 0 is now.
    pub fn new(speedup: u32) -> Self {
        Self {
            origin: Instant::now(),
            speedup,
        }
    }

    /// The virtual time the wall clock has reached, µs; None when not paced.
    pub fn virtual_now(&self) -> Option<u64> {
        if self.speedup == 0 {
            return None;
        }
        let real = self.origin.elapsed().as_micros();
        Some(u64::try_from(real.saturating_mul(u128::from(self.speedup))).unwrap_or(u64::MAX))
    }

    /// Waits until the wall clock reaches virtual time `at` (at once when
    /// not paced or already late).
    pub async fn wait_until(&self, at: u64) {
        if self.speedup == 0 {
            return;
        }
        let real = Duration::from_micros(at / u64::from(self.speedup));
        tokio::time::sleep_until(self.origin + real).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn pacer_maps_virtual_time_through_the_speed_factor() {
        let p = Pacer::new(10);
        p.wait_until(1_000_000).await;
        let now = p.virtual_now().unwrap();
        assert!((1_000_000..1_010_000).contains(&now), "{now}");
        assert_eq!(Pacer::new(0).virtual_now(), None);
    }
}
