//! How much of its request rate each priority keeps, from two signals:
//!
//! - **Saturation** (every replica past the standard class threshold with
//!   queues growing): the pool degrades in strict order — priority 1
//!   refused, 2 at 25% of its rate, 3 at 50%, 4 and 5 at full rate.
//! - **SLO pressure** (a tenant's p95 at 80% of its objective or more):
//!   capacity is borrowed for it by lowering the effective rate of lower
//!   priorities *in order* — first priority 1, then also 2, then also 3,
//!   one more step each time the pressure is seen again — never priority 4
//!   for a priority-5 tenant, never the tenant's own level or above. A
//!   borrowed-from level runs at [`BORROWED_PERCENT`] of its rate. Steps
//!   are given back one at a time once the pressure is below
//!   [`RELEASE_PERMILLE`] (hysteresis, so it does not flap). If borrowing
//!   is not enough, preemption acts ([`crate::preempt`]).
//!
//! Rates are in percent of the configured rate, integers.

/// SLO pressure at or above this (p95 / objective, per mille) borrows.
pub const BORROW_PERMILLE: u32 = 800;
/// SLO pressure below this gives a step back.
pub const RELEASE_PERMILLE: u32 = 600;
/// A level capacity is borrowed from keeps this share of its rate.
pub const BORROWED_PERCENT: u32 = 50;
/// The degradation ladder when the pool is saturated, priorities 1 to 5.
pub const SATURATED_PERCENT: [u32; 5] = [0, 25, 50, 100, 100];

/// The borrowing done for one pressured tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Borrowing {
    /// The pressured tenant's priority.
    priority: i16,
    /// How many levels (from priority 1 up) are lent from: 0 to 3.
    steps: u8,
}

impl Borrowing {
    pub fn new(priority: i16) -> Self {
        Self { priority, steps: 0 }
    }

    /// The most steps this tenant may borrow: levels 1–3 below its own
    /// (a priority-5 tenant never borrows from priority 4).
    fn max_steps(&self) -> u8 {
        (self.priority - 1).clamp(0, 3) as u8
    }

    /// One look at the tenant's pressure (p95 / objective, per mille).
    pub fn update(&mut self, pressure_permille: u32) {
        if pressure_permille >= BORROW_PERMILLE {
            self.steps = (self.steps + 1).min(self.max_steps());
        } else if pressure_permille < RELEASE_PERMILLE {
            self.steps = self.steps.saturating_sub(1);
        }
    }

    pub fn steps(&self) -> u8 {
        self.steps
    }
}

/// Each priority's share of its rate, in percent (priorities 1 to 5), from
/// whether the pool is saturated and what the pressured tenants borrow.
pub fn rate_percent(saturated: bool, borrowing: &[Borrowing]) -> [u32; 5] {
    let mut out = if saturated {
        SATURATED_PERCENT
    } else {
        [100; 5]
    };
    for b in borrowing {
        for share in out.iter_mut().take(usize::from(b.steps)) {
            *share = (*share).min(BORROWED_PERCENT);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn borrowing_climbs_in_order_and_comes_back_with_hysteresis() {
        let mut acme = Borrowing::new(5);
        acme.update(799);
        assert_eq!(acme.steps(), 0, "below 80%: nothing");
        acme.update(800);
        assert_eq!(rate_percent(false, &[acme]), [50, 100, 100, 100, 100]);
        acme.update(900);
        acme.update(950);
        assert_eq!(rate_percent(false, &[acme]), [50, 50, 50, 100, 100]);
        acme.update(990);
        assert_eq!(acme.steps(), 3, "never priority 4 for a priority-5 tenant");
        acme.update(700);
        assert_eq!(acme.steps(), 3, "between 60% and 80%: held");
        acme.update(599);
        assert_eq!(acme.steps(), 2, "one step back at a time");
        for _ in 0..5 {
            acme.update(100);
        }
        assert_eq!(rate_percent(false, &[acme]), [100; 5]);
        // A priority-3 tenant borrows from 1 and 2 only.
        let mut finserv = Borrowing::new(3);
        for _ in 0..5 {
            finserv.update(1_000);
        }
        assert_eq!(rate_percent(false, &[finserv]), [50, 50, 100, 100, 100]);
        let mut research = Borrowing::new(1);
        research.update(1_000);
        assert_eq!(research.steps(), 0, "the lowest level borrows from nobody");
    }

    #[test]
    fn a_saturated_pool_degrades_in_strict_order() {
        assert_eq!(rate_percent(true, &[]), [0, 25, 50, 100, 100]);
        let mut acme = Borrowing::new(5);
        for _ in 0..3 {
            acme.update(1_000);
        }
        // Borrowing never raises what saturation took.
        assert_eq!(rate_percent(true, &[acme]), [0, 25, 50, 100, 100]);
        assert_eq!(rate_percent(false, &[]), [100; 5]);
    }
}
