//! The floors as applied: what the tenant config promised, scaled down in
//! proportion when together they exceed `GATEWAY_FLOOR_LIMIT`, set on every
//! model pool when they change, and shown on `/metrics`.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use engine::simulator::Simulator;
use std::sync::Arc;

use super::tokens::HttpFloors;
use fleet::floors::WHOLE_BP;
use metrics::gauge;

/// The floors as applied, `promised` scaled down to `limit_bp` together
/// when they add up to more (each rounded down, so the sum stays within).
pub fn scaled(promised: &HashMap<String, u32>, limit_bp: u32) -> HashMap<String, u32> {
    let sum: u64 = promised.values().map(|&bp| u64::from(bp)).sum();
    if sum <= u64::from(limit_bp) {
        return promised.clone();
    }
    promised
        .iter()
        .map(|(t, &bp)| {
            let share = u64::from(bp) * u64::from(limit_bp) / sum;
            (t.clone(), u32::try_from(share).unwrap_or(0))
        })
        .filter(|(_, bp)| *bp > 0)
        .collect()
}

/// Sets the tenants' reserved floors on every model pool, simulated and
/// HTTP; kept by the gateway's tenant refresh
/// ([`crate::upstream::Upstreams::floors_setter`]).
#[derive(Debug, Clone)]
pub struct FloorsSetter {
    simulator: Arc<Simulator>,
    http: Arc<HttpFloors>,
}

impl FloorsSetter {
    pub fn new(simulator: Arc<Simulator>, http: Arc<HttpFloors>) -> Self {
        Self { simulator, http }
    }

    pub fn set(&self, floors: &HashMap<String, u32>) {
        self.simulator.set_floors(floors);
        self.http.set(floors);
    }
}

/// Applies the registry's floors to the model pools when they change.
pub struct Floors {
    pools: FloorsSetter,
    limit_bp: u32,
    last: Mutex<Option<HashMap<String, u32>>>,
}

impl Floors {
    pub fn new(pools: FloorsSetter, limit_bp: u32) -> Self {
        gauge!("gateway_reserved_floors_ratio", "of" => "limit")
            .set(f64::from(limit_bp) / f64::from(WHOLE_BP));
        Self {
            pools,
            limit_bp,
            last: Mutex::new(None),
        }
    }

    /// Applies `promised` (basis points by tenant), if it changed.
    pub fn apply(&self, promised: HashMap<String, u32>) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.as_ref() == Some(&promised) {
            return;
        }
        let applied = scaled(&promised, self.limit_bp);
        let sum = |m: &HashMap<String, u32>| m.values().map(|&bp| u64::from(bp)).sum::<u64>();
        if applied != promised {
            tracing::warn!(
                promised_bp = sum(&promised),
                limit_bp = self.limit_bp,
                "the tenants' reserved floors add up to more than GATEWAY_FLOOR_LIMIT: each scaled down in proportion"
            );
        }
        for tenant in last.iter().flat_map(|m| m.keys()) {
            if !applied.contains_key(tenant) {
                gauge!("gateway_reserved_floor_ratio", "tenant" => tenant.clone()).set(0.0);
            }
        }
        for (tenant, &bp) in &applied {
            gauge!("gateway_reserved_floor_ratio", "tenant" => tenant.clone())
                .set(f64::from(bp) / f64::from(WHOLE_BP));
        }
        gauge!("gateway_reserved_floors_ratio", "of" => "promised")
            .set(sum(&promised) as f64 / f64::from(WHOLE_BP));
        gauge!("gateway_reserved_floors_ratio", "of" => "applied")
            .set(sum(&applied) as f64 / f64::from(WHOLE_BP));
        self.pools.set(&applied);
        tracing::info!(?applied, "reserved floors");
        *last = Some(promised);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, u32)]) -> HashMap<String, u32> {
        pairs.iter().map(|(t, bp)| ((*t).to_owned(), *bp)).collect()
    }

    #[test]
    fn floors_within_the_limit_are_kept_and_above_it_scaled_to_fit() {
        let reference = m(&[("acme-corp", 3_000), ("medai-labs", 1_500)]);
        assert_eq!(scaled(&reference, 5_000), reference);
        let over = m(&[("a", 6_000), ("b", 3_000), ("c", 1)]);
        let applied = scaled(&over, 4_500);
        assert_eq!(
            applied,
            m(&[("a", 2_999), ("b", 1_499)]),
            "each rounded down; c to 0"
        );
        assert!(applied.values().sum::<u32>() <= 4_500);
    }
}
