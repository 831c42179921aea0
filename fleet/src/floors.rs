//! Reserved floors: a share of a model pool's KV cache kept free for a
//! tenant until it uses it (`reservedFloor` in the tenant config).
//!
//! The arithmetic is the same whatever the pool counts in — KV bytes for a
//! simulated pool ([`crate::pool`]), KV tokens for a pool of HTTP replicas
//! (`admission::upstream`) — so it lives here once. The router counts every
//! tenant's KV in flight (what it placed and has not seen end). A request
//! within its tenant's floor is placed by the replica rule alone (for a
//! reserved-class tenant: below 92% on some replica, else refused — the
//! truth, never an overfull replica). Any other request must leave the
//! *unused* part of every other tenant's floor free: it is placed only
//! while the pool's KV in use, plus the request, plus what other floors
//! still hold, stays below its class threshold of the whole pool. So a
//! floor is honoured before others are admitted, and nobody is refused
//! for a floor its owner is using.

use std::collections::HashMap;

/// Basis points of a whole (10,000 = all of the pool).
pub const WHOLE_BP: u32 = 10_000;

/// A share of the pool written as a decimal (`"0.30"`, `"1"`), in basis
/// points: above 0, at most 1, four decimal places at most. Exact (no
/// floating point); the error says what is wrong with `text`.
pub fn share_bp(text: &str) -> Result<u32, String> {
    let bad = |why: &str| format!("{text:?} {why} (a share of the pool like \"0.30\")");
    let t = text.trim();
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    if !digits(whole) || !(frac.is_empty() || digits(frac)) {
        return Err(bad("is not a decimal"));
    }
    if frac.len() > 4 {
        return Err(bad("has more than four decimal places"));
    }
    let whole: u32 = whole.parse().map_err(|_| bad("is out of range"))?;
    let frac: u32 = format!("{frac:0<4}")
        .parse()
        .map_err(|_| bad("is not a decimal"))?;
    let bp = whole
        .checked_mul(WHOLE_BP)
        .and_then(|w| w.checked_add(frac))
        .ok_or_else(|| bad("is out of range"))?;
    if bp == 0 || bp > WHOLE_BP {
        return Err(bad("must be above 0 and at most 1"));
    }
    Ok(bp)
}

/// The pool has room, but only inside other tenants' unused floors:
/// `held_percent` of its KV is held for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldForFloors {
    pub held_percent: u64,
}

/// The pool as the floors see it, in one unit (bytes or tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolKv {
    /// What the pool's replicas hold together.
    pub capacity: u128,
    /// What is in use: the replicas' last readings plus what the router
    /// sent them since.
    pub used: u128,
}

/// The floors of one pool and each tenant's KV in flight there.
#[derive(Debug, Clone, Default)]
pub struct Floors {
    /// Basis points of the pool's KV, by tenant.
    bp: HashMap<String, u32>,
    /// KV each tenant has in flight by this router's count.
    in_flight: HashMap<String, u64>,
}

impl Floors {
    /// The tenants' floors (basis points; a tenant not listed has none).
    /// Replaces the previous set; what is in flight stays counted.
    pub fn set(&mut self, floors: HashMap<String, u32>) {
        self.bp = floors;
        self.bp.retain(|_, bp| *bp > 0);
    }

    pub fn is_empty(&self) -> bool {
        self.bp.is_empty()
    }

    /// KV `tenant` has in flight by this router's count.
    pub fn in_flight(&self, tenant: &str) -> u64 {
        self.in_flight.get(tenant).copied().unwrap_or(0)
    }

    /// A request of `tenant` holding `kv` was placed.
    pub fn started(&mut self, tenant: &str, kv: u64) {
        match self.in_flight.get_mut(tenant) {
            Some(n) => *n = n.saturating_add(kv),
            None => {
                self.in_flight.insert(tenant.to_owned(), kv);
            }
        }
    }

    /// A request of `tenant` holding `kv` ended (or was refused, or its
    /// replica died).
    pub fn ended(&mut self, tenant: &str, kv: u64) {
        if let Some(n) = self.in_flight.get_mut(tenant) {
            *n = n.saturating_sub(kv);
            if *n == 0 {
                self.in_flight.remove(tenant);
            }
        }
    }

    fn floor(capacity: u128, bp: u32) -> u128 {
        capacity * u128::from(bp) / u128::from(WHOLE_BP)
    }

    /// What is held for tenants other than `tenant`: the part of each
    /// one's floor it is not using.
    fn held_for_others(&self, tenant: &str, capacity: u128) -> u128 {
        self.bp
            .iter()
            .filter(|(t, _)| t.as_str() != tenant)
            .map(|(t, &bp)| Self::floor(capacity, bp).saturating_sub(u128::from(self.in_flight(t))))
            .sum()
    }

    /// Whether the floors let a request of `tenant` holding `kv` (its
    /// class's threshold `threshold_percent`) into `pool`: within its own
    /// floor, or leaving every other floor's unused part free.
    pub fn admit(
        &self,
        tenant: &str,
        kv: u64,
        threshold_percent: u64,
        pool: PoolKv,
    ) -> Result<(), HeldForFloors> {
        if self.bp.is_empty() {
            return Ok(());
        }
        let mine = u128::from(self.in_flight(tenant)) + u128::from(kv);
        let own = self.bp.get(tenant).copied().unwrap_or(0);
        if own > 0 && mine <= Self::floor(pool.capacity, own) {
            return Ok(());
        }
        let held = self.held_for_others(tenant, pool.capacity);
        if held == 0
            || (pool.used + u128::from(kv) + held) * 100
                <= pool.capacity * u128::from(threshold_percent)
        {
            return Ok(());
        }
        let held_percent = (held * 100).checked_div(pool.capacity).unwrap_or(0);
        Err(HeldForFloors {
            held_percent: u64::try_from(held_percent).unwrap_or(100),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_of_the_pool_are_exact_basis_points() {
        assert_eq!(share_bp("0.30"), Ok(3_000));
        assert_eq!(share_bp("1"), Ok(10_000));
        assert_eq!(share_bp("0.0001"), Ok(1));
        assert_eq!(share_bp(" .5 ").ok(), None, "a whole part is required");
        for bad in ["0", "1.5", "-0.1", "0.00001", "thirty", "", "1e-1"] {
            assert!(share_bp(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_unused_floor_is_held_and_a_used_one_is_not() {
        let mut f = Floors::default();
        f.set(HashMap::from([
            ("acme".to_owned(), 3_000),
            ("gone".to_owned(), 0),
        ]));
        let pool = |used| PoolKv {
            capacity: 1_000,
            used,
        };
        // 85% of 1,000 less acme's unused 300 leaves 550 for the others.
        assert_eq!(f.admit("codegen", 50, 85, pool(500)), Ok(()));
        assert_eq!(
            f.admit("codegen", 51, 85, pool(500)),
            Err(HeldForFloors { held_percent: 30 })
        );
        // acme within its floor, whatever the pool's use.
        assert_eq!(f.admit("acme", 300, 92, pool(990)), Ok(()));
        // acme uses 200 of its 300: only 100 is held.
        f.started("acme", 200);
        assert_eq!(f.admit("codegen", 51, 85, pool(650)), Ok(()));
        assert_eq!(
            f.admit("codegen", 101, 85, pool(650)),
            Err(HeldForFloors { held_percent: 10 })
        );
        // Above its floor, acme competes like anyone (nothing else held).
        assert_eq!(f.admit("acme", 101, 92, pool(900)), Ok(()));
        f.ended("acme", 200);
        assert_eq!(f.in_flight("acme"), 0);
        f.set(HashMap::new());
        assert!(f.is_empty());
        assert_eq!(f.admit("codegen", 900, 85, pool(0)), Ok(()));
    }
}
