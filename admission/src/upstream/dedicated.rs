//! Dedicated HTTP replicas (`dedicated_to` in the upstreams file): a
//! replica one tenant owns as reserved capacity. The owner's requests go
//! to it first; another tenant's start on it only while the owner has
//! nothing waiting for or running on it (the replica is *lent*), and the
//! GPU time those ran is counted apart, so the owner's reserved line can
//! credit it. When the owner comes back and finds no room, the gateway's
//! preemption takes lent non-streaming work off the replica first (it
//! closes the connection: the engine aborts it); lent streams run to
//! their end, and the owner's request goes there as soon as room is
//! there, or spills to the shared replicas.
//!
//! What the owner is doing is this gateway's view (its own requests);
//! several gateways each lend from what they see, like their queues.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// One dedicated replica's owner and what it lent.
#[derive(Debug)]
pub struct Dedicated {
    pub owner: String,
    /// The owner's requests waiting for, or running on, the replica.
    busy: AtomicUsize,
    /// GPU-µs of other tenants' requests that ran on it (this gateway's).
    lent_gpu_micros: AtomicU64,
}

/// The owner is waiting for, or running on, these replicas until dropped.
#[derive(Debug)]
pub struct OwnerBusy(Vec<Arc<Dedicated>>);

impl OwnerBusy {
    /// The owner (of the first replica held).
    pub fn owner(&self) -> Option<&str> {
        self.0.first().map(|d| d.owner.as_str())
    }
}

impl Drop for OwnerBusy {
    fn drop(&mut self) {
        for d in &self.0 {
            d.busy.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Dedicated {
    pub fn new(owner: String) -> Self {
        Self {
            owner,
            busy: AtomicUsize::new(0),
            lent_gpu_micros: AtomicU64::new(0),
        }
    }

    /// Whether another tenant's request may start on it now.
    pub fn lends(&self) -> bool {
        self.busy.load(Ordering::Acquire) == 0
    }

    /// The owner waits for (or runs on) every one of `replicas`.
    pub fn hold(replicas: Vec<Arc<Self>>) -> OwnerBusy {
        for d in &replicas {
            d.busy.fetch_add(1, Ordering::AcqRel);
        }
        OwnerBusy(replicas)
    }

    /// Another tenant's request that ran on it used `micros` GPU-µs.
    pub fn lent(&self, micros: u64) {
        self.lent_gpu_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// GPU-µs lent so far (this gateway's own ledger).
    pub fn lent_gpu_micros(&self) -> u64 {
        self.lent_gpu_micros.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_lends_only_while_its_owner_holds_nothing() {
        let a = Arc::new(Dedicated::new("acme".into()));
        let b = Arc::new(Dedicated::new("acme".into()));
        assert!(a.lends() && b.lends());
        let waiting = Dedicated::hold(vec![a.clone(), b.clone()]);
        let running = Dedicated::hold(vec![a.clone()]);
        assert!(!a.lends() && !b.lends());
        drop(waiting);
        assert!(!a.lends(), "still running there");
        assert!(b.lends());
        drop(running);
        assert!(a.lends());
    }
}
