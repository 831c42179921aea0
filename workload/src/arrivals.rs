//! When requests arrive: exactly N start times in `[from, to)`, in
//! nondecreasing order, each with its tenant, streamed a slot at a time.
//!
//! The range is cut into slots aligned to the epoch (a divisor of a
//! minute, so no slot straddles an hour, and sized for ~64 arrivals). Two
//! cumulative roundings make the count exact: the N events are split among
//! tenants in proportion to their reference rates, then each tenant's
//! events among the slots in proportion to its intensity × the slot's
//! length (the intensities are quantized to integers first, so both
//! passes see the same weights). Each share is its exact share rounded
//! down or up, and the shares sum to the whole. Within a slot the start
//! milliseconds are uniform and sorted. Only one slot is held at a time.

use chrono::{DateTime, Utc};
use rand::Rng;

use crate::diurnal::{is_off_peak, Shape};

/// Slot lengths the schedule picks from, ms: every divisor of a minute
/// that divides it evenly into whole hours, longest first.
const SLOT_MS: [i64; 17] = [
    60_000, 30_000, 20_000, 15_000, 10_000, 5_000, 2_000, 1_000, 500, 200, 100, 50, 20, 10, 5, 2, 1,
];
/// The average arrivals per slot the schedule aims for (at most).
const TARGET_PER_SLOT: u64 = 64;
/// Quantization of intensity × slot length: units per intensity-millisecond.
const WEIGHT_SCALE: f64 = 1_024.0;

/// One arrival: its start (epoch ms), its tenant, whether the hour is off-peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrival {
    pub at_ms: i64,
    pub tenant: usize,
    pub off_peak: bool,
}

/// One tenant's place in the cumulative rounding over slots.
#[derive(Debug, Clone)]
struct Split {
    shape: Shape,
    /// Events this tenant gets in all.
    events: u64,
    /// Its weight over the whole range.
    total_weight: u128,
    /// Its weight over the slots already emitted.
    weight_so_far: u128,
    /// Its events already placed.
    placed: u64,
}

/// The arrival schedule; an iterator over [`Arrival`]s.
#[derive(Debug, Clone)]
pub(crate) struct Arrivals {
    from_ms: i64,
    to_ms: i64,
    slot_ms: i64,
    /// Start of the next slot to fill (aligned, may precede `from_ms`).
    next_slot: i64,
    splits: Vec<Split>,
    buffer: Vec<(i64, usize)>,
    at: usize,
    off_peak: bool,
}

impl Arrivals {
    /// The schedule of `events` arrivals in `[from_ms, to_ms)` among tenants
    /// with `shapes` and relative `rates` (same length, not all zero).
    pub(crate) fn new(
        shapes: &[Shape],
        rates: &[u64],
        from_ms: i64,
        to_ms: i64,
        events: u64,
    ) -> Self {
        let span = u64::try_from(to_ms - from_ms).unwrap_or(0).max(1);
        let wanted = span.saturating_mul(TARGET_PER_SLOT) / events.max(1);
        let slot_ms = SLOT_MS
            .into_iter()
            .find(|&s| u64::try_from(s).is_ok_and(|s| s <= wanted))
            .unwrap_or(1);
        let first_slot = from_ms.div_euclid(slot_ms) * slot_ms;
        let mut splits: Vec<Split> = shapes
            .iter()
            .map(|&shape| Split {
                shape,
                events: 0,
                total_weight: 0,
                weight_so_far: 0,
                placed: 0,
            })
            .collect();
        // Tenants' events in proportion to their rates.
        let rate_sum: u128 = rates.iter().map(|&r| u128::from(r)).sum::<u128>().max(1);
        let (mut cum, mut before) = (0u128, 0u64);
        for (split, &rate) in splits.iter_mut().zip(rates) {
            cum += u128::from(rate);
            let upto = u64::try_from(cum * u128::from(events) / rate_sum).unwrap_or(events);
            split.events = upto - before;
            before = upto;
        }
        // Each tenant's weight over the range.
        let mut slot = first_slot;
        while slot < to_ms {
            let (lo, hi) = (slot.max(from_ms), (slot + slot_ms).min(to_ms));
            let at = ms_to_time(slot);
            for split in &mut splits {
                split.total_weight += u128::from(weight(&split.shape, at, hi - lo));
            }
            slot += slot_ms;
        }
        Self {
            from_ms,
            to_ms,
            slot_ms,
            next_slot: first_slot,
            splits,
            buffer: Vec::new(),
            at: 0,
            off_peak: false,
        }
    }

    /// The next arrival, drawing the next slot's start times from `rng`
    /// when the current slot is used up.
    pub(crate) fn next(&mut self, rng: &mut impl Rng) -> Option<Arrival> {
        while self.at == self.buffer.len() {
            if self.next_slot >= self.to_ms {
                return None;
            }
            self.fill(rng);
        }
        let (at_ms, tenant) = self.buffer[self.at];
        self.at += 1;
        Some(Arrival {
            at_ms,
            tenant,
            off_peak: self.off_peak,
        })
    }

    fn fill(&mut self, rng: &mut impl Rng) {
        let slot = self.next_slot;
        self.next_slot += self.slot_ms;
        let (lo, hi) = (
            slot.max(self.from_ms),
            (slot + self.slot_ms).min(self.to_ms),
        );
        let at = ms_to_time(slot);
        self.buffer.clear();
        self.at = 0;
        self.off_peak = is_off_peak(at);
        for (tenant, split) in self.splits.iter_mut().enumerate() {
            split.weight_so_far += u128::from(weight(&split.shape, at, hi - lo));
            let upto = (split.weight_so_far * u128::from(split.events))
                .checked_div(split.total_weight)
                .map_or(split.events, |n| u64::try_from(n).unwrap_or(split.events));
            for _ in split.placed..upto {
                self.buffer.push((rng.random_range(lo..hi), tenant));
            }
            split.placed = upto.max(split.placed);
        }
        self.buffer.sort_unstable();
    }
}

/// A slot's integer weight for a tenant: intensity × length, quantized.
fn weight(shape: &Shape, slot_start: DateTime<Utc>, len_ms: i64) -> u64 {
    let w = shape.intensity(slot_start) * len_ms as f64 * WEIGHT_SCALE;
    (w.round() as u64).max(1)
}

pub(crate) fn ms_to_time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tenant;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn schedule(from_ms: i64, to_ms: i64, events: u64) -> Vec<Arrival> {
        let tenants = Tenant::reference();
        let shapes: Vec<Shape> = tenants.iter().map(Shape::of).collect();
        let rates: Vec<u64> = tenants
            .iter()
            .map(|t| u64::from(t.requests_per_second))
            .collect();
        let mut a = Arrivals::new(&shapes, &rates, from_ms, to_ms, events);
        let mut rng = StdRng::seed_from_u64(1);
        std::iter::from_fn(|| a.next(&mut rng)).collect()
    }

    #[test]
    fn exactly_n_in_range_and_in_order() {
        let from = 1_793_000_000_123; // not slot-aligned
        for (span, n) in [(1, 5), (7, 1_000), (3_600_000, 10_000), (86_400_000, 3)] {
            let got = schedule(from, from + span, n);
            assert_eq!(got.len() as u64, n, "span {span}");
            assert!(got.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
            assert!(got.iter().all(|a| (from..from + span).contains(&a.at_ms)));
        }
    }

    #[test]
    fn tenants_get_their_rate_share_exactly() {
        let got = schedule(1_793_000_000_000, 1_793_000_000_000 + 86_400_000, 39_000);
        let mut per = [0u64; 5];
        for a in &got {
            per[a.tenant] += 1;
        }
        assert_eq!(per, [20_000, 5_000, 3_000, 1_000, 10_000]);
    }
}
