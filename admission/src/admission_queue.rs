//! Queues before the engine (`GATEWAY_QUEUE=on`): a request the model's
//! replica cannot admit for its class right now waits in that model's
//! [`fleet::Queue`] — strict priority levels, and within a level weighted
//! fair sharing by the tenant's `wfq_weight` of the GPU time really used
//! (a request's estimate, prompt + expected output through the model's
//! profile, stands in until it completes) — instead of getting 503 at
//! once.
//!
//! A request goes straight to a replica only when nobody waits at its
//! priority level or above ([`Queues::must_queue`]); otherwise, or when
//! the replica has no room for its class, it joins the queue
//! ([`Queues::join`]). The queue lets one request try at a time, the
//! first in its order: each request that ends on a model wakes it (and a
//! tick every [`TICK`], in case capacity came back otherwise); one that
//! fits leaves and wakes the next, so dispatch goes on while there is
//! room; one that still does not fit keeps its place ([`Spot::not_yet`]).
//! A request is charged its estimated GPU time when it leaves the queue
//! to run, and when it completes [`Queues::completed`] charges its tenant
//! what it really used instead.
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::caller::Caller;

/// How often each queue wakes one waiter whatever ended.
pub const TICK: Duration = Duration::from_millis(50);
/// The wait budget of a tenant without latency objectives.
pub const BEST_EFFORT_WAIT: Duration = Duration::from_secs(2);
/// The longest any wait budget is.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// A queued request's side of its wait.
#[derive(Default)]
struct Waiter {
    /// Its turn to try the engine.
    turn: Notify,
    /// It was told to try and has not said how it went.
    trying: AtomicBool,
    /// A wake came while it was trying: it tries again at once.
    missed: AtomicBool,
}

type Waiting = Arc<Waiter>;

/// One model's queue.
struct ModelQueue {
    queue: Mutex<fleet::Queue<Waiting>>,
}

impl ModelQueue {
    fn lock(&self) -> MutexGuard<'_, fleet::Queue<Waiting>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
/// Every model's queue; cheap to clone.
#[derive(Clone)]
pub struct Queues {
    models: Arc<HashMap<String, Arc<ModelQueue>>>,
    /// What the queue applies: everything in a gateway; less in the
    /// noisy-neighbour drill's baselines.
    discipline: Discipline,
    /// The runs priority preemption may choose from.
    preemptions: crate::preemption::Preemptions,
}

impl std::fmt::Debug for Queues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queues").finish_non_exhaustive()
    }
}

/// The mechanisms a queue applies, each adding one to the last: what the
/// noisy-neighbour drill replays one at a time to show what each brings.
/// A gateway always runs [`Discipline::Full`]; the others are never a
/// setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discipline {
    /// One first-in-first-out line for everyone.
    Fifo,
    /// Strict priority levels; within a level, every tenant weighs the same.
    Levels,
    /// Levels, and within a level fair sharing by tenant weight.
    Weighted,
    /// Levels, weights and priority preemption.
    Full,
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
        Self::with(models, depth, Discipline::Full)
    }

    /// Like [`Queues::new`], applying only what `discipline` says: what
    /// the fair queue is measured against; no gateway runs it.
    pub fn with(
        models: impl IntoIterator<Item = String>,
        depth: usize,
        discipline: Discipline,
    ) -> Self {
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
            discipline,
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
    /// (it queues, and the queue preempts: not a drill's baseline).
    pub fn preemptions(&self, model: &str) -> Option<&crate::preemption::Preemptions> {
        (self.discipline == Discipline::Full && self.serves(model)).then_some(&self.preemptions)
    }

    /// Whether `model` queues.
    pub fn serves(&self, model: &str) -> bool {
        self.models.contains_key(model)
    }

    /// Where `caller` waits in the queue: its tenant, level and weight,
    /// as far as the discipline looks at them.
    fn line<'c>(&self, caller: &'c Caller) -> (&'c str, i16, u32) {
        let tenant = caller.tenant_id.as_str();
        match self.discipline {
            Discipline::Fifo => ("*", 1, 1),
            Discipline::Levels => (tenant, caller.priority, 1),
            Discipline::Weighted | Discipline::Full => (tenant, caller.priority, caller.weight),
        }
    }

    /// Whether an arrival of `caller` for `model` must join the queue
    /// rather than go straight to a replica: someone waits at its level
    /// or above.
    pub fn must_queue(&self, model: &str, caller: &Caller) -> bool {
        let (_, priority, _) = self.line(caller);
        self.models
            .get(model)
            .is_some_and(|q| q.lock().waiting_at_or_above(priority))
    }

    /// Joins `model`'s queue with its estimated cost (GPU-µs), charged to
    /// its tenant when it leaves to run; or says its level is full.
    pub fn join(
        &self,
        model: &str,
        caller: &Caller,
        cost_gpu_micros: u64,
    ) -> Result<Spot<'_>, NotRun> {
        let (tenant, priority, weight) = self.line(caller);
        // A model without a queue has no room for anyone waiting (callers
        // ask `serves` first).
        let Some(q) = self.models.get(model) else {
            return Err(NotRun::Full { level: 0, depth: 0 });
        };
        let waiter = Waiting::default();
        let (ticket, depth) = {
            let mut queue = q.lock();
            let ticket = queue
                .push(tenant, priority, weight, cost_gpu_micros, waiter.clone())
                .map_err(|f| NotRun::Full {
                    level: f.level,
                    depth: f.depth,
                })?;
            (ticket, queue.lens().iter().sum())
        };
        crate::telemetry::queued(model, depth);
        // If there is room now, the first in line (perhaps this one) tries.
        self.wake(model);
        Ok(Spot {
            queues: self,
            model: q,
            name: model.to_owned(),
            waiter,
            ticket,
        })
    }

    /// Tells the first in `model`'s line to try the engine (a request
    /// there ended, or the tick), unless it is trying already.
    pub fn wake(&self, model: &str) {
        let Some(q) = self.models.get(model) else {
            return;
        };
        let mut queue = q.lock();
        if let Some(first) = queue.front() {
            if first.trying.swap(true, Ordering::AcqRel) {
                first.missed.store(true, Ordering::Release);
            } else {
                first.turn.notify_one();
            }
        }
    }

    /// A request of `caller` on `model` completed: its tenant is charged
    /// the GPU time it used (`actual_gpu_micros`) instead of the estimate
    /// it was charged when it left the queue, and the next in line may
    /// fit now.
    pub fn completed(
        &self,
        model: &str,
        caller: &Caller,
        estimated_gpu_micros: u64,
        actual_gpu_micros: u64,
    ) {
        if let Some(q) = self.models.get(model) {
            let (tenant, priority, weight) = self.line(caller);
            q.lock().correct(
                tenant,
                priority,
                weight,
                estimated_gpu_micros,
                actual_gpu_micros,
            );
        }
        self.wake(model);
    }

    /// Requests waiting for `model`, every level.
    pub fn depth(&self, model: &str) -> usize {
        self.models
            .get(model)
            .map_or(0, |q| q.lock().lens().iter().sum())
    }
}

/// A request's place in its model's queue, from [`Queues::join`] until it
/// runs ([`Spot::dispatched`]) or gives up (dropped: charged nothing, the
/// next in line woken).
pub struct Spot<'q> {
    queues: &'q Queues,
    model: &'q ModelQueue,
    name: String,
    waiter: Waiting,
    ticket: fleet::Ticket,
}

impl Spot<'_> {
    /// Waits until it is this request's turn to try the engine, for at
    /// most `wait`.
    pub async fn turn(&self, wait: Duration) -> Result<(), NotRun> {
        tokio::time::timeout(wait, self.waiter.turn.notified())
            .await
            .map_err(|_| NotRun::Timeout(wait))
    }

    /// It tried and still does not fit: it keeps its place, and tries
    /// again on the next wake (at once if one came meanwhile).
    pub fn not_yet(&self) {
        self.waiter.trying.store(false, Ordering::Release);
        if self.waiter.missed.swap(false, Ordering::AcqRel) {
            self.queues.wake(&self.name);
        }
    }

    /// It runs: it leaves the queue, charged its estimate, and the next in
    /// line tries (there may be room for more).
    pub fn dispatched(self) {
        self.model.lock().dispatch(&self.ticket);
        // Drop finds it gone and wakes the next.
    }
}

impl Drop for Spot<'_> {
    fn drop(&mut self) {
        self.model.lock().cancel(&self.ticket);
        self.queues.wake(&self.name);
    }
}

#[cfg(test)]
mod tests;
