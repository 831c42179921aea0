//! One replica of one model: the KV pool, the prefix cache and the
//! scheduler, driven one step at a time on a virtual clock in microseconds.
//!
//! [`Replica::step`] builds a batch, costs it with the profile's roofline,
//! attributes its GPU time to the batch's sequences (see
//! [`attribution`](crate::attribution)), advances them, and reports tokens
//! and finished requests as [`Event`]s. The replica never looks at a wall
//! clock: drivers (the virtual run in [`clock`](crate::clock), or the
//! paced task behind [`Simulator`](crate::Simulator)) decide when steps
//! happen. Invariant: the GPU micros attributed to all requests ever
//! submitted equal `busy_micros × gpus`, exactly.

use std::collections::HashMap;
use std::sync::Arc;

use crate::attribution;
use crate::error::EngineError;
use crate::histogram::Histogram;
use crate::kv::KvPool;
use crate::prefix_cache::PrefixCache;
use crate::profile::{ModelProfile, StepCosts};
use crate::scheduler::{Memory, Scheduler, Seq, SeqId, ServiceClass};

/// What a replica needs to know about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqRequest {
    pub class: ServiceClass,
    pub prompt_tokens: u32,
    /// Chained hashes of the prompt's full 16-token blocks.
    pub blocks: Vec<u64>,
    /// Tokens it will generate.
    pub output_tokens: u32,
    /// True when `max_tokens` cut `output_tokens` short.
    pub capped: bool,
    /// Report each token as an [`Event::Token`].
    pub stream: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    Cancelled,
    /// The replica died under it ([`Replica::fail_all`]).
    Failed,
}

/// What a request used, reported when it finishes or is cancelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub id: SeqId,
    pub tenant: u32,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub completion_tokens: u32,
    /// Attributed GPU time, micro-GPU-seconds (preempted time included).
    pub gpu_micros: u64,
    /// The part of `gpu_micros` whose work a preemption threw away.
    pub preempted_micros: u64,
    pub preemptions: u32,
    pub arrived_at: u64,
    pub first_token_at: Option<u64>,
    pub finished_at: u64,
    pub finish: Finish,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Token `index` (0-based) of a streaming request, at virtual time `at`.
    Token {
        id: SeqId,
        index: u32,
        at: u64,
    },
    Finished(Outcome),
}

/// Counters of a replica since it started.
#[derive(Debug, Clone, Default)]
pub struct ReplicaStats {
    pub busy_micros: u64,
    pub idle_micros: u64,
    pub steps: u64,
    pub generation_tokens: u64,
    pub finished: u64,
    pub cancelled: u64,
    /// Requests the replica's death ended.
    pub failed: u64,
    pub rejected: u64,
    /// Attributed and preempted micro-GPU-seconds by tenant index.
    pub tenant_gpu_micros: Vec<u64>,
    pub tenant_preempted_micros: Vec<u64>,
    pub ttft: Histogram,
    pub inter_token: Histogram,
}

#[derive(Debug)]
pub struct Replica {
    id: String,
    model: String,
    gpus: u64,
    costs: StepCosts,
    step_budget: u32,
    max_running: u32,
    max_context: u32,
    mem: Memory,
    sched: Scheduler,
    now: u64,
    next_id: u64,
    tenants: Vec<Arc<str>>,
    tenant_ids: HashMap<Arc<str>, u32>,
    stats: ReplicaStats,
    events: Vec<Event>,
    weights: Vec<u64>,
    shares: Vec<u64>,
    /// Whether admission counts the waiting queue's demand (see `submit`).
    queue_admission: bool,
    /// Prefill tokens waiting ahead at which a request is refused (the
    /// profile's `backlog_steps` × `step_token_budget`; 0: no limit).
    backlog_tokens: u64,
}

impl Replica {
    pub fn new(profile: &ModelProfile, id: impl Into<String>) -> Result<Self, EngineError> {
        profile.validate()?;
        let total = profile.total_blocks();
        let quota = total * u64::from(profile.tenant_cache_quota_percent) / 100;
        Ok(Self {
            id: id.into(),
            model: profile.name.clone(),
            gpus: u64::from(profile.gpus),
            costs: profile.costs(),
            step_budget: profile.step_token_budget,
            max_running: profile.max_running,
            max_context: profile.max_context,
            mem: Memory {
                kv: KvPool::new(total),
                cache: PrefixCache::new(quota),
                version: 0,
            },
            sched: Scheduler::default(),
            now: 0,
            next_id: 0,
            tenants: Vec::new(),
            tenant_ids: HashMap::new(),
            stats: ReplicaStats::default(),
            events: Vec::new(),
            weights: Vec::new(),
            shares: Vec::new(),
            queue_admission: true,
            backlog_tokens: u64::from(profile.backlog_steps) * u64::from(profile.step_token_budget),
        })
    }

    /// Whether admission counts what the waiting queue needs (the default).
    /// Off, the replica queues whatever arrives while the blocks in use are
    /// below the class threshold, as vLLM does; the benchmark uses that to
    /// hold 10,000 requests in flight.
    pub fn set_queue_admission(&mut self, on: bool) {
        self.queue_admission = on;
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    pub fn gpus(&self) -> u64 {
        self.gpus
    }

    /// The virtual time, microseconds since the replica started.
    pub fn now(&self) -> u64 {
        self.now
    }

    pub fn stats(&self) -> &ReplicaStats {
        &self.stats
    }

    pub fn kv(&self) -> &KvPool {
        &self.mem.kv
    }

    pub fn running(&self) -> usize {
        self.sched.running.len()
    }

    pub fn waiting(&self) -> usize {
        self.sched.waiting_len()
    }

    pub fn preemptions(&self) -> u64 {
        self.sched.preemptions
    }

    /// Prompt tokens started, and those served from the prefix cache.
    pub fn prompt_tokens_and_hits(&self) -> (u64, u64) {
        (self.sched.cache_queries, self.sched.cache_hits)
    }

    pub fn tenant_name(&self, tenant: u32) -> &str {
        self.tenants.get(tenant as usize).map_or("", |t| t)
    }

    pub fn tenant_names(&self) -> &[Arc<str>] {
        &self.tenants
    }

    pub fn has_work(&self) -> bool {
        !self.sched.running.is_empty() || self.sched.waiting_len() > 0
    }

    /// Admits a request that arrived at `at` (no later than now), or says
    /// there is no capacity for its class.
    pub fn submit(&mut self, tenant: &str, req: SeqRequest, at: u64) -> Result<SeqId, EngineError> {
        let total = u64::from(req.prompt_tokens) + u64::from(req.output_tokens);
        if total > u64::from(self.max_context) {
            return Err(EngineError::ContextTooLong {
                prompt: req.prompt_tokens.into(),
                output: req.output_tokens.into(),
                limit: self.max_context,
            });
        }
        // Occupancy as it will be once the queue has started: blocks in use
        // plus what the waiting requests need.
        let kv = &self.mem.kv;
        let queued = if self.queue_admission {
            self.sched.waiting_blocks()
        } else {
            0
        };
        let ahead = self.sched.waiting_tokens_ahead_of(req.class);
        if self.queue_admission && self.backlog_tokens > 0 && ahead >= self.backlog_tokens {
            self.stats.rejected += 1;
            return Err(EngineError::NoCapacity {
                model: self.model.clone(),
                class: req.class.as_str(),
                why: crate::error::NoRoom::Backlog {
                    waiting_tokens: ahead,
                },
            });
        }
        if !kv.below(queued, req.class.threshold_percent()) {
            self.stats.rejected += 1;
            return Err(EngineError::NoCapacity {
                model: self.model.clone(),
                class: req.class.as_str(),
                why: crate::error::NoRoom::Full {
                    occupancy_percent: (kv.used() + queued) * 100 / kv.total().max(1),
                },
            });
        }
        let tenant = self.intern(tenant);
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.sched.enqueue(Seq {
            id,
            tenant,
            class: req.class,
            prompt_tokens: req.prompt_tokens,
            output_tokens: req.output_tokens,
            capped: req.capped,
            stream: req.stream,
            blocks: req.blocks,
            arrived_at: at.min(self.now),
            cached_tokens: None,
            generated: 0,
            computed: 0,
            prefill_target: req.prompt_tokens,
            private_blocks: 0,
            shared: Vec::new(),
            first_token_at: None,
            last_token_at: 0,
            gpu_micros: 0,
            since_start_micros: 0,
            preempted_micros: 0,
            preemptions: 0,
            start_order: 0,
            step_tokens: 0,
        });
        Ok(id)
    }

    fn intern(&mut self, tenant: &str) -> u32 {
        if let Some(&t) = self.tenant_ids.get(tenant) {
            return t;
        }
        let t = self.tenants.len() as u32;
        let name: Arc<str> = Arc::from(tenant);
        self.tenants.push(name.clone());
        self.tenant_ids.insert(name, t);
        self.stats.tenant_gpu_micros.push(0);
        self.stats.tenant_preempted_micros.push(0);
        t
    }

    /// Cancels a request wherever it is; its GPU time so far stays its own.
    pub fn cancel(&mut self, id: SeqId) -> bool {
        let Some(mut s) = self.sched.remove(id) else {
            return false;
        };
        self.mem.release(&mut s);
        self.stats.cancelled += 1;
        self.finish(s, Finish::Cancelled);
        true
    }

    /// The replica died: every request on it, running or waiting, ends
    /// with [`Finish::Failed`] and what it used until then (the GPU time
    /// was spent, then lost with the replica: it stays the request's).
    /// Returns how many requests it failed.
    pub fn fail_all(&mut self) -> usize {
        let ids = self.sched.ids();
        for &id in &ids {
            if let Some(mut s) = self.sched.remove(id) {
                self.mem.release(&mut s);
                self.stats.failed += 1;
                self.finish(s, Finish::Failed);
            }
        }
        ids.len()
    }

    /// Lets virtual time pass with nothing to do; it counts as idle.
    pub fn advance_idle(&mut self, to: u64) {
        if to > self.now {
            debug_assert!(!self.has_work());
            self.stats.idle_micros += to - self.now;
            self.now = to;
        }
    }

    /// Takes the events since the last call.
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, Event> {
        self.events.drain(..)
    }

    /// Runs one step; returns its duration in µs, or None if nothing could run.
    pub fn step(&mut self) -> Option<u64> {
        self.sched
            .schedule(&mut self.mem, self.step_budget, self.max_running);
        self.weights.clear();
        let (mut tokens, mut kv_read) = (0u64, 0u64);
        for s in &self.sched.running {
            if s.step_tokens > 0 {
                let t = u64::from(s.step_tokens);
                let kv = u64::from(s.computed) + t;
                tokens += t;
                kv_read += kv;
                self.weights.push(self.costs.work_ps(t, kv));
            }
        }
        if self.weights.is_empty() {
            return None;
        }
        let start = self.now;
        let duration = self.costs.step_micros(tokens, kv_read);
        self.now += duration;
        self.stats.busy_micros += duration;
        self.stats.steps += 1;
        self.shares.resize(self.weights.len(), 0);
        attribution::split(duration * self.gpus, &self.weights, &mut self.shares);

        let mut running = std::mem::take(&mut self.sched.running);
        let mut k = 0;
        let mut consecutive = 0u64;
        running.retain_mut(|s| {
            if s.step_tokens == 0 {
                return true;
            }
            let share = self.shares[k];
            k += 1;
            s.gpu_micros += share;
            s.since_start_micros += share;
            self.stats.tenant_gpu_micros[s.tenant as usize] += share;
            let was_prefill = s.in_prefill();
            s.computed += s.step_tokens;
            s.step_tokens = 0;
            if s.in_prefill() {
                return true;
            }
            if was_prefill {
                self.mem.publish(s);
            }
            if s.generated < s.output_tokens {
                if s.first_token_at.is_none() {
                    s.first_token_at = Some(self.now);
                    self.stats.ttft.observe_micros(self.now - s.arrived_at, 1);
                } else if s.last_token_at == start {
                    consecutive += 1;
                } else {
                    self.stats
                        .inter_token
                        .observe_micros(self.now - s.last_token_at, 1);
                }
                if s.stream {
                    self.events.push(Event::Token {
                        id: s.id,
                        index: s.generated,
                        at: self.now,
                    });
                }
                s.generated += 1;
                s.last_token_at = self.now;
                self.stats.generation_tokens += 1;
            }
            if s.generated < s.output_tokens {
                return true;
            }
            self.mem.release(s);
            let finish = if s.capped {
                Finish::Length
            } else {
                Finish::Stop
            };
            self.events
                .push(Event::Finished(outcome(s, self.now, finish)));
            self.stats.finished += 1;
            self.stats.tenant_preempted_micros[s.tenant as usize] += s.preempted_micros;
            false
        });
        self.sched.running = running;
        self.stats.inter_token.observe_micros(duration, consecutive);
        Some(duration)
    }

    fn finish(&mut self, s: Seq, finish: Finish) {
        self.stats.tenant_preempted_micros[s.tenant as usize] += s.preempted_micros;
        self.events
            .push(Event::Finished(outcome(&s, self.now, finish)));
    }
}

fn outcome(s: &Seq, now: u64, finish: Finish) -> Outcome {
    Outcome {
        id: s.id,
        tenant: s.tenant,
        prompt_tokens: s.prompt_tokens,
        cached_tokens: s.cached_tokens.unwrap_or(0),
        completion_tokens: s.generated,
        gpu_micros: s.gpu_micros,
        preempted_micros: s.preempted_micros,
        preemptions: s.preemptions,
        arrived_at: s.arrived_at,
        first_token_at: s.first_token_at,
        finished_at: now,
        finish,
    }
}
