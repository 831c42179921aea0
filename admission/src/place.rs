//! The one face of admission: [`place`] decides whether a request may run,
//! where and when, and returns it running or says why not. In order:
//!
//! 1. **Limits** ([`crate::limits`]): every limit the request needs is
//!    charged at once, or none is ([`Refused::Limit`], a 429).
//! 2. **The fast path**: when nobody waits in the model's queue at its
//!    priority level or above, the model's engine (simulated replicas, or
//!    HTTP replicas through [`crate::upstream`]) starts it if there is room
//!    for its class.
//! 3. **The fair queue** ([`crate::admission_queue`]), when someone waits
//!    at its level or above, or there is no room, and the fairness layer
//!    is on: it joins its model's queue (strict priority, then fair sharing by
//!    tenant weight, charged once) and tries the engine in its turn, for
//!    up to its wait budget; a full level is [`Refused::QueueFull`], a
//!    spent budget [`Refused::QueueTimeout`] (429s). Without a queue, no
//!    room is [`Refused::Engine`] at once (503).
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
    let budget = admission_queue::budget(caller);
    let owns_replicas = admission.engine.owns_replicas(model, &caller.tenant_id);
    let lent_only = caller.priority < PREEMPTOR_PRIORITY;
    let preempts = !lent_only || owns_replicas;
    let turn = Turn {
        caller,
        request,
        streams,
        cost,
        budget,
        preempt_after: preempts.then(|| budget / 2),
        preemptor: fleet::preempt::Preemptor {
            tenant: &caller.tenant_id,
            priority: caller.priority,
            depth: 0,
            lent_only,
        },
        owns_replicas,
    };
    let generation = match start_in_turn(admission, turn).await {
        Ok(generation) => generation,
        Err(refused) => {
            // Not admitted by the engine: nothing charged.
            permit.settle(0, Instant::now().into_std());
            return Err(refused);
        }
    };
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

/// A preempted request asks again: it waits in its model's queue at its
/// own priority (behind its preemptor) for up to [`admission_queue::MAX_WAIT`],
/// and if it cannot start at once preempts a lower request in turn, one
/// level deeper (`depth`). Its limits are still held from its first start.
pub async fn again(
    admission: Admission<'_>,
    caller: &Caller,
    request: &CompletionRequest,
    cost_gpu_micros: u64,
    depth: u8,
) -> Result<Generation, Refused> {
    start_in_turn(
        admission,
        Turn {
            caller,
            request,
            streams: false,
            cost: cost_gpu_micros,
            budget: admission_queue::MAX_WAIT,
            preempt_after: Some(Duration::ZERO),
            preemptor: fleet::preempt::Preemptor {
                tenant: &caller.tenant_id,
                priority: caller.priority,
                depth,
                lent_only: false,
            },
            owns_replicas: false,
        },
    )
    .await
}

/// A request between its limits and the engine.
struct Turn<'a> {
    caller: &'a Caller,
    request: &'a CompletionRequest,
    streams: bool,
    /// Its estimated GPU-µs: its charge in the fair queue.
    cost: u64,
    /// How long it may wait for room.
    budget: Duration,
    /// After how long it preempts a lower request if it still waits (once).
    preempt_after: Option<Duration>,
    preemptor: fleet::preempt::Preemptor<'a>,
    /// Its tenant owns dedicated replicas of the model (lent to no one
    /// else while it waits).
    owns_replicas: bool,
}

/// Starts the request on the engine: at once when nobody waits at its
/// level or above (the fast path), else in its turn in the model's queue;
/// a request that finds no room joins the queue too. See the module docs.
async fn start_in_turn(admission: Admission<'_>, turn: Turn<'_>) -> Result<Generation, Refused> {
    let Turn {
        caller,
        request,
        streams,
        cost,
        budget,
        preempt_after,
        preemptor,
        owns_replicas,
    } = turn;
    let model = request.model.as_str();
    let arrived = Instant::now();
    let deadline = arrived + budget;
    let mut preempt_at = preempt_after.map(|after| arrived + after);
    let queue = admission.queues.filter(|q| q.serves(model));
    let Some(q) = queue else {
        return admission
            .engine
            .start(request, streams)
            .await
            .map_err(Refused::Engine);
    };
    if !q.must_queue(model, caller) {
        match admission.engine.start(request, streams).await {
            Ok(generation) => return Ok(generation),
            Err(e) if no_room(&e) => {}
            Err(e) => return Err(Refused::Engine(e)),
        }
    }
    let spot = q.join(model, caller, cost).map_err(|full| match full {
        NotRun::Full { level, depth } => Refused::QueueFull { level, depth },
        NotRun::Timeout(wait) => Refused::QueueTimeout(wait),
    })?;
    // Until it runs, the owner's replicas are lent to no one else.
    let _owner_waiting = owns_replicas
        .then(|| admission.engine.owner_waiting(model, &caller.tenant_id))
        .flatten();
    loop {
        // Its turn to try; at the preemption point, it preempts (once) and
        // waits on.
        let now = Instant::now();
        match (preempt_at, q.preemptions(model)) {
            (Some(at), Some(registry)) if at <= now => {
                preempt_at = None;
                registry.preempt_for(model, preemptor);
                continue;
            }
            (Some(at), Some(_)) => {
                if spot.turn(at - now).await.is_err() {
                    continue;
                }
            }
            // A turn already due is not taken past the deadline.
            _ if now >= deadline => return Err(Refused::QueueTimeout(budget)),
            _ => spot
                .turn(deadline - now)
                .await
                .map_err(|_| Refused::QueueTimeout(budget))?,
        }
        match admission.engine.start(request, streams).await {
            Ok(generation) => {
                spot.dispatched();
                return Ok(generation);
            }
            Err(e) if no_room(&e) => spot.not_yet(),
            Err(e) => return Err(Refused::Engine(e)),
        }
    }
}
