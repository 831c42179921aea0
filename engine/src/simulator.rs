//! The in-process engine the gateway and the HTTP server call: each model
//! is a pool of `replicas` (its profile says how many), each replica a
//! task owning a [`Replica`] paced by a [`Pacer`]. A call tokenizes the
//! prompt, plans the deterministic answer, picks a replica and submits it
//! there, then awaits its tokens and outcome. Dropping a [`Generation`]
//! before it finished cancels the request on its replica (the client went
//! away); the GPU time it used stays attributed to it.
//!
//! Where a request goes within its model's pool (power of two choices on
//! KV headroom, dedicated replicas) is [`crate::replica_pool`]'s; when no
//! replica can admit it the caller gets [`EngineError::NoCapacity`] (and
//! queues, or answers 503). Each replica runs as a task of its own
//! ([`crate::replica_task`]).
//!
//! **A replica that dies** ([`Simulator::fail_replica`]) leaves the pool at
//! once; every request it was running or holding ends with
//! [`EngineError::ReplicaFailed`], carrying what the request used until then
//! (it is billed: the GPU time was spent). Nothing is regenerated
//! silently: a client that wants an answer retries.

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, oneshot};

use crate::attribution::to_gpu_seconds;
pub use crate::completion::{Completion, CompletionRequest, Piece};
use crate::error::{EngineError, NoRoom};
use crate::metrics::ReplicaSnapshot;
use crate::profile::ModelProfile;
use crate::replica::{Event, Finish, Outcome, Replica, SeqRequest};
pub use crate::replica_pool::OwnerWaiting;
use crate::replica_pool::{ModelPool, ReplicaHandle, Stay};
pub use crate::replica_task::BusyIdle;
use crate::replica_task::{drive, Command};
use crate::scheduler::SeqId;
use crate::tokenizer;

/// Words that are one cl100k token each when preceded by a space, so the
/// completion's token count is exactly the number of words generated.
const WORDS: &[&str] = &[
    " the", " model", " answer", " is", " a", " token", " of", " GPU", " time", " and", " we",
    " meter", " each", " request", " once", " cost", " per", " hour", " off", " peak",
];

/// The simulated engine. `speedup` divides real waiting time (1 = real
/// time; 0 = answer at once), never the reported figures.
pub struct Simulator {
    profiles: Vec<ModelProfile>,
    pools: Vec<ModelPool>,
    speedup: u32,
    /// Random, new with every simulator (see [`GpuTimeReadings`]).
    instance: String,
    /// When it was built (Unix ms): its replicas' counters start here.
    started_at_ms: i64,
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
        let pools = profiles.iter().map(ModelPool::new).collect();
        Self {
            profiles,
            pools,
            speedup,
            instance: format!("{:032x}", rand::random::<u128>()),
            started_at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        }
    }

    /// This simulator's instance id: its replicas' counters start at zero
    /// with it.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// When this simulator started (Unix ms), its replicas' counters at zero.
    pub fn started_at_ms(&self) -> i64 {
        self.started_at_ms
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

    /// The current figures of every live replica, for `/metrics`.
    pub fn snapshots(&self) -> Vec<ReplicaSnapshot> {
        self.pools
            .iter()
            .flat_map(|p| &p.replicas)
            .filter(|h| !h.dead.load(Ordering::Acquire))
            .filter_map(|r| r.snapshot.lock().ok().map(|s| s.clone()))
            .collect()
    }

    /// Every replica's GPU time since it started, busy and idle, for the
    /// replica reports that bill idle and dedicated capacity. Starts the
    /// replicas not started yet (their idle time counts from then on); a
    /// replica that died gives its last figures, which no longer change.
    pub async fn gpu_time(&self) -> Vec<ReplicaGpuTime> {
        let mut out = Vec::new();
        for pool in &self.pools {
            for handle in &pool.replicas {
                let time = if handle.dead.load(Ordering::Acquire) {
                    handle.snapshot.lock().ok().map(|s| {
                        BusyIdle::from_stats(&s.stats, &s.tenants, s.gpus, handle.owner.as_deref())
                    })
                } else {
                    let (reply, answer) = oneshot::channel();
                    match self.sender(pool, handle) {
                        Ok(tx)
                            if tx
                                .send(Command::Account {
                                    owner: handle.owner.clone(),
                                    reply,
                                })
                                .is_ok() =>
                        {
                            answer.await.ok()
                        }
                        _ => None,
                    }
                };
                // A replica that died between the check and the question
                // answers next time, from its last snapshot.
                if let Some(time) = time {
                    out.push(ReplicaGpuTime {
                        replica_id: handle.replica_id.clone(),
                        model: pool.profile.name.clone(),
                        gpus: pool.profile.gpus,
                        dedicated_to: handle.owner.clone(),
                        dead: handle.dead.load(Ordering::Acquire),
                        time,
                    });
                }
            }
        }
        out
    }

    /// The ids of `model`'s live replicas.
    pub fn replica_ids(&self, model: &str) -> Vec<String> {
        self.pools
            .iter()
            .filter(|p| p.profile.name == model)
            .flat_map(|p| &p.replicas)
            .filter(|h| !h.dead.load(Ordering::Acquire))
            .map(|h| h.replica_id.clone())
            .collect()
    }

    /// Replica `replica_id` dies: it leaves its pool, and every request it
    /// was running or holding ends with [`EngineError::ReplicaFailed`] and
    /// what it used. Returns false if no live replica has that id.
    pub fn fail_replica(&self, replica_id: &str) -> bool {
        for pool in &self.pools {
            let Some((_, h)) = pool.handle(replica_id) else {
                continue;
            };
            if h.dead.swap(true, Ordering::AcqRel) {
                return false;
            }
            pool.remove(replica_id);
            if let Some(Ok(tx)) = h.tx.get() {
                let _ = tx.send(Command::Fail);
            }
            tracing::warn!(replica = replica_id, "replica failed: it left its pool");
            return true;
        }
        false
    }

    fn sender(
        &self,
        pool: &ModelPool,
        handle: &ReplicaHandle,
    ) -> Result<mpsc::UnboundedSender<Command>, EngineError> {
        handle
            .tx
            .get_or_init(|| {
                let replica = Replica::new(&pool.profile, handle.replica_id.clone())?;
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(drive(
                    replica,
                    rx,
                    handle.snapshot.clone(),
                    handle.published.clone(),
                    self.speedup,
                ));
                Ok(tx)
            })
            .clone()
    }

    /// Admits a request on one of its model's replicas and returns its
    /// running generation, or [`EngineError::NoCapacity`] when no replica
    /// has room for its class.
    pub async fn start(
        &self,
        req: &CompletionRequest,
        stream: bool,
    ) -> Result<Generation, EngineError> {
        let pool = self
            .pools
            .iter()
            .find(|p| p.profile.name == req.model)
            .ok_or_else(|| EngineError::UnknownModel(req.model.clone()))?;
        let profile = &pool.profile;
        let tokens = tokenizer::encode(&req.prompt);
        let prompt_tokens = tokens.len() as u64;
        let mut rng = answer_rng(req.seed, prompt_tokens);
        let natural: u32 = rng.random_range(NATURAL_OUTPUT);
        let output = natural.min(req.max_tokens.unwrap_or(u32::MAX));
        let room = u64::from(profile.max_context).saturating_sub(prompt_tokens);
        if u64::from(output) > room {
            return Err(EngineError::ContextTooLong {
                prompt: prompt_tokens,
                output: output.into(),
                limit: profile.max_context,
            });
        }
        let words = (0..output)
            .map(|_| WORDS[rng.random_range(0..WORDS.len())])
            .collect();
        let seq = SeqRequest {
            class: req.class,
            prompt_tokens: prompt_tokens as u32,
            blocks: tokenizer::block_hashes(&profile.version, &tokens),
            output_tokens: output,
            capped: output < natural,
            stream,
        };
        let kv = profile.kv_bytes(prompt_tokens + u64::from(output));
        // Each refusal marks that replica full, so this ends within the
        // pool's size.
        let mut held_for_floors = None;
        for _ in 0..pool.replicas.len() {
            let i = match pool.route(&req.tenant_id, kv, req.class) {
                Ok(i) => i,
                Err(fleet::pool::Refused::Full) => break,
                Err(fleet::pool::Refused::HeldForFloors { held_percent }) => {
                    held_for_floors = Some(held_percent);
                    break;
                }
            };
            let handle = &pool.replicas[i];
            let tx = self.sender(pool, handle)?;
            let (reply, admitted) = oneshot::channel();
            let (updates, rx) = mpsc::unbounded_channel();
            let sent = tx.send(Command::Submit {
                tenant: req.tenant_id.clone(),
                req: seq.clone(),
                reply,
                updates,
            });
            let answer = match sent {
                Ok(()) => admitted.await.ok(),
                Err(_) => None,
            };
            match answer {
                Some(Ok(id)) => {
                    if handle.dead.load(Ordering::Acquire) {
                        // It died while taking the request, maybe before
                        // `fail_replica` could reach it: fail it (again).
                        let _ = tx.send(Command::Fail);
                    }
                    return Ok(Generation {
                        _stay: pool.stay(i, &req.tenant_id, kv),
                        model_version: profile.version.clone(),
                        replica_id: handle.replica_id.clone(),
                        dedicated_to: handle.owner.clone(),
                        words,
                        rx,
                        cancel: Some((tx, id)),
                        model: req.model.clone(),
                    });
                }
                Some(Err(EngineError::NoCapacity { .. })) => pool.refused(i, &req.tenant_id, kv),
                Some(Err(e)) => {
                    pool.forget(i, &req.tenant_id, kv);
                    return Err(e);
                }
                // The replica died before it took the request: nothing ran.
                None if handle.dead.load(Ordering::Acquire) => {
                    pool.forget(i, &req.tenant_id, kv);
                }
                None => {
                    pool.forget(i, &req.tenant_id, kv);
                    return Err(EngineError::Stopped(req.model.clone()));
                }
            }
        }
        Err(EngineError::NoCapacity {
            model: req.model.clone(),
            class: req.class.as_str(),
            why: match held_for_floors {
                Some(held_percent) => NoRoom::HeldForFloors { held_percent },
                None => NoRoom::Full {
                    occupancy_percent: pool.least_occupancy_percent(),
                },
            },
        })
    }

    /// The tenants' reserved floors (basis points of each model pool's
    /// KV; a tenant not listed has none), from the tenant config.
    pub fn set_floors(&self, floors: &std::collections::HashMap<String, u32>) {
        for pool in &self.pools {
            pool.set_floors(floors.clone());
        }
    }

    /// `tenant`'s request of `model` waits for room: while the guard is
    /// held, no other tenant's request starts on `tenant`'s dedicated
    /// replicas of the model. `None` when it has none.
    pub fn owner_waiting(&self, model: &str, tenant: &str) -> Option<OwnerWaiting> {
        self.pools
            .iter()
            .find(|p| p.profile.name == model)?
            .owner_waiting(tenant)
    }

    /// Answers a request once it has finished.
    pub async fn complete(&self, req: &CompletionRequest) -> Result<Completion, EngineError> {
        self.start(req, false).await?.finish().await
    }
}

/// How long a simulated answer is before any `max_tokens` cap.
const NATURAL_OUTPUT: std::ops::RangeInclusive<u32> = 16..=600;

/// The generator of one answer: the same seed and prompt length, the
/// same answer.
fn answer_rng(seed: u64, prompt_tokens: u64) -> StdRng {
    StdRng::seed_from_u64(seed ^ prompt_tokens.rotate_left(17))
}

/// The tokens the simulator generates for a prompt of `prompt_tokens`
/// with `seed` when `max_tokens` does not cut it short (16 to 600), so a
/// client (a test, a drill) can ask for an answer of a known length.
pub fn natural_output_tokens(seed: u64, prompt_tokens: u64) -> u32 {
    answer_rng(seed, prompt_tokens).random_range(NATURAL_OUTPUT)
}

/// One replica's GPU time so far ([`Simulator::gpu_time`]); also what the
/// `engine` binary serves at [`GPU_TIME_PATH`] (integers: exact).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplicaGpuTime {
    pub replica_id: String,
    pub model: String,
    pub gpus: u32,
    /// The owner of a dedicated replica.
    pub dedicated_to: Option<String>,
    /// It died: these are its final figures.
    pub dead: bool,
    pub time: BusyIdle,
}

/// Where the `engine` binary serves [`GpuTimeReadings`].
pub const GPU_TIME_PATH: &str = "/v1/replicas/gpu-time";

/// Every replica's GPU time since its engine started, as the `engine`
/// binary serves it for the gateway that reports its replicas. `instance`
/// is new at every start of the engine, at `started_at_ms` (Unix ms), when
/// every counter was zero: no difference is taken across two instances.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuTimeReadings {
    pub instance: String,
    pub started_at_ms: i64,
    pub replicas: Vec<ReplicaGpuTime>,
}

/// A request running on a replica. Dropping it unfinished cancels it.
pub struct Generation {
    _stay: Stay,
    model_version: String,
    replica_id: String,
    dedicated_to: Option<String>,
    model: String,
    words: Vec<&'static str>,
    rx: mpsc::UnboundedReceiver<Event>,
    cancel: Option<(mpsc::UnboundedSender<Command>, SeqId)>,
}

impl Generation {
    /// The replica running it.
    pub fn replica_id(&self) -> &str {
        &self.replica_id
    }

    /// The tenant the replica running it is dedicated to, if any.
    pub fn dedicated_to(&self) -> Option<&str> {
        self.dedicated_to.as_deref()
    }

    /// The next token (streaming generations only) or the final completion.
    pub async fn next(&mut self) -> Result<Piece, EngineError> {
        match self.rx.recv().await {
            Some(Event::Token { index, .. }) => Ok(Piece::Token(Cow::Borrowed(
                self.words.get(index as usize).copied().unwrap_or(""),
            ))),
            Some(Event::Finished(o)) => {
                self.cancel = None;
                let used = self.completion(&o);
                if o.finish == Finish::Failed {
                    return Err(EngineError::ReplicaFailed {
                        replica: self.replica_id.clone(),
                        used: Box::new(used),
                    });
                }
                Ok(Piece::Done(used))
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
            length_capped: o.finish == Finish::Length,
            ttft: Duration::from_micros(first.saturating_sub(o.arrived_at)),
            total: Duration::from_micros(o.finished_at.saturating_sub(o.arrived_at)),
            gpu_seconds: to_gpu_seconds(o.gpu_micros),
            preempted_gpu_seconds: to_gpu_seconds(o.preempted_micros),
            preemptions: o.preemptions,
            replica_id: self.replica_id.clone(),
            dedicated_to: self.dedicated_to.clone(),
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
