//! One replica as a tokio task: the [`Command`]s it takes, its step loop
//! paced to the wall clock by a [`Pacer`], the delivery of tokens and
//! outcomes to each request's channel, and the snapshot it publishes after
//! every step (the router reads it). A `Fail` command fails every request
//! on the replica with what it used and ends the task: the replica died.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use crate::clock::Pacer;
use crate::error::EngineError;
use crate::metrics::ReplicaSnapshot;
use crate::replica::{Event, Replica, ReplicaStats, SeqRequest};
use crate::scheduler::SeqId;

/// What a replica task is told.
pub(crate) enum Command {
    Submit {
        tenant: String,
        req: SeqRequest,
        reply: oneshot::Sender<Result<SeqId, EngineError>>,
        updates: mpsc::UnboundedSender<Event>,
    },
    /// The client went away and nobody waits for the outcome.
    Cancel(SeqId),
    /// Cancel, but still deliver the outcome (what the request used so far).
    Stop(SeqId),
    /// The replica dies: fail every request on it and stop.
    Fail,
    /// Its busy and idle GPU time so far, idle time brought up to the wall
    /// clock first (a replica with nothing to do accrues idle time lazily);
    /// `owner` is the tenant the replica is dedicated to, whose own work is
    /// not lent.
    Account {
        owner: Option<String>,
        reply: oneshot::Sender<BusyIdle>,
    },
}

/// A replica's GPU time since its task started, in micro-GPU-seconds
/// (time × the replica's GPUs). `busy` is what it attributed to requests;
/// `lent`, the part of it attributed to other tenants' requests on a
/// replica dedicated to an owner (0 on a shared replica) — every attempt's,
/// preempted ones included, as the replica itself counted it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BusyIdle {
    pub busy_gpu_micros: u64,
    pub idle_gpu_micros: u64,
    pub lent_gpu_micros: u64,
}

impl BusyIdle {
    fn of(replica: &Replica, owner: Option<&str>) -> Self {
        Self::from_stats(
            replica.stats(),
            replica.tenant_names(),
            replica.gpus(),
            owner,
        )
    }

    /// From a replica's counters and its tenants (by index), `gpus` each.
    pub(crate) fn from_stats(
        s: &ReplicaStats,
        tenants: &[Arc<str>],
        gpus: u64,
        owner: Option<&str>,
    ) -> Self {
        let lent_gpu_micros = match owner {
            None => 0,
            Some(owner) => s
                .tenant_gpu_micros
                .iter()
                .zip(tenants)
                .filter(|(_, t)| &***t != owner)
                .map(|(m, _)| m)
                .sum(),
        };
        Self {
            busy_gpu_micros: s.busy_micros * gpus,
            idle_gpu_micros: s.idle_micros * gpus,
            lent_gpu_micros,
        }
    }
}

/// The replica task: takes commands, runs steps paced to the wall clock,
/// hands tokens and outcomes to their requests.
pub(crate) async fn drive(
    mut replica: Replica,
    mut rx: mpsc::UnboundedReceiver<Command>,
    snapshot: Arc<Mutex<ReplicaSnapshot>>,
    published: Arc<AtomicU64>,
    speedup: u32,
) {
    let pacer = Pacer::new(speedup);
    let mut subscribers: HashMap<SeqId, mpsc::UnboundedSender<Event>> = HashMap::new();
    let publish = |replica: &Replica| {
        if let Ok(mut s) = snapshot.lock() {
            *s = ReplicaSnapshot::of(replica);
        }
        published.fetch_add(1, Ordering::AcqRel);
    };
    loop {
        if !replica.has_work() {
            publish(&replica);
            let Some(cmd) = rx.recv().await else {
                return;
            };
            if let Some(now) = pacer.virtual_now() {
                replica.advance_idle(now);
            }
            if handle(&mut replica, &mut subscribers, cmd).is_break() {
                publish(&replica);
                return;
            }
        }
        while let Ok(cmd) = rx.try_recv() {
            if handle(&mut replica, &mut subscribers, cmd).is_break() {
                publish(&replica);
                return;
            }
        }
        if replica.step().is_none() {
            // Nothing can run until something changes.
            publish(&replica);
            let Some(cmd) = rx.recv().await else {
                return;
            };
            if handle(&mut replica, &mut subscribers, cmd).is_break() {
                publish(&replica);
                return;
            }
            continue;
        }
        pacer.wait_until(replica.now()).await;
        if speedup == 0 {
            tokio::task::yield_now().await;
        }
        deliver(&mut replica, &mut subscribers);
        publish(&replica);
    }
}

/// Carries out one command; `Break` when the replica died.
fn handle(
    replica: &mut Replica,
    subscribers: &mut HashMap<SeqId, mpsc::UnboundedSender<Event>>,
    cmd: Command,
) -> std::ops::ControlFlow<()> {
    match cmd {
        Command::Submit {
            tenant,
            req,
            reply,
            updates,
        } => {
            let now = replica.now();
            let result = replica.submit(&tenant, req, now);
            if let Ok(id) = result {
                subscribers.insert(id, updates);
            }
            if reply.send(result.clone()).is_err() {
                if let Ok(id) = result {
                    subscribers.remove(&id);
                    replica.cancel(id);
                }
            }
        }
        Command::Cancel(id) => {
            subscribers.remove(&id);
            replica.cancel(id);
        }
        Command::Stop(id) => {
            replica.cancel(id);
            deliver(replica, subscribers);
        }
        Command::Fail => {
            replica.fail_all();
            deliver(replica, subscribers);
            return std::ops::ControlFlow::Break(());
        }
        Command::Account { owner, reply } => {
            let _ = reply.send(BusyIdle::of(replica, owner.as_deref()));
        }
    }
    std::ops::ControlFlow::Continue(())
}

/// Hands the replica's pending events to their requests, and cancels the
/// requests whose receiver is gone.
fn deliver(replica: &mut Replica, subscribers: &mut HashMap<SeqId, mpsc::UnboundedSender<Event>>) {
    let mut gone = Vec::new();
    for event in replica.drain_events() {
        let id = match &event {
            Event::Token { id, .. } => *id,
            Event::Finished(o) => o.id,
        };
        let finished = matches!(event, Event::Finished(_));
        let delivered = subscribers
            .get(&id)
            .is_some_and(|tx| tx.send(event).is_ok());
        if finished {
            subscribers.remove(&id);
        } else if !delivered {
            gone.push(id);
        }
    }
    for id in gone {
        subscribers.remove(&id);
        replica.cancel(id);
        replica.drain_events().for_each(drop);
    }
}
