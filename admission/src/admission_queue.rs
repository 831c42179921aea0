//! Queues before the engine (`GATEWAY_QUEUE=on`): a request the model's
//! replica cannot admit for its class right now waits in that model's
//! [`fleet::Queue`] — strict priority levels, and within a level weighted
//! fair queuing by the tenant's `wfq_weight` on virtual time, its cost the
//! request's estimated GPU time (prompt + max output through the model's
//! profile) — instead of getting 503 at once.
//!
//! Each request that ends on a model wakes the first waiter of its queue,
//! which tries the engine again (a tick every [`TICK`] wakes one more, in
//! case capacity came back otherwise); one that still does not fit goes
//! back in line with its own virtual clock, so it keeps its fair place.
//!
//! - A request waits at most its tenant's **wait budget**: its TTFT
//!   objective; with only an end-to-end objective, a fifth of it; best
//!   effort (no objective), [`BEST_EFFORT_WAIT`]. Past it: 429
//!   `queue_timeout` with the jittered Retry-After of a limit, counted as
//!   `gateway_rejections_total{reason="queue_timeout"}`.
//! - Each level holds at most `GATEWAY_QUEUE_DEPTH` requests; beyond: 429
//!   `queue_full`.
//! - A queued request has passed the limits: it holds its concurrency slot
//!   and its KV·seconds while it waits (queued requests count against the
//!   tenant's concurrency cap), and its client leaving ends its wait.
//! - HTTP upstreams queue too: a refusal for the class (the last KV poll
//!   past the class threshold, or the upstream's own 429/503, sent before
//!   it did any work) waits in the same fair queue and is sent again when
//!   woken. Their non-streaming requests are preempted like the
//!   simulator's: the gateway closes the victim's connection (the engine
//!   aborts it) and sends it again from the queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::caller::Caller;

/// How often each queue wakes one waiter whatever ended.
pub const TICK: Duration = Duration::from_millis(50);
/// The wait budget of a tenant without latency objectives.
pub const BEST_EFFORT_WAIT: Duration = Duration::from_secs(2);
/// The longest any wait budget is.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

type Waiter = oneshot::Sender<()>;

/// One model's queue.
struct ModelQueue {
    queue: Mutex<fleet::Queue<Waiter>>,
}

/// Every model's queue; cheap to clone.
#[derive(Clone)]
pub struct Queues {
    models: Arc<HashMap<String, Arc<ModelQueue>>>,
    /// One line for everyone: no priority levels, no weights (the
    /// noisy-neighbour drill's baseline, never a gateway setting).
    fifo: bool,
    /// The runs priority preemption may choose from.
    preemptions: crate::preemption::Preemptions,
}

impl std::fmt::Debug for Queues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queues").finish_non_exhaustive()
    }
}

/// Why a queued request did not get to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRun {
    /// Its level was at its depth.
    Full { level: u8, depth: usize },
    /// It waited its whole budget.
    Timeout(Duration),
}

/// The wait budget of `caller`'s requests (see the module docs).
pub fn budget(caller: &Caller) -> Duration {
    let slo = caller.slo;
    let ms = slo
        .ttft_p95_ms
        .map(u64::from)
        .or(slo.e2e_p95_ms.map(|e| u64::from(e) / 5));
    ms.map_or(BEST_EFFORT_WAIT, Duration::from_millis)
        .min(MAX_WAIT)
}

impl Queues {
    /// A queue for each of `models`, `depth` per priority level, each
    /// woken every [`TICK`] by a task of its own.
    pub fn new(models: impl IntoIterator<Item = String>, depth: usize) -> Self {
        Self::build(models, depth, false)
    }

    /// Like [`Queues::new`], but a plain FIFO: every request in one line,
    /// whatever its tenant and priority. What the fair queue is measured
    /// against; no gateway runs it.
    pub fn fifo(models: impl IntoIterator<Item = String>, depth: usize) -> Self {
        Self::build(models, depth, true)
    }

    fn build(models: impl IntoIterator<Item = String>, depth: usize, fifo: bool) -> Self {
        let config = fleet::QueueConfig {
            depth: [depth; fleet::queue::LEVELS],
        };
        let models: HashMap<String, Arc<ModelQueue>> = models
            .into_iter()
            .map(|m| {
                let q = Arc::new(ModelQueue {
                    queue: Mutex::new(fleet::Queue::new(config.clone())),
                });
                (m, q)
            })
            .collect();
        let queues = Self {
            models: Arc::new(models),
            fifo,
            preemptions: crate::preemption::Preemptions::default(),
        };
        let ticking = queues.clone();
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(TICK);
                loop {
                    tick.tick().await;
                    for model in ticking.models.keys() {
                        ticking.wake(model);
                    }
                }
            });
        }
        queues
    }

    /// The preemption registry, when requests of `model` can be preempted
    /// (it queues, and the queue has priorities: not the FIFO baseline).
    pub fn preemptions(&self, model: &str) -> Option<&crate::preemption::Preemptions> {
        (!self.fifo && self.serves(model)).then_some(&self.preemptions)
    }

    /// Whether `model` queues.
    pub fn serves(&self, model: &str) -> bool {
        self.models.contains_key(model)
    }

    /// Waits in `model`'s queue until woken (`Ok`: try the engine again),
    /// or says why not; `wait` is what is left of the request's budget.
    pub async fn wait(
        &self,
        model: &str,
        caller: &Caller,
        cost_gpu_micros: u64,
        wait: Duration,
    ) -> Result<(), NotRun> {
        let Some(q) = self.models.get(model) else {
            return Ok(());
        };
        let (tx, rx) = oneshot::channel();
        let ticket = {
            let mut queue = q.queue.lock().unwrap_or_else(PoisonError::into_inner);
            let (tenant, priority, weight) = if self.fifo {
                ("*", 1, 1)
            } else {
                (caller.tenant_id.as_str(), caller.priority, caller.weight)
            };
            queue
                .push(tenant, priority, weight, cost_gpu_micros, tx)
                .map_err(|f| NotRun::Full {
                    level: f.level,
                    depth: f.depth,
                })?
                .ticket
        };
        crate::telemetry::queued(model, self.depth(model));
        // Cancelled however the wait ends unwoken (timeout, client gone).
        let guard = CancelOnDrop(ticket);
        let woken = tokio::time::timeout(wait, rx).await;
        match woken {
            Ok(Ok(())) => {
                std::mem::forget(guard);
                Ok(())
            }
            _ => Err(NotRun::Timeout(wait)),
        }
    }

    /// Wakes the first waiter of `model`'s queue (a request there ended).
    pub fn wake(&self, model: &str) {
        let Some(q) = self.models.get(model) else {
            return;
        };
        let mut skipped = Vec::new();
        let mut queue = q.queue.lock().unwrap_or_else(PoisonError::into_inner);
        // A waiter that gave up meanwhile cannot take the turn: the next one does.
        while let Some(waiter) = queue.pop_if(|_| true, &mut skipped) {
            if waiter.send(()).is_ok() {
                break;
            }
        }
    }

    /// Requests waiting for `model`, every level.
    pub fn depth(&self, model: &str) -> usize {
        self.models.get(model).map_or(0, |q| {
            q.queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .lens()
                .iter()
                .sum()
        })
    }
}

struct CancelOnDrop(fleet::Ticket);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

#[cfg(test)]
mod tests;
