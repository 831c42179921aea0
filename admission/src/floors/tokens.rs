//! Reserved floors on a model's pool of HTTP replicas (several
//! `upstreams` entries of one model): the floors of [`fleet::floors`],
//! counted in KV *tokens*.
//!
//! A replica's KV capacity in tokens is read from its `/metrics` with its
//! KV usage: vLLM's `vllm:cache_config_info` info metric carries
//! `num_gpu_blocks` and `block_size` as labels (the `engine` binary exports
//! it too); an entry's `kv_tokens` sets it for a server that does not.
//! What a replica has in use is its last KV reading × its capacity, plus
//! the tokens this gateway sent it since that reading (so a burst between
//! two polls counts at once); a replica without a fresh reading counts
//! what this gateway has in flight there. A request's KV is its prompt
//! plus its output cap (the same estimate the gateway's queue costs it at).
//!
//! A pool with floors but a replica of unknown capacity cannot hold them:
//! the gateway says so once per model in its log
//! (`reserved floors are not held on …`) and places requests by the
//! replicas' own class thresholds alone until the capacity is known.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use fleet::floors::{Floors, HeldForFloors, PoolKv};

use crate::occupancy::Occupancy;

/// The floors of every HTTP-served model, each pool on its own.
#[derive(Debug, Default)]
pub struct HttpFloors {
    pools: HashMap<String, Arc<PoolFloors>>,
}

/// One model's floors and its tenants' KV tokens in flight (this gateway's).
#[derive(Debug, Default)]
pub struct PoolFloors {
    floors: Mutex<Floors>,
    /// Set once the log has said this pool cannot hold its floors.
    warned: AtomicBool,
}

impl HttpFloors {
    pub fn new(models: impl IntoIterator<Item = String>) -> Self {
        Self {
            pools: models
                .into_iter()
                .map(|m| (m, Arc::new(PoolFloors::default())))
                .collect(),
        }
    }

    /// The tenants' floors (basis points), on every pool.
    pub fn set(&self, floors: &HashMap<String, u32>) {
        for pool in self.pools.values() {
            pool.lock().set(floors.clone());
        }
    }

    pub fn pool(&self, model: &str) -> Option<&Arc<PoolFloors>> {
        self.pools.get(model)
    }
}

impl PoolFloors {
    fn lock(&self) -> std::sync::MutexGuard<'_, Floors> {
        self.floors.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// KV tokens `tenant` has in flight on this pool from this gateway.
    pub fn in_flight(&self, tenant: &str) -> u64 {
        self.lock().in_flight(tenant)
    }

    /// Whether `tenant`'s request of `kv` tokens (class threshold
    /// `threshold_percent`) may be placed on the pool's `replicas` (those
    /// in it, by name with their KV reading); when it may, its
    /// tokens count in flight until the returned share is dropped (or
    /// [`FloorShare::placed`] moves them onto the replica it started on).
    /// Refused, the caller answers 503 `no_capacity` or queues it.
    pub fn admit(
        self: &Arc<Self>,
        replicas: &[(&str, &Occupancy)],
        tenant: &str,
        kv: u64,
        threshold_percent: u64,
    ) -> Result<FloorShare, HeldForFloors> {
        let mut floors = self.lock();
        if !floors.is_empty() {
            match pool_kv(replicas) {
                Ok(pool) => floors.admit(tenant, kv, threshold_percent, pool)?,
                Err(replica) => {
                    if !self.warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            replica,
                            "reserved floors are not held on this model pool: the replica's KV \
                             capacity is unknown (its /metrics has no vllm:cache_config_info; \
                             set kv_tokens on its upstreams entry)"
                        );
                    }
                }
            }
        }
        floors.started(tenant, kv);
        Ok(FloorShare {
            pool: self.clone(),
            tenant: tenant.to_owned(),
            kv,
            on: None,
        })
    }
}

/// The pool's KV in tokens: its replicas' capacity and what they have in
/// use; `Err` names a replica whose capacity is unknown.
fn pool_kv<'a>(replicas: &[(&'a str, &Occupancy)]) -> Result<PoolKv, &'a str> {
    let mut pool = PoolKv {
        capacity: 0,
        used: 0,
    };
    for &(name, occupancy) in replicas {
        let capacity = occupancy.kv_tokens().ok_or(name)?;
        pool.capacity += u128::from(capacity);
        pool.used += occupancy.used_tokens(capacity);
    }
    Ok(pool)
}

/// A request's tokens in its tenant's count (and, once placed, in its
/// replica's), until it ends: dropping it takes them out.
#[derive(Debug)]
pub struct FloorShare {
    pool: Arc<PoolFloors>,
    tenant: String,
    kv: u64,
    on: Option<Arc<Occupancy>>,
}

impl FloorShare {
    /// It started on the replica whose KV reading is `occupancy`.
    pub fn placed(&mut self, occupancy: &Arc<Occupancy>) {
        occupancy.sent(self.kv);
        self.on = Some(occupancy.clone());
    }
}

impl Drop for FloorShare {
    fn drop(&mut self) {
        self.pool.lock().ended(&self.tenant, self.kv);
        if let Some(o) = &self.on {
            o.ended(self.kv);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    #[test]
    fn a_pool_holds_its_floors_in_tokens_and_a_request_counts_until_it_ends() {
        let floors = HttpFloors::new(["m".to_owned()]);
        floors.set(&HashMap::from([("acme".to_owned(), 3_000)]));
        let pool = floors.pool("m").unwrap();
        let (a, b) = (
            Arc::new(Occupancy::default()),
            Arc::new(Occupancy::default()),
        );
        a.set_kv_tokens(1_000);
        b.set_kv_tokens(1_000);
        a.set(0);
        b.set(0);
        let replicas = [("a", &*a), ("b", &*b)];
        // 60% of 2,000 for best effort, 600 of it held: 600 tokens left.
        let mut placed = Vec::new();
        for _ in 0..3 {
            let mut share = pool.admit(&replicas, "batch", 200, 60).unwrap();
            share.placed(&a);
            placed.push(share);
        }
        assert_eq!(
            pool.admit(&replicas, "batch", 200, 60).unwrap_err(),
            HeldForFloors { held_percent: 30 }
        );
        // The owner, within its floor, is placed.
        let owner = pool.admit(&replicas, "acme", 600, 92).unwrap();
        assert_eq!(pool.in_flight("acme"), 600);
        drop(owner);
        assert_eq!(pool.in_flight("acme"), 0);
        // One best-effort request ends and a.'s next reading shows it gone.
        drop(placed.pop());
        assert_eq!(pool.in_flight("batch"), 400);
        a.set(2_000);
        assert!(pool.admit(&replicas, "batch", 200, 60).is_ok());
    }

    #[test]
    fn a_pool_with_a_replica_of_unknown_capacity_places_by_the_replicas_alone() {
        let floors = HttpFloors::new(["m".to_owned()]);
        floors.set(&HashMap::from([("acme".to_owned(), 5_000)]));
        let pool = floors.pool("m").unwrap();
        let (a, b) = (Occupancy::default(), Occupancy::default());
        a.set_kv_tokens(1_000);
        let replicas = [("a", &a), ("b", &b)];
        assert!(!pool.warned.load(Ordering::Relaxed));
        assert!(pool.admit(&replicas, "batch", 900, 60).is_ok());
        assert!(pool.warned.load(Ordering::Relaxed), "the log says so, once");
        b.set_kv_tokens(1_000);
        assert!(pool.admit(&replicas, "batch", 900, 60).is_err());
    }
}
