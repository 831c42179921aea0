//! Priority preemption, carried out (`GATEWAY_QUEUE=on`): when a request
//! of priority 5 has waited in its model's queue for half its wait budget
//! (it would miss its TTFT objective), one replica gives up its
//! lowest-priority request in flight, chosen by [`fleet::preempt::choose`]:
//! never one that streams (a streaming request may already have sent
//! tokens, so only non-streaming requests are registered here), never on a
//! replica that preempted in the last 5 s, chains at most 2 deep. Work
//! another tenant runs on a dedicated replica *lent* while its owner was
//! idle goes first when the owner's request waits, whatever its priority
//! (the owner preempts at any priority for that): the owner gets its
//! replica back before anyone else's work is thrown away.
//!
//! The victim's run is told ([`Registration::preempted`]); it cancels its
//! generation at the engine (its KV is freed at once and the engine returns
//! exactly the GPU time it used), keeps that GPU time as
//! `preempted_gpu_seconds`, and goes back to its own queue at its own
//! priority: its client sees delay, not failure. A re-queued victim that
//! cannot start in turn may preempt a lower one (depth + 1). Every
//! preemption is counted in `preemptions_total{preempted_tenant,preempting_tenant}`.
//!
//! The registry is this gateway's own (soft state, like its queues): with
//! several gateways each preempts among the requests it runs itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use metrics::counter;
use tokio::sync::oneshot;

/// The priority whose waiting requests preempt (a re-queued victim of any
/// priority may too, one level deeper).
pub const PREEMPTOR_PRIORITY: i16 = 5;

/// What a preempted run is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preempted {
    /// The tenant whose request needed the room.
    pub by_tenant: String,
    /// The victim's chain depth from now on.
    pub depth: u8,
}

struct Entry {
    model: String,
    replica: String,
    /// The tenant `replica` is dedicated to, if any.
    owner: Option<String>,
    tenant: String,
    priority: i16,
    started: Instant,
    tell: Option<oneshot::Sender<Preempted>>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    running: HashMap<u64, Entry>,
    /// When each replica last preempted.
    last_preempted: HashMap<String, Instant>,
}

/// The non-streaming requests this gateway runs that may be preempted.
#[derive(Clone, Default)]
pub struct Preemptions {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for Preemptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Preemptions").finish_non_exhaustive()
    }
}

/// A run that may be preempted: where it runs and for whom.
#[derive(Debug, Clone, Copy)]
pub struct Run<'a> {
    pub model: &'a str,
    pub replica: &'a str,
    /// The tenant `replica` is dedicated to, if any.
    pub owner: Option<&'a str>,
    pub tenant: &'a str,
    pub priority: i16,
}

/// A run's place in the registry; dropping it takes the run out.
pub struct Registration {
    id: u64,
    registry: Preemptions,
    told: oneshot::Receiver<Preempted>,
}

impl Registration {
    /// Resolves when the run is preempted (never, if it is not).
    pub async fn preempted(&mut self) -> Preempted {
        match (&mut self.told).await {
            Ok(p) => p,
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.lock().running.remove(&self.id);
    }
}

impl Preemptions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Plain bookkeeping, consistent between statements.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a run as preemptible.
    pub fn register(&self, run: Run<'_>) -> Registration {
        let (tell, told) = oneshot::channel();
        let mut inner = self.lock();
        inner.next += 1;
        let id = inner.next;
        inner.running.insert(
            id,
            Entry {
                model: run.model.to_owned(),
                replica: run.replica.to_owned(),
                owner: run.owner.map(str::to_owned),
                tenant: run.tenant.to_owned(),
                priority: run.priority,
                started: Instant::now(),
                tell: Some(tell),
            },
        );
        Registration {
            id,
            registry: self.clone(),
            told,
        }
    }

    /// Preempts one request of `model` for a waiting request `who`, if
    /// the rules allow one; says whether it did.
    pub fn preempt_for(&self, model: &str, who: fleet::preempt::Preemptor<'_>) -> bool {
        let tenant = who.tenant;
        let now = Instant::now();
        let mut inner = self.lock();
        // The candidates, by replica, in a stable order.
        let mut by_replica: Vec<(String, fleet::preempt::Replica)> = Vec::new();
        for (&id, e) in inner
            .running
            .iter()
            .filter(|(_, e)| e.model == model && e.tell.is_some())
        {
            let at = match by_replica.iter().position(|(r, _)| r == &e.replica) {
                Some(at) => at,
                None => {
                    let replica = fleet::preempt::Replica {
                        last_preempted: inner.last_preempted.get(&e.replica).copied(),
                        running: Vec::new(),
                        owner: e.owner.clone(),
                    };
                    by_replica.push((e.replica.clone(), replica));
                    by_replica.len() - 1
                }
            };
            by_replica[at].1.running.push(fleet::preempt::Running {
                id,
                tenant: e.tenant.clone(),
                priority: e.priority,
                streamed: false,
                // What preempting it throws away grows with how long it ran.
                gpu_micros: now.saturating_duration_since(e.started).as_micros() as u64,
            });
        }
        by_replica.sort_by(|a, b| a.0.cmp(&b.0));
        let replicas: Vec<fleet::preempt::Replica> =
            by_replica.iter().map(|(_, r)| r.clone()).collect();
        let Some(plan) = fleet::preempt::choose(&replicas, who, now) else {
            return false;
        };
        let replica = by_replica[plan.replica].0.clone();
        let Some(victim) = inner.running.get_mut(&plan.victim) else {
            return false;
        };
        let Some(tell) = victim.tell.take() else {
            return false;
        };
        let preempted_tenant = victim.tenant.clone();
        let told = tell
            .send(Preempted {
                by_tenant: tenant.to_owned(),
                depth: plan.victim_depth,
            })
            .is_ok();
        if told {
            inner.last_preempted.insert(replica, now);
            counter!(
                "preemptions_total",
                "preempted_tenant" => preempted_tenant,
                "preempting_tenant" => tenant.to_owned()
            )
            .increment(1);
        }
        told
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet::preempt::Preemptor;

    /// A run of model `m` on a shared replica.
    fn run<'a>(replica: &'a str, tenant: &'a str, priority: i16) -> Run<'a> {
        Run {
            model: "m",
            replica,
            owner: None,
            tenant,
            priority,
        }
    }

    /// A priority-5 request at chain `depth`.
    fn p5(tenant: &str, depth: u8) -> Preemptor<'_> {
        Preemptor {
            tenant,
            priority: 5,
            depth,
            lent_only: false,
        }
    }

    #[tokio::test]
    async fn the_lowest_priority_is_preempted_and_its_replica_is_then_immune() {
        let p = Preemptions::default();
        let mut low = p.register(run("m-r0", "batch", 1));
        let _mid = p.register(run("m-r1", "tools", 3));
        let mut other = p.register(run("m-r1", "batch", 1));
        assert!(p.preempt_for("m", p5("prod", 0)));
        // Ties on priority go to the one that lost least (the later one):
        // here the order of registration, on r1 or r0 — either way one told.
        let first = tokio::select! {
            x = low.preempted() => ("m-r0", x),
            x = other.preempted() => ("m-r1", x),
        };
        assert_eq!(
            first.1,
            Preempted {
                by_tenant: "prod".into(),
                depth: 1
            }
        );
        // The next preemption cannot use the replica that just preempted;
        // the remaining priority-1 run is on the other replica.
        assert!(p.preempt_for("m", p5("prod", 0)));
        // Now both replicas are in their cooldown: nothing more.
        let _late = p.register(run("m-r0", "batch", 1));
        assert!(!p.preempt_for("m", p5("prod", 0)));
    }

    #[test]
    fn never_an_equal_or_higher_priority_nor_past_depth_two() {
        let p = Preemptions::default();
        let _same = p.register(run("m-r0", "prod-2", 5));
        assert!(!p.preempt_for("m", p5("prod", 0)));
        let _low = p.register(run("m-r1", "batch", 1));
        assert!(
            !p.preempt_for("m", p5("prod", 2)),
            "a chain stops at depth 2"
        );
        assert!(!p.preempt_for("other-model", p5("prod", 0)));
        assert!(p.preempt_for("m", p5("prod", 1)));
    }

    #[test]
    fn a_finished_run_is_no_longer_a_candidate() {
        let p = Preemptions::default();
        let low = p.register(run("m-r0", "batch", 1));
        drop(low);
        assert!(!p.preempt_for("m", p5("prod", 0)));
    }

    #[tokio::test]
    async fn the_owner_takes_back_lent_work_on_its_replica_first() {
        let p = Preemptions::default();
        let _shared = p.register(run("m-r1", "batch", 1));
        let mut lent = p.register(Run {
            owner: Some("acme"),
            ..run("m-r0", "tools", 4)
        });
        // An owner below priority 5 takes back only what it lent...
        let owner = Preemptor {
            tenant: "acme",
            priority: 3,
            depth: 0,
            lent_only: true,
        };
        assert!(p.preempt_for("m", owner));
        assert_eq!(lent.preempted().await.by_tenant, "acme");
        // ...and nothing else: r0 is cooling down, the P1 on r1 is not its.
        assert!(!p.preempt_for("m", owner));
    }
}
