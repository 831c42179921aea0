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
//! tenant's request or a lender's whose owner has nothing queued or
//! running there (lent work is preempted first when the owner's arrives —
//! the preemption itself is not built yet). A replica that dies leaves the
//! pool: [`Pool::remove`] returns it, and the caller fails its requests in
//! flight with an error (never a silent regeneration).

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
    /// Whether the owner of a dedicated replica has work queued (a lender
    /// may not start there then).
    pub owner_waiting: bool,
}

/// The replicas of one model.
#[derive(Debug, Clone, Default)]
pub struct Pool {
    replicas: Vec<Replica>,
}

impl Pool {
    pub fn new(replicas: Vec<Replica>) -> Self {
        Self { replicas }
    }

    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    fn eligible(&self, i: usize, p: &Placement<'_>) -> bool {
        let r = &self.replicas[i];
        let own = r.owner.as_deref().is_none_or(|o| o == p.tenant);
        let lendable = !p.owner_waiting && r.owner_running == 0;
        (own || lendable) && r.admits(p.threshold_percent)
    }

    /// The replica for `p` (its index), counted as routed there; `None`
    /// when no replica can admit it for its class (the caller queues it or
    /// answers 503).
    pub fn route(&mut self, p: &Placement<'_>, rng: &mut impl Rng) -> Option<usize> {
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
            0 => return None,
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
        Some(pick)
    }

    /// A fresh report of replica `i`'s KV in use: it now includes what was
    /// routed there before it.
    pub fn observe(&mut self, i: usize, used: u64) {
        if let Some(r) = self.replicas.get_mut(i) {
            r.observed = used;
            r.routed_since = 0;
        }
    }

    /// A request of `tenant` ended on replica `i`.
    pub fn finished(&mut self, i: usize, tenant: &str) {
        if let Some(r) = self.replicas.get_mut(i) {
            if r.owner.as_deref() == Some(tenant) {
                r.owner_running = r.owner_running.saturating_sub(1);
            }
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
            owner_waiting: false,
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
            assert_ne!(pool.route(&placement("t", 100 << 20), &mut rng), Some(0));
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
        pool.finished(i, "acme");
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
        let waiting = Placement {
            owner_waiting: true,
            ..placement("codegen", 1 << 20)
        };
        for _ in 0..50 {
            let j = pool.route(&waiting, &mut rng).unwrap();
            assert_eq!(pool.replicas()[j].id, "shared");
        }
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
        assert_eq!(pool.route(&best_effort, &mut rng), None, "both above 60%");
        let reserved = Placement {
            threshold_percent: 92,
            ..placement("t", 2)
        };
        assert!(pool.route(&reserved, &mut rng).is_some());
        assert_eq!(pool.remove("a").unwrap().id, "a");
        assert_eq!(pool.replicas().len(), 1);
        // Only b is left: below 92% it admits a reserved request, however
        // large (the replica's own rule), and counts it at once; at 92% the
        // request is told the truth (None: 503).
        pool.observe(0, 91);
        assert_eq!(pool.route(&placement("t", 5), &mut rng), Some(0));
        assert_eq!(
            pool.route(&placement("t", 1), &mut rng),
            None,
            "91 + 5 routed"
        );
        pool.observe(0, 92);
        assert_eq!(pool.route(&placement("t", 1), &mut rng), None);
    }
}
