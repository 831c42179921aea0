//! What this gateway holds: leased units of shared resources
//! ([`Holding`]), its requests in flight for the lease records
//! ([`InFlight`]), and the limiter's whole state in either mode ([`State`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::bucket::Bucket;
use super::demand::*;
use super::kinds::*;
use super::shared;
use crate::cluster::{Cluster, Mode};

/// What this gateway holds of a shared resource: unspent leased tokens of
/// a rate, or the units of a capacity it leased (some of them in use).
#[derive(Debug, Clone, Copy)]
pub(super) struct Holding {
    pub(super) units: f64,
    pub(super) shape: Shape,
    pub(super) touched: Instant,
}

/// One admitted request, for the lease records in Redis.
#[derive(Debug, Clone)]
pub(super) struct InFlight {
    pub(super) tenant: String,
    pub(super) request_id: String,
    pub(super) kv_mib_seconds: u64,
    pub(super) started_unix_ms: i64,
}

#[derive(Default)]
pub(super) struct State {
    /// The mode the state below was built for.
    pub(super) mode: Option<Mode>,
    /// Local mode: this gateway's share of every rate.
    pub(super) buckets: HashMap<Resource, Bucket>,
    /// Shared mode: what is leased from Redis.
    pub(super) holdings: HashMap<Resource, Holding>,
    /// Capacity units used by this gateway's requests (both modes).
    pub(super) in_use: HashMap<Resource, u64>,
    /// The shape of each capacity in `in_use` (to hold it again in Redis
    /// after a mode change).
    pub(super) capacity_shapes: HashMap<Resource, Shape>,
    /// Shared mode: what each rate had left in Redis at its last lease.
    pub(super) left: HashMap<Resource, u64>,
    pub(super) in_flight: HashMap<u64, InFlight>,
    /// Requests in flight per tenant (the count of `in_flight`'s entries).
    pub(super) tenant_in_flight: HashMap<String, u32>,
    /// Lease calls of this gateway out at Redis right now.
    pub(super) leasing: u32,
    pub(super) next_id: u64,
    /// Redis lost what this gateway holds: register it at the next renewal.
    pub(super) register: bool,
}

impl State {
    /// Adapts the state to `mode`: entering shared mode, the capacity in
    /// use is what this gateway holds (registered at the next renewal) and
    /// the local buckets go; entering local mode, leases are forgotten.
    pub(super) fn sync(&mut self, mode: Mode, now: Instant) {
        if self.mode == Some(mode) {
            return;
        }
        self.mode = Some(mode);
        self.buckets.clear();
        self.holdings.clear();
        self.left.clear();
        if mode == Mode::Shared {
            for (res, used) in &self.in_use {
                if let Some(&shape) = self.capacity_shapes.get(res) {
                    self.holdings.insert(
                        res.clone(),
                        Holding {
                            units: *used as f64,
                            shape,
                            touched: now,
                        },
                    );
                }
            }
            self.register = true;
        }
    }

    pub(super) fn used(&self, res: &Resource) -> u64 {
        self.in_use.get(res).copied().unwrap_or(0)
    }

    /// Local mode: every demand against this gateway's share, then all
    /// charged. Rates are shared among the `peers` gateways last seen
    /// (failing open), concurrency and KV·seconds among `closed_peers`
    /// (failing closed: see [`crate::cluster::FailClosed`]).
    pub(super) fn admit_local(
        &mut self,
        demands: &[Demand],
        peers: u32,
        closed_peers: u32,
        now: Instant,
    ) -> Result<(), Rejected> {
        for d in demands {
            match d.shape {
                Shape::Rate(rate) => {
                    let rate = rate.share(peers);
                    let b = self
                        .buckets
                        .entry(d.res.clone())
                        .or_insert_with(|| Bucket::full(rate, now));
                    b.refill(rate, now);
                    let need = d.take.min(rate.capacity);
                    if b.level < need {
                        return Err(d.rejected(b.wait_for(need, rate)));
                    }
                }
                Shape::Capacity(cap) => {
                    // Never more than the share, so the gateways together
                    // never pass the cap (a request above the share waits
                    // for Redis, even one that shared mode passes alone).
                    let share = cap / u64::from(closed_peers.max(1));
                    if self.used(&d.res) as f64 + d.take > share as f64 {
                        return Err(d.rejected(Duration::from_secs(1)));
                    }
                }
            }
        }
        for d in demands {
            match d.shape {
                Shape::Rate(_) => {
                    if let Some(b) = self.buckets.get_mut(&d.res) {
                        b.level -= d.take;
                    }
                }
                Shape::Capacity(_) => {
                    *self.in_use.entry(d.res.clone()).or_default() += d.take as u64;
                    self.capacity_shapes.insert(d.res.clone(), d.shape);
                }
            }
        }
        Ok(())
    }

    /// Shared mode: admits from what is leased, or says what to lease
    /// (the demand's index and the ask). A capacity is leased with a block
    /// only when no other lease of this gateway is out: concurrent
    /// admissions would each take one, and a gateway would hold the whole
    /// cap for a handful of requests.
    pub(super) fn admit_shared(
        &mut self,
        demands: &[Demand],
        cluster: &Cluster,
        now: Instant,
    ) -> Result<(), Vec<(usize, shared::Ask)>> {
        let peers = cluster.peers();
        let mut asks = Vec::new();
        for (i, d) in demands.iter().enumerate() {
            let free = self.free(d);
            let need = d.need();
            if free < need {
                let short = (need - free).ceil().max(1.0) as u64;
                let block = match d.shape {
                    Shape::Capacity(_) if self.leasing > 0 => 0,
                    shape => shape.block(peers),
                };
                asks.push((
                    i,
                    shared::Ask {
                        key: cluster.key(&d.res.redis_name()),
                        kind: d.shape.redis(),
                        need: short,
                        want: short + block,
                    },
                ));
            }
        }
        if !asks.is_empty() {
            return Err(asks);
        }
        for d in demands {
            match d.shape {
                Shape::Rate(_) => {
                    if let Some(h) = self.holdings.get_mut(&d.res) {
                        h.units -= d.take;
                        h.touched = now;
                    }
                }
                Shape::Capacity(_) => {
                    *self.in_use.entry(d.res.clone()).or_default() += d.take as u64;
                    self.capacity_shapes.insert(d.res.clone(), d.shape);
                    if let Some(h) = self.holdings.get_mut(&d.res) {
                        h.touched = now;
                    }
                }
            }
        }
        Ok(())
    }

    /// What this gateway holds of `d`'s resource and may spend: unspent
    /// leased tokens of a rate, held units of a capacity not in use.
    pub(super) fn free(&self, d: &Demand) -> f64 {
        let held = self.holdings.get(&d.res).map_or(0.0, |h| h.units);
        match d.shape {
            Shape::Rate(_) => held,
            Shape::Capacity(_) => held - self.used(&d.res) as f64,
        }
    }

    /// Whether what this gateway holds of `d`'s resource covers it.
    pub(super) fn covers(&self, d: &Demand) -> bool {
        self.free(d) >= d.need()
    }

    pub(super) fn add_lease(&mut self, d: &Demand, granted: u64, left: u64, now: Instant) {
        let h = self.holdings.entry(d.res.clone()).or_insert(Holding {
            units: 0.0,
            shape: d.shape,
            touched: now,
        });
        h.units += granted as f64;
        h.shape = d.shape;
        h.touched = now;
        if matches!(d.shape, Shape::Rate(_)) {
            self.left.insert(d.res.clone(), left);
        }
    }
}
