//! The one face of admission: [`place`] decides whether a request may run,
//! where and when, and returns it running or says why not. In order:
//!
//! 1. **Limits** ([`crate::limits`]): every limit the request needs is
//!    charged at once, or none is ([`Refused::Limit`], a 429).
//! 2. **The engine**: the model's engine (simulated replicas, or HTTP
//!    replicas through [`crate::upstream`]) starts it if there is room for
//!    its class.
//! 3. **The fair queue** ([`crate::admission_queue`]), when there is no
//!    room and the fairness layer is on: it waits in its model's queue
//!    (strict priority, then WFQ by tenant weight) for up to its wait
//!    budget, then tries the engine again; a full level is
//!    [`Refused::QueueFull`], a spent budget [`Refused::QueueTimeout`]
//!    (429s). Without a queue, no room is [`Refused::Engine`] at once (503).
//! 4. **Preemption** ([`crate::preemption`]): a priority-5 request still
//!    waiting at half its budget preempts a lower request in flight, once;
//!    so does the owner of dedicated replicas of the model, taking back what
//!    it lent. While an owner's request waits, its replicas are lent to no
//!    one else.
//!
//! A refused request is charged nothing: what the limits took is given
//! back before [`place`] returns.
//!
//! Its waits are on tokio's clock, so a test with the clock paused runs the
//! whole order — queue, timeouts, preemption point — at once and the same
//! way every time (`place/tests.rs`).

use std::time::Duration;

use tokio::time::Instant;

use engine::{CompletionRequest, EngineError};

use crate::admission_queue::{self, NotRun, Queues};
use crate::caller::Caller;
use crate::limits::{self, Limiter, Permit, Rejected};
use crate::preemption::PREEMPTOR_PRIORITY;
use crate::retry_budget::RetryBudget;
use crate::upstream::{Generation, Upstreams};

/// What admission decides with: the gateway's limiter, engines, queues
/// and retry budget.
#[derive(Clone, Copy)]
pub struct Admission<'a> {
    pub limiter: &'a Limiter,
    pub engine: &'a Upstreams,
    /// The fairness layer's queues (`GATEWAY_QUEUE=on`), or none.
    pub queues: Option<&'a Queues>,
    pub retry_budget: &'a RetryBudget,
}

/// One request to place.
pub struct Ask<'a> {
    pub caller: &'a Caller,
    pub request: &'a CompletionRequest,
    pub request_id: String,
    /// Whether the client streams (a streamed request is never preempted).
    pub streams: bool,
    /// Whether it retries an earlier attempt (`Idempotency-Key`).
    pub retry: bool,
    /// Prompt + the output it may produce, in tokens.
    pub estimate: u64,
    /// Its estimated KV·seconds, in MiB·s ([`limits::kv_mib_seconds`]).
    pub kv_mib_seconds: u64,
    /// Its estimated GPU time, in GPU-µs: its cost in the fair queue.
    pub cost_gpu_micros: u64,
}

/// A request running.
pub struct Placed {
    pub generation: Generation,
    /// Its hold on its limits; settle it with what it used.
    pub permit: Permit,
    /// How long it waited between its limits and the engine.
    pub queued: Duration,
    /// Whether a waiting priority-5 request may preempt it (it is not
    /// streamed and its model's queue preempts).
    pub preemptible: bool,
}

/// Why a request does not run.
#[derive(Debug)]
pub enum Refused {
    /// A limit said no.
    Limit(Rejected),
    /// Its priority level of the model's queue was full.
    QueueFull { level: u8, depth: usize },
    /// It waited its whole budget.
    QueueTimeout(Duration),
    /// The engine refused it (no room without a queue, or an error).
    Engine(EngineError),
}

impl Refused {
    /// The reason counted in `gateway_rejected_total`, if it is one.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            Self::Limit(r) => Some(r.limit.as_str()),
            Self::QueueFull { .. } => Some("queue_full"),
            Self::QueueTimeout(_) => Some("queue_timeout"),
            Self::Engine(e) if no_room(e) => Some("no_capacity"),
            Self::Engine(_) => None,
        }
    }
}

/// The engine had no room for the request's class (it did no work).
fn no_room(e: &EngineError) -> bool {
    matches!(
        e,
        EngineError::NoCapacity { .. } | EngineError::UpstreamBusy { .. }
    )
}

/// Places `ask`: its limits, then the engine, waiting in the fair queue
/// (and preempting) while there is no room. See the module docs.
pub async fn place(admission: Admission<'_>, ask: Ask<'_>) -> Result<Placed, Refused> {
    let Ask {
        caller,
        request,
        request_id,
        streams,
        retry,
        estimate,
        kv_mib_seconds,
        cost_gpu_micros: cost,
    } = ask;
    let model = request.model.as_str();
    let mut permit = admission
        .limiter
        .admit(
            caller,
            limits::Ask {
                model,
                estimate,
                kv_mib_seconds,
                request_id,
            },
        )
        .await
        .map_err(Refused::Limit)?;
    admission
        .retry_budget
        .admitted(retry, Instant::now().into_std());

    let arrived = Instant::now();
    let deadline = arrived + admission_queue::budget(caller);
    let owns_replicas = admission.engine.owns_replicas(model, &caller.tenant_id);
    let preemptor = fleet::preempt::Preemptor {
        tenant: &caller.tenant_id,
        priority: caller.priority,
        depth: 0,
        lent_only: caller.priority < PREEMPTOR_PRIORITY,
    };
    let preempts = !preemptor.lent_only || owns_replicas;
    let mut preempt_at = preempts.then(|| arrived + (deadline - arrived) / 2);
    let mut owner_waiting = None;
    let generation = loop {
        let refused = match admission.engine.start(request, streams).await {
            Ok(generation) => break generation,
            Err(e) => e,
        };
        // No room for its class now: wait in the model's fair queue.
        let queue = admission
            .queues
            .filter(|q| q.serves(model) && no_room(&refused));
        if owns_replicas && queue.is_some() && owner_waiting.is_none() {
            owner_waiting = admission.engine.owner_waiting(model, &caller.tenant_id);
        }
        let waited = match queue {
            None => Err(None),
            Some(q) => {
                let now = Instant::now();
                let left = deadline.saturating_duration_since(now);
                match (preempt_at, q.preemptions(model)) {
                    (Some(at), Some(registry)) if at > now => {
                        // Wait until the preemption point first.
                        match q.wait(model, caller, cost, at - now).await {
                            Ok(()) => Ok(()),
                            Err(NotRun::Timeout(_)) => {
                                preempt_at = None;
                                registry.preempt_for(model, preemptor);
                                Ok(())
                            }
                            Err(full) => Err(Some(full)),
                        }
                    }
                    (Some(_), Some(registry)) => {
                        preempt_at = None;
                        registry.preempt_for(model, preemptor);
                        q.wait(model, caller, cost, left).await.map_err(Some)
                    }
                    _ => q.wait(model, caller, cost, left).await.map_err(Some),
                }
            }
        };
        let why = match waited {
            Ok(()) => continue,
            Err(why) => why,
        };
        // Not admitted by the engine: nothing charged.
        permit.settle(0, Instant::now().into_std());
        return Err(match why {
            Some(NotRun::Full { level, depth }) => Refused::QueueFull { level, depth },
            Some(NotRun::Timeout(_)) => Refused::QueueTimeout(deadline - arrived),
            None => Refused::Engine(refused),
        });
    };
    // Placed: the owner now counts as running on its replica, if it is there.
    drop(owner_waiting);
    let preemptible = !streams
        && admission
            .queues
            .and_then(|q| q.preemptions(model))
            .is_some();
    Ok(Placed {
        generation,
        permit,
        queued: arrived.elapsed(),
        preemptible,
    })
}

#[cfg(test)]
mod tests;
