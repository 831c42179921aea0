//! The in-process engine the gateway and the HTTP server call: one replica
//! task per model, each owning a [`Replica`] paced by a [`Pacer`]. A call
//! tokenizes the prompt, plans the deterministic answer, submits it to the
//! model's replica and awaits its tokens and outcome. Dropping a
//! [`Generation`] before it finished cancels the request on the replica
//! (the client went away); the GPU time it used stays attributed to it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rust_decimal::Decimal;
use tokio::sync::{mpsc, oneshot};

use crate::attribution::to_gpu_seconds;
use crate::clock::Pacer;
use crate::error::EngineError;
use crate::metrics::ReplicaSnapshot;
use crate::profile::ModelProfile;
use crate::replica::{Event, Outcome, Replica, SeqRequest};
use crate::scheduler::{SeqId, ServiceClass};
use crate::tokenizer;

/// Words that are one cl100k token each when preceded by a space, so the
/// completion's token count is exactly the number of words generated.
const WORDS: &[&str] = &[
    " the", " model", " answer", " is", " a", " token", " of", " GPU", " time", " and", " we",
    " meter", " each", " request", " once", " cost", " per", " hour", " off", " peak",
];

/// What the engine needs to know about a request. No price, no plan: the
/// tenant only keys the prefix cache, the class only gates admission.
#[derive(Debug, Clone, Default)]
pub struct CompletionRequest {
    pub model: String,
    /// The prompt as the engine sees it (the chat messages, flattened).
    pub prompt: String,
    pub max_tokens: Option<u32>,
    /// Seeds the generated text: same seed and prompt, same answer.
    pub seed: u64,
    /// Whose prefix-cache entries this request may use and fill.
    pub tenant_id: String,
    pub class: ServiceClass,
    /// The client's request as sent, passed through to an HTTP upstream
    /// (the simulator reads only `prompt`).
    pub body: Option<serde_json::Value>,
}

/// What a finished request used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub model_version: String,
    pub text: String,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// True when `max_tokens` cut the answer short.
    pub length_capped: bool,
    /// Simulated time to first token and total time, queueing included.
    pub ttft: Duration,
    pub total: Duration,
    /// GPU time attributed to the request (its share of every step it was in).
    pub gpu_seconds: Decimal,
    /// The part of `gpu_seconds` thrown away by preemptions.
    pub preempted_gpu_seconds: Decimal,
    pub replica_id: String,
}

/// What a running generation reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Token(Cow<'static, str>),
    Done(Completion),
}

enum Command {
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
}

struct ReplicaHandle {
    profile: ModelProfile,
    replica_id: String,
    tx: OnceLock<Result<mpsc::UnboundedSender<Command>, EngineError>>,
    snapshot: Arc<Mutex<ReplicaSnapshot>>,
}

/// The simulated engine. `speedup` divides real waiting time (1 = real
/// time; 0 = answer at once), never the reported figures.
pub struct Simulator {
    profiles: Vec<ModelProfile>,
    replicas: Vec<ReplicaHandle>,
    speedup: u32,
}

impl std::fmt::Debug for Simulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulator")
            .field("models", &self.profiles.len())
            .field("speedup", &self.speedup)
            .finish()
    }
}

impl Simulator {
    /// An engine serving `profiles`; replica tasks start on first use.
    pub fn new(profiles: Vec<ModelProfile>, speedup: u32) -> Self {
        tokenizer::warm_up();
        let replicas = profiles
            .iter()
            .map(|p| ReplicaHandle {
                profile: p.clone(),
                replica_id: format!("{}-r0", p.name),
                tx: OnceLock::new(),
                snapshot: Arc::new(Mutex::new(ReplicaSnapshot {
                    model: p.name.clone(),
                    replica_id: format!("{}-r0", p.name),
                    gpus: u64::from(p.gpus),
                    ..ReplicaSnapshot::default()
                })),
            })
            .collect();
        Self {
            profiles,
            replicas,
            speedup,
        }
    }

    /// Like [`Simulator::new`], but rejects invalid profiles up front.
    pub fn try_new(profiles: Vec<ModelProfile>, speedup: u32) -> Result<Self, EngineError> {
        ModelProfile::validate_all(&profiles)?;
        Ok(Self::new(profiles, speedup))
    }

    pub fn models(&self) -> &[ModelProfile] {
        &self.profiles
    }

    pub fn profile(&self, model: &str) -> Option<&ModelProfile> {
        self.profiles.iter().find(|p| p.name == model)
    }

    /// The current figures of every replica, for `/metrics`.
    pub fn snapshots(&self) -> Vec<ReplicaSnapshot> {
        self.replicas
            .iter()
            .filter_map(|r| r.snapshot.lock().ok().map(|s| s.clone()))
            .collect()
    }

    fn sender(
        &self,
        handle: &ReplicaHandle,
    ) -> Result<mpsc::UnboundedSender<Command>, EngineError> {
        handle
            .tx
            .get_or_init(|| {
                let replica = Replica::new(&handle.profile, handle.replica_id.clone())?;
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(drive(replica, rx, handle.snapshot.clone(), self.speedup));
                Ok(tx)
            })
            .clone()
    }

    /// Admits a request and returns its running generation, or
    /// [`EngineError::NoCapacity`] when the replica is too full for its class.
    pub async fn start(
        &self,
        req: &CompletionRequest,
        stream: bool,
    ) -> Result<Generation, EngineError> {
        let handle = self
            .replicas
            .iter()
            .find(|r| r.profile.name == req.model)
            .ok_or_else(|| EngineError::UnknownModel(req.model.clone()))?;
        let tokens = tokenizer::encode(&req.prompt);
        let prompt_tokens = tokens.len() as u64;
        let mut rng = StdRng::seed_from_u64(req.seed ^ prompt_tokens.rotate_left(17));
        let natural: u32 = rng.random_range(16..=600);
        let output = natural.min(req.max_tokens.unwrap_or(u32::MAX));
        let room = u64::from(handle.profile.max_context).saturating_sub(prompt_tokens);
        if u64::from(output) > room {
            return Err(EngineError::ContextTooLong {
                prompt: prompt_tokens,
                output: output.into(),
                limit: handle.profile.max_context,
            });
        }
        let words = (0..output)
            .map(|_| WORDS[rng.random_range(0..WORDS.len())])
            .collect();
        let seq = SeqRequest {
            class: req.class,
            prompt_tokens: prompt_tokens as u32,
            blocks: tokenizer::block_hashes(&handle.profile.version, &tokens),
            output_tokens: output,
            capped: output < natural,
            stream,
        };
        let tx = self.sender(handle)?;
        let stopped = || EngineError::Stopped(req.model.clone());
        let (reply, admitted) = oneshot::channel();
        let (updates, rx) = mpsc::unbounded_channel();
        tx.send(Command::Submit {
            tenant: req.tenant_id.clone(),
            req: seq,
            reply,
            updates,
        })
        .map_err(|_| stopped())?;
        let id = admitted.await.map_err(|_| stopped())??;
        Ok(Generation {
            model_version: handle.profile.version.clone(),
            replica_id: handle.replica_id.clone(),
            words,
            rx,
            cancel: Some((tx, id)),
            model: req.model.clone(),
        })
    }

    /// Answers a request once it has finished.
    pub async fn complete(&self, req: &CompletionRequest) -> Result<Completion, EngineError> {
        self.start(req, false).await?.finish().await
    }
}

/// A request running on a replica. Dropping it unfinished cancels it.
pub struct Generation {
    model_version: String,
    replica_id: String,
    model: String,
    words: Vec<&'static str>,
    rx: mpsc::UnboundedReceiver<Event>,
    cancel: Option<(mpsc::UnboundedSender<Command>, SeqId)>,
}

impl Generation {
    /// The next token (streaming generations only) or the final completion.
    pub async fn next(&mut self) -> Result<Piece, EngineError> {
        match self.rx.recv().await {
            Some(Event::Token { index, .. }) => Ok(Piece::Token(Cow::Borrowed(
                self.words.get(index as usize).copied().unwrap_or(""),
            ))),
            Some(Event::Finished(o)) => {
                self.cancel = None;
                Ok(Piece::Done(self.completion(&o)))
            }
            None => Err(EngineError::Stopped(self.model.clone())),
        }
    }

    /// Waits for the completion, skipping tokens.
    pub async fn finish(mut self) -> Result<Completion, EngineError> {
        loop {
            if let Piece::Done(c) = self.next().await? {
                return Ok(c);
            }
        }
    }

    /// Cancels the request (its KV is freed at once) and returns what it
    /// used until then: the tokens the replica produced and the GPU time
    /// attributed to it, exactly as for a finished request. If it finished
    /// before the cancel arrived, that completion is returned.
    pub async fn cancel(mut self) -> Result<Completion, EngineError> {
        if let Some((tx, id)) = self.cancel.take() {
            tx.send(Command::Stop(id))
                .map_err(|_| EngineError::Stopped(self.model.clone()))?;
        }
        self.finish().await
    }

    fn completion(&self, o: &Outcome) -> Completion {
        let n = (o.completion_tokens as usize).min(self.words.len());
        let first = o.first_token_at.unwrap_or(o.finished_at);
        Completion {
            model_version: self.model_version.clone(),
            text: self.words[..n].concat(),
            prompt_tokens: o.prompt_tokens.into(),
            cached_tokens: o.cached_tokens.into(),
            completion_tokens: o.completion_tokens.into(),
            length_capped: o.finish == crate::replica::Finish::Length,
            ttft: Duration::from_micros(first.saturating_sub(o.arrived_at)),
            total: Duration::from_micros(o.finished_at.saturating_sub(o.arrived_at)),
            gpu_seconds: to_gpu_seconds(o.gpu_micros),
            preempted_gpu_seconds: to_gpu_seconds(o.preempted_micros),
            replica_id: self.replica_id.clone(),
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if let Some((tx, id)) = self.cancel.take() {
            let _ = tx.send(Command::Cancel(id));
        }
    }
}

/// The replica task: takes commands, runs steps paced to the wall clock,
/// hands tokens and outcomes to their requests.
async fn drive(
    mut replica: Replica,
    mut rx: mpsc::UnboundedReceiver<Command>,
    snapshot: Arc<Mutex<ReplicaSnapshot>>,
    speedup: u32,
) {
    let pacer = Pacer::new(speedup);
    let mut subscribers: HashMap<SeqId, mpsc::UnboundedSender<Event>> = HashMap::new();
    loop {
        if !replica.has_work() {
            publish(&replica, &snapshot);
            let Some(cmd) = rx.recv().await else {
                return;
            };
            if let Some(now) = pacer.virtual_now() {
                replica.advance_idle(now);
            }
            handle(&mut replica, &mut subscribers, cmd);
        }
        while let Ok(cmd) = rx.try_recv() {
            handle(&mut replica, &mut subscribers, cmd);
        }
        if replica.step().is_none() {
            // Nothing can run until something changes.
            publish(&replica, &snapshot);
            let Some(cmd) = rx.recv().await else {
                return;
            };
            handle(&mut replica, &mut subscribers, cmd);
            continue;
        }
        pacer.wait_until(replica.now()).await;
        if speedup == 0 {
            tokio::task::yield_now().await;
        }
        deliver(&mut replica, &mut subscribers);
        publish(&replica, &snapshot);
    }
}

fn handle(
    replica: &mut Replica,
    subscribers: &mut HashMap<SeqId, mpsc::UnboundedSender<Event>>,
    cmd: Command,
) {
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
    }
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

fn publish(replica: &Replica, snapshot: &Mutex<ReplicaSnapshot>) {
    if let Ok(mut s) = snapshot.lock() {
        *s = ReplicaSnapshot::of(replica);
    }
}
