//! The replicas serving one model, and where the next request goes:
//! power-of-two-choices on KV headroom.
//!
//! Each replica's headroom is its KV capacity less what it last reported
//! in use *and* what this router sent it since that report (its own
//! in-flight accounting), so a stale reading cannot herd a burst onto the
//! replica that looked emptiest: every request routed there counts at
//! once. Two eligible replicas are drawn at random and the request goes
//! to the one with more headroom.
//!
//! Eligible means: alive; below its class's admission threshold
//! (60/85/92% of KV for best-effort, standard, reserved), the replica's own
//! rule; and, for a replica dedicated to a tenant, either that
//! tenant's request or a lender's whose owner has nothing running there
//! and nothing waiting for room ([`Pool::owner_waits`]: a request of the
//! owner waiting in the gateway's queue keeps its replicas from being lent
//! again, so the room a preemption frees for the owner goes to the owner;
//! lent work is preempted first when the owner's request waits, see
//! [`crate::preempt`]). A replica that dies leaves the
//! pool: [`Pool::remove`] returns it, and the caller fails its requests in
//! flight with an error (never a silent regeneration).
//!
//! **Reserved floors** ([`crate::floors`]): the router counts every
//! tenant's KV in flight and keeps the unused part of each tenant's floor
//! free of other tenants' work.

use std::collections::HashMap;

use rand::Rng;

/// One replica as the router sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    pub id: String,
    /// KV cache bytes it can hold.
    pub kv_capacity: u64,
    /// KV bytes in use at its last report.
    pub observed: u64,
    /// KV bytes this router sent it since that report.
    pub routed_since: u64,
    /// The tenant it is dedicated to, if any.
    pub owner: Option<String>,
    /// The owner's requests running on it.
    pub owner_running: u32,
    /// The owner's requests waiting for room (in the gateway's queue).
    pub owner_waiting: u32,
}

impl Replica {
    pub fn new(id: impl Into<String>, kv_capacity: u64) -> Self {
        Self {
            id: id.into(),
            kv_capacity,
            observed: 0,
            routed_since: 0,
            owner: None,
            owner_running: 0,
            owner_waiting: 0,
        }
    }

    /// Dedicated to `tenant`.
    pub fn owned_by(mut self, tenant: impl Into<String>) -> Self {
        self.owner = Some(tenant.into());
        self
    }

    /// KV bytes free by this router's reckoning.
    pub fn headroom(&self) -> u64 {
        self.kv_capacity
            .saturating_sub(self.observed.saturating_add(self.routed_since))
    }

    /// Whether it admits a request of a class with `threshold_percent`:
    /// its occupancy by this router's reckoning is below the threshold.
    /// As a replica's own admission (vLLM's, the simulator's) the request's
    /// own KV is not part of the test — it is counted once routed — so a
    /// large request is not refused by the router where the replica would
    /// take it.
    fn admits(&self, threshold_percent: u64) -> bool {
        let used = u128::from(self.observed) + u128::from(self.routed_since);
        used * 100 < u128::from(self.kv_capacity) * u128::from(threshold_percent)
    }
}

/// A request to place.
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    pub tenant: &'a str,
    /// KV bytes it will hold (prompt + max output × bytes per token).
    pub kv: u64,
    /// Its class's admission threshold, percent of KV.
    pub threshold_percent: u64,
}

/// Why a request was not placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No eligible replica is below the request's class threshold.
    Full,
    /// The pool has room, but only inside other tenants' unused reserved
    /// floors: `held_percent` of its KV is held for them.
    HeldForFloors { held_percent: u64 },
}

pub use crate::floors::{share_bp, WHOLE_BP};
use crate::floors::{Floors, HeldForFloors, PoolKv};

/// The replicas of one model.
#[derive(Debug, Clone, Default)]
pub struct Pool {
    replicas: Vec<Replica>,
    /// Reserved floors and each tenant's KV bytes in flight.
    floors: Floors,
}

impl Pool {
    pub fn new(replicas: Vec<Replica>) -> Self {
        Self {
            replicas,
            ..Self::default()
        }
    }

    /// The tenants' reserved floors (basis points of the pool's KV; a
    /// tenant not listed has none). Replaces the previous set.
    pub fn set_floors(&mut self, floors: HashMap<String, u32>) {
        self.floors.set(floors);
    }

    /// KV bytes `tenant` has in flight by this router's count.
    pub fn in_flight(&self, tenant: &str) -> u64 {
        self.floors.in_flight(tenant)
    }

    /// Whether the floors let `p` in ([`Floors::admit`]).
    fn floors_admit(&self, p: &Placement<'_>) -> Result<(), Refused> {
        if self.floors.is_empty() {
            return Ok(());
        }
        let pool = PoolKv {
            capacity: self
                .replicas
                .iter()
                .map(|r| u128::from(r.kv_capacity))
                .sum(),
            used: self
                .replicas
                .iter()
                .map(|r| u128::from(r.observed) + u128::from(r.routed_since))
                .sum(),
        };
        self.floors
            .admit(p.tenant, p.kv, p.threshold_percent, pool)
            .map_err(|HeldForFloors { held_percent }| Refused::HeldForFloors { held_percent })
    }

    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    fn eligible(&self, i: usize, p: &Placement<'_>) -> bool {
        let r = &self.replicas[i];
        let own = r.owner.as_deref().is_none_or(|o| o == p.tenant);
        let lendable = r.owner_waiting == 0 && r.owner_running == 0;
        (own || lendable) && r.admits(p.threshold_percent)
    }

    /// The replica for `p` (its index), counted as routed there and in its
    /// tenant's KV in flight; refused when no replica can admit it for its
    /// class or only other tenants' floors have room (the caller queues it
    /// or answers 503).
    pub fn route(&mut self, p: &Placement<'_>, rng: &mut impl Rng) -> Result<usize, Refused> {
        self.floors_admit(p)?;
        // The owner's own replicas first: a dedicated tenant uses what it
        // pays for before the shared ones.
        let owned: Vec<usize> = (0..self.replicas.len())
            .filter(|&i| self.replicas[i].owner.as_deref() == Some(p.tenant))
            .filter(|&i| self.eligible(i, p))
            .collect();
        let candidates = if owned.is_empty() {
            (0..self.replicas.len())
                .filter(|&i| self.eligible(i, p))
                .collect()
        } else {
            owned
        };
        let pick = match candidates.len() {
            0 => return Err(Refused::Full),
            1 => candidates[0],
            n => {
                let a = candidates[rng.random_range(0..n)];
                let mut b = candidates[rng.random_range(0..n - 1)];
                if b == a {
                    b = candidates[n - 1];
                }
                if self.replicas[b].headroom() > self.replicas[a].headroom() {
                    b
                } else {
                    a
                }
            }
        };
        let r = &mut self.replicas[pick];
        r.routed_since = r.routed_since.saturating_add(p.kv);
        if r.owner.as_deref() == Some(p.tenant) {
            r.owner_running += 1;
        }
        self.floors.started(p.tenant, p.kv);
        Ok(pick)
    }

    /// A fresh report of replica `i`'s KV in use: it now includes what was
    /// routed there before it.
    pub fn observe(&mut self, i: usize, used: u64) {
        if let Some(r) = self.replicas.get_mut(i) {
            r.observed = used;
            r.routed_since = 0;
        }
    }

    /// A request of `tenant` holding `kv` bytes ended on replica `id` (or
    /// was refused there, or the replica died and left the pool).
    pub fn finished(&mut self, id: &str, tenant: &str, kv: u64) {
        if let Some(r) = self.replicas.iter_mut().find(|r| r.id == id) {
            if r.owner.as_deref() == Some(tenant) {
                r.owner_running = r.owner_running.saturating_sub(1);
            }
        }
        self.floors.ended(tenant, kv);
    }

    /// A request of `owner` waits for room: none of its dedicated replicas
    /// is lent until [`Pool::owner_stops_waiting`].
    pub fn owner_waits(&mut self, owner: &str) {
        for r in self
            .replicas
            .iter_mut()
            .filter(|r| r.owner.as_deref() == Some(owner))
        {
            r.owner_waiting = r.owner_waiting.saturating_add(1);
        }
    }

    /// A request of `owner` that waited was placed or gave up.
    pub fn owner_stops_waiting(&mut self, owner: &str) {
        for r in self
            .replicas
            .iter_mut()
            .filter(|r| r.owner.as_deref() == Some(owner))
        {
            r.owner_waiting = r.owner_waiting.saturating_sub(1);
        }
    }

    /// Replica `id` died: it leaves the pool (its requests in flight are
    /// the caller's to fail).
    pub fn remove(&mut self, id: &str) -> Option<Replica> {
        let i = self.replicas.iter().position(|r| r.id == id)?;
        Some(self.replicas.remove(i))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    const GIB: u64 = 1 << 30;

    fn placement(tenant: &str, kv: u64) -> Placement<'_> {
        Placement {
            tenant,
            kv,
            threshold_percent: 92,
        }
    }

    #[test]
    fn a_burst_on_stale_readings_spreads_within_a_few_requests_of_the_mean() {
        let mut pool = Pool::new(
            (0..12)
                .map(|i| Replica::new(format!("r{i}"), 172 * GIB))
                .collect(),
        );
        let mut rng = StdRng::seed_from_u64(7);
        // 1,200 requests of 100 MiB, no report arrives meanwhile (every
        // reading is stale): the router's own accounting spreads them.
        let mut counts = [0u32; 12];
        for _ in 0..1_200 {
            let i = pool.route(&placement("t", 100 << 20), &mut rng).unwrap();
            counts[i] += 1;
        }
        let mean = 100;
        let (min, max) = (*counts.iter().min().unwrap(), *counts.iter().max().unwrap());
        assert!(
            max <= mean + 3 && min + 3 >= mean,
            "in flight per replica {counts:?}, mean {mean}"
        );
        // One replica reported full since: nothing more goes there.
        pool.observe(0, 172 * GIB);
        for _ in 0..100 {
            assert_ne!(pool.route(&placement("t", 100 << 20), &mut rng), Ok(0));
        }
    }

    #[test]
    fn a_dedicated_replica_is_its_owners_and_lent_only_when_the_owner_is_idle() {
        let mut pool = Pool::new(vec![
            Replica::new("shared", 100 * GIB),
            Replica::new("acme-1", 100 * GIB).owned_by("acme"),
        ]);
        let mut rng = StdRng::seed_from_u64(1);
        // The owner goes to its own replica first.
        let i = pool.route(&placement("acme", GIB), &mut rng).unwrap();
        assert_eq!(pool.replicas()[i].id, "acme-1");
        // While acme runs there, nobody else starts there.
        for _ in 0..50 {
            let j = pool
                .route(&placement("codegen", 1 << 20), &mut rng)
                .unwrap();
            assert_eq!(pool.replicas()[j].id, "shared");
        }
        pool.finished("acme-1", "acme", GIB);
        // The shared replica fills up; the owner is idle: its replica is
        // lent. With the owner waiting, it is not.
        pool.observe(0, 90 * GIB);
        let mut lent = 0;
        for _ in 0..50 {
            let j = pool
                .route(&placement("codegen", 1 << 20), &mut rng)
                .unwrap();
            lent += u32::from(pool.replicas()[j].id == "acme-1");
        }
        assert!(lent > 0, "an idle owner's replica is lent");
        pool.owner_waits("acme");
        for _ in 0..50 {
            let j = pool
                .route(&placement("codegen", 1 << 20), &mut rng)
                .unwrap();
            assert_eq!(pool.replicas()[j].id, "shared");
        }
        // The owner itself still goes there; once it stops waiting, the
        // replica is lent again.
        let i = pool.route(&placement("acme", GIB), &mut rng).unwrap();
        assert_eq!(pool.replicas()[i].id, "acme-1");
        pool.finished("acme-1", "acme", GIB);
        pool.owner_stops_waiting("acme");
        let lent_again = (0..50).any(|_| {
            let j = pool
                .route(&placement("codegen", 1 << 20), &mut rng)
                .unwrap();
            pool.replicas()[j].id == "acme-1"
        });
        assert!(lent_again);
    }

    #[test]
    fn class_thresholds_and_a_dead_replica() {
        let mut pool = Pool::new(vec![Replica::new("a", 100), Replica::new("b", 100)]);
        let mut rng = StdRng::seed_from_u64(3);
        pool.observe(0, 70);
        pool.observe(1, 90);
        let best_effort = Placement {
            threshold_percent: 60,
            ..placement("t", 1)
        };
        assert_eq!(
            pool.route(&best_effort, &mut rng),
            Err(Refused::Full),
            "both above 60%"
        );
        let reserved = Placement {
            threshold_percent: 92,
            ..placement("t", 2)
        };
        assert!(pool.route(&reserved, &mut rng).is_ok());
        assert_eq!(pool.remove("a").unwrap().id, "a");
        assert_eq!(pool.replicas().len(), 1);
        // Only b is left: below 92% it admits a reserved request, however
        // large (the replica's own rule), and counts it at once; at 92% the
        // request is told the truth (None: 503).
        pool.observe(0, 91);
        assert_eq!(pool.route(&placement("t", 5), &mut rng), Ok(0));
        assert_eq!(
            pool.route(&placement("t", 1), &mut rng),
            Err(Refused::Full),
            "91 + 5 routed"
        );
        pool.observe(0, 92);
        assert_eq!(pool.route(&placement("t", 1), &mut rng), Err(Refused::Full));
    }

    fn floors(pairs: &[(&str, u32)]) -> HashMap<String, u32> {
        pairs.iter().map(|(t, bp)| ((*t).to_owned(), *bp)).collect()
    }

    #[test]
    fn an_unused_floor_is_kept_free_and_its_owner_gets_in_first() {
        // Two replicas of 100 GiB; acme is promised 30% of the pool (60 GiB).
        let mut pool = Pool::new(vec![
            Replica::new("a", 100 * GIB),
            Replica::new("b", 100 * GIB),
        ]);
        pool.set_floors(floors(&[("acme", 3_000)]));
        let mut rng = StdRng::seed_from_u64(5);
        let standard = |tenant, kv| Placement {
            threshold_percent: 85,
            ..placement(tenant, kv)
        };
        // codegen fills what is not held: 85% of 200 GiB is 170 GiB, less
        // acme's unused 60 GiB leaves 110 GiB.
        let mut codegen = 0u64;
        while pool.route(&standard("codegen", GIB), &mut rng).is_ok() {
            codegen += 1;
            assert!(codegen <= 200, "never refused");
        }
        assert_eq!(codegen, 110);
        assert_eq!(
            pool.route(&standard("codegen", GIB), &mut rng),
            Err(Refused::HeldForFloors { held_percent: 30 })
        );
        // acme, within its floor, is placed although codegen is refused.
        for _ in 0..30 {
            pool.route(&placement("acme", 2 * GIB), &mut rng).unwrap();
        }
        assert_eq!(pool.in_flight("acme"), 60 * GIB);
        // Its floor is used up: above it, acme competes like anyone (the
        // pool is at 170 of 200 GiB, below 92% for a reserved request).
        assert!(pool.route(&placement("acme", GIB), &mut rng).is_ok());
        // One codegen request ends: there is room again for codegen only
        // because acme now uses its whole floor (nothing more is held).
        let i = (0..2)
            .find(|&i| pool.replicas()[i].routed_since > 0)
            .unwrap();
        let id = pool.replicas()[i].id.clone();
        pool.finished(&id, "codegen", GIB);
        pool.replicas[i].routed_since -= GIB;
        assert!(pool.route(&standard("codegen", GIB), &mut rng).is_ok());
    }

    #[test]
    fn a_floor_never_admits_into_a_replica_past_92_percent() {
        let mut pool = Pool::new(vec![Replica::new("a", 100), Replica::new("b", 100)]);
        pool.set_floors(floors(&[("acme", 5_000)]));
        let mut rng = StdRng::seed_from_u64(9);
        // a is past 92%: acme's requests, within its floor, go to b.
        pool.observe(0, 93);
        for _ in 0..10 {
            assert_eq!(pool.route(&placement("acme", 1), &mut rng), Ok(1));
        }
        // b too: the whole pool is there, acme is told so (refused, 503).
        pool.observe(1, 92);
        assert_eq!(
            pool.route(&placement("acme", 1), &mut rng),
            Err(Refused::Full)
        );
        // Floors change with the tenant config; none left, nothing held.
        pool.set_floors(HashMap::new());
        pool.observe(0, 10);
        pool.observe(1, 10);
        assert!(pool.route(&placement("codegen", 50), &mut rng).is_ok());
    }
}
