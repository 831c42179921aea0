//! The replicas of one simulated model and where a request goes.
//!
//! **Routing** (`fleet::pool`): power of two choices on KV headroom. The
//! router counts what it sent each replica since that replica's last
//! published snapshot on top of the snapshot's KV in use, so a burst that
//! arrives between two snapshots spreads instead of herding onto the
//! replica that looked emptiest. A replica is eligible while that occupancy
//! is below the request's class threshold (the replica's own rule). One
//! that refuses the request anyway (the router's view lagged) is marked
//! full until its next snapshot and the request tries another.
//!
//! **Dedicated replicas** (the profile's `dedicated`): the pool's first
//! replicas belong to a tenant. Its requests go there first; while it has a
//! request running on one, nobody else's starts there ([`Stay`] keeps that
//! count), nor while one of its requests waits for room in the gateway's
//! queue ([`OwnerWaiting`]); otherwise the replica is lent like any other.
//!
//! **Reserved floors** (`fleet::pool`): the tenants' floors, set from the
//! tenant config, are kept free of other tenants' work until their owners
//! use them.
//!
//! **A dead replica** is marked `dead` and leaves the router's pool; its
//! task fails what it was running (see [`crate::replica_task`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::mpsc;

use crate::error::EngineError;
use crate::metrics::ReplicaSnapshot;
use crate::profile::{ModelProfile, BLOCK_TOKENS};
use crate::replica_task::Command;
use crate::scheduler::ServiceClass;

/// One replica of a pool: its task's channel (started on first use), its
/// last snapshot and whether it died.
pub(crate) struct ReplicaHandle {
    pub(crate) replica_id: String,
    pub(crate) tx: OnceLock<Result<mpsc::UnboundedSender<Command>, EngineError>>,
    pub(crate) snapshot: Arc<Mutex<ReplicaSnapshot>>,
    /// Snapshots published so far (the router re-reads a changed one).
    pub(crate) published: Arc<AtomicU64>,
    pub(crate) dead: AtomicBool,
    /// The tenant a dedicated replica belongs to.
    pub(crate) owner: Option<String>,
}

/// The router's view of one model's pool.
struct Router {
    pool: fleet::pool::Pool,
    /// Per handle, the snapshot count the pool last observed.
    seen: Vec<u64>,
    rng: StdRng,
}

/// One model: its profile, its replicas and the router placing requests.
pub(crate) struct ModelPool {
    pub(crate) profile: ModelProfile,
    pub(crate) replicas: Vec<ReplicaHandle>,
    router: Arc<Mutex<Router>>,
    /// KV bytes one block holds on this model.
    block_bytes: u64,
}

impl ModelPool {
    pub(crate) fn new(profile: &ModelProfile) -> Self {
        let block_bytes = profile.kv_bytes_per_token * u64::from(BLOCK_TOKENS);
        let capacity = profile.total_blocks() * block_bytes;
        // The first replicas are the dedicated ones, by tenant name.
        let mut owners = profile
            .dedicated
            .iter()
            .flat_map(|(tenant, &n)| std::iter::repeat_n(tenant.clone(), n as usize))
            .fuse();
        let replicas: Vec<ReplicaHandle> = (0..profile.replicas.max(1))
            .map(|i| {
                let replica_id = format!("{}-r{i}", profile.name);
                ReplicaHandle {
                    snapshot: Arc::new(Mutex::new(ReplicaSnapshot {
                        model: profile.name.clone(),
                        replica_id: replica_id.clone(),
                        gpus: u64::from(profile.gpus),
                        ..ReplicaSnapshot::default()
                    })),
                    replica_id,
                    tx: OnceLock::new(),
                    published: Arc::default(),
                    dead: AtomicBool::new(false),
                    owner: owners.next(),
                }
            })
            .collect();
        let pool = fleet::pool::Pool::new(
            replicas
                .iter()
                .map(|h| {
                    let r = fleet::pool::Replica::new(h.replica_id.clone(), capacity);
                    match &h.owner {
                        Some(owner) => r.owned_by(owner.clone()),
                        None => r,
                    }
                })
                .collect(),
        );
        Self {
            router: Arc::new(Mutex::new(Router {
                pool,
                seen: vec![0; replicas.len()],
                rng: StdRng::seed_from_u64(0x5eed),
            })),
            replicas,
            profile: profile.clone(),
            block_bytes,
        }
    }

    fn router(&self) -> std::sync::MutexGuard<'_, Router> {
        // Plain numbers, consistent between statements.
        self.router.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn handle(&self, id: &str) -> Option<(usize, &ReplicaHandle)> {
        self.replicas
            .iter()
            .enumerate()
            .find(|(_, h)| h.replica_id == id)
    }

    /// The tenants' reserved floors, basis points of this pool's KV.
    pub(crate) fn set_floors(&self, floors: std::collections::HashMap<String, u32>) {
        self.router().pool.set_floors(floors);
    }

    /// The replica for a request of `kv` bytes of `class`, counted as sent
    /// there; refused when no live replica can admit it by the router's
    /// view, or only other tenants' reserved floors have room.
    pub(crate) fn route(
        &self,
        tenant: &str,
        kv: u64,
        class: ServiceClass,
    ) -> Result<usize, fleet::pool::Refused> {
        let mut r = self.router();
        let Router { pool, seen, rng } = &mut *r;
        for (i, h) in self.replicas.iter().enumerate() {
            let published = h.published.load(Ordering::Acquire);
            if published == seen[i] || h.dead.load(Ordering::Acquire) {
                continue;
            }
            seen[i] = published;
            let used = h
                .snapshot
                .lock()
                .map_or(0, |s| s.kv_used_blocks * self.block_bytes);
            if let Some(at) = pool.replicas().iter().position(|p| p.id == h.replica_id) {
                pool.observe(at, used);
            }
        }
        let placement = fleet::pool::Placement {
            tenant,
            kv,
            threshold_percent: class.threshold_percent(),
        };
        let at = pool.route(&placement, rng)?;
        let id = &pool.replicas()[at].id;
        self.handle(id)
            .map(|(i, _)| i)
            .ok_or(fleet::pool::Refused::Full)
    }

    /// Replica `replica_id` died: it leaves the router's pool.
    pub(crate) fn remove(&self, replica_id: &str) {
        self.router().pool.remove(replica_id);
    }

    /// A request of `owner` waits for room in the gateway's queue: its
    /// dedicated replicas are not lent to anyone else until the returned
    /// guard is dropped (when the request is placed or gives up). `None`
    /// when `owner` has no dedicated replica in this pool.
    pub(crate) fn owner_waiting(&self, owner: &str) -> Option<OwnerWaiting> {
        self.replicas
            .iter()
            .any(|h| h.owner.as_deref() == Some(owner))
            .then(|| {
                self.router().pool.owner_waits(owner);
                OwnerWaiting {
                    router: self.router.clone(),
                    owner: owner.to_owned(),
                }
            })
    }

    /// Replica `i` refused a request of `tenant` (`kv` bytes) for its
    /// class: full by the router's view until it publishes again, and the
    /// request no longer counts there.
    pub(crate) fn refused(&self, i: usize, tenant: &str, kv: u64) {
        let mut r = self.router();
        let id = &self.replicas[i].replica_id;
        if let Some(at) = r.pool.replicas().iter().position(|p| &p.id == id) {
            let full = r.pool.replicas()[at].kv_capacity;
            r.pool.observe(at, full);
        }
        r.pool.finished(id, tenant, kv);
    }

    /// A request routed to replica `i` did not start there (an error, or
    /// the replica died first): it no longer counts there.
    pub(crate) fn forget(&self, i: usize, tenant: &str, kv: u64) {
        let id = &self.replicas[i].replica_id;
        self.router().pool.finished(id, tenant, kv);
    }

    /// What ends the request's stay on replica `i` in the router's books
    /// (its tenant's KV in flight; an owner's count on its replica).
    pub(crate) fn stay(&self, i: usize, tenant: &str, kv: u64) -> Stay {
        Stay {
            router: self.router.clone(),
            replica_id: self.replicas[i].replica_id.clone(),
            tenant: tenant.to_owned(),
            kv,
        }
    }

    /// The least KV occupancy among the live replicas, percent (for the
    /// refusal's message).
    pub(crate) fn least_occupancy_percent(&self) -> u64 {
        self.replicas
            .iter()
            .filter(|h| !h.dead.load(Ordering::Acquire))
            .filter_map(|h| h.snapshot.lock().ok().map(|s| s.kv_usage))
            .fold(None, |m: Option<f64>, u| Some(m.map_or(u, |m| m.min(u))))
            .map_or(100, |u| (u * 100.0).floor() as u64)
    }
}

/// An owner's request waiting for room ([`ModelPool::owner_waiting`]);
/// dropping it lends the owner's replicas again (if nothing else of the
/// owner waits or runs there).
#[must_use = "the owner counts as waiting only while this is held"]
pub struct OwnerWaiting {
    router: Arc<Mutex<Router>>,
    owner: String,
}

impl std::fmt::Debug for OwnerWaiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerWaiting")
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl Drop for OwnerWaiting {
    fn drop(&mut self) {
        let mut r = self.router.lock().unwrap_or_else(PoisonError::into_inner);
        r.pool.owner_stops_waiting(&self.owner);
    }
}

/// A request on a replica as the router counts it (its tenant's KV in
/// flight; on a dedicated replica, its owner's running count, so no other
/// tenant starts there meanwhile); dropped when it ends.
pub(crate) struct Stay {
    router: Arc<Mutex<Router>>,
    replica_id: String,
    tenant: String,
    kv: u64,
}

impl Drop for Stay {
    fn drop(&mut self) {
        let mut r = self.router.lock().unwrap_or_else(PoisonError::into_inner);
        r.pool.finished(&self.replica_id, &self.tenant, self.kv);
    }
}
