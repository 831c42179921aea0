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
//! count); while it has none there, the replica is lent like any other.
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
                }
            })
            .collect();
        // The first replicas are the dedicated ones, by tenant name.
        let owners = profile
            .dedicated
            .iter()
            .flat_map(|(tenant, &n)| std::iter::repeat_n(tenant, n as usize));
        let mut owners = owners.fuse();
        let pool = fleet::pool::Pool::new(
            replicas
                .iter()
                .map(|h| {
                    let r = fleet::pool::Replica::new(h.replica_id.clone(), capacity);
                    match owners.next() {
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

    /// The replica for a request of `kv` bytes of `class`, counted as sent
    /// there; `None` when no live replica can admit it by the router's view.
    pub(crate) fn route(&self, tenant: &str, kv: u64, class: ServiceClass) -> Option<usize> {
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
            owner_waiting: false,
        };
        let at = pool.route(&placement, rng)?;
        let id = &pool.replicas()[at].id;
        self.handle(id).map(|(i, _)| i)
    }

    /// Replica `replica_id` died: it leaves the router's pool.
    pub(crate) fn remove(&self, replica_id: &str) {
        self.router().pool.remove(replica_id);
    }

    /// Replica `i` refused a request of `tenant` for its class: full by
    /// the router's view until it publishes again, and the request no
    /// longer counts there.
    pub(crate) fn refused(&self, i: usize, tenant: &str) {
        let mut r = self.router();
        let id = &self.replicas[i].replica_id;
        if let Some(at) = r.pool.replicas().iter().position(|p| &p.id == id) {
            let full = r.pool.replicas()[at].kv_capacity;
            r.pool.observe(at, full);
            r.pool.finished(at, tenant);
        }
    }

    /// What ends the request's stay on replica `i` in the router's books,
    /// if the router counts it there (its owner's requests only).
    pub(crate) fn stay(&self, i: usize, tenant: &str) -> Option<Stay> {
        let id = &self.replicas[i].replica_id;
        self.router()
            .pool
            .replicas()
            .iter()
            .any(|p| &p.id == id && p.owner.as_deref() == Some(tenant))
            .then(|| Stay {
                router: self.router.clone(),
                replica_id: id.clone(),
                tenant: tenant.to_owned(),
            })
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

/// An owner's request on its dedicated replica, as the router counts it
/// (no other tenant starts there meanwhile); dropped when it ends.
pub(crate) struct Stay {
    router: Arc<Mutex<Router>>,
    replica_id: String,
    tenant: String,
}

impl Drop for Stay {
    fn drop(&mut self) {
        let mut r = self.router.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = r
            .pool
            .replicas()
            .iter()
            .position(|p| p.id == self.replica_id)
        {
            r.pool.finished(at, &self.tenant);
        }
    }
}
