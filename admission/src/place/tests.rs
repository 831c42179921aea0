//! [`place`] with no process and no HTTP: the simulator in process, the
//! limits local, the fair queue and preemption as the gateway runs them —
//! on tokio's paused clock, so every wait, timeout and preemption point
//! happens at its exact virtual instant, the same way every run. (The
//! queue's order by priority and weight is tested on the queue itself,
//! `admission_queue/tests.rs`.)
//!
//! One tiny model, one replica of 2,048 KV tokens: a request of 990 prompt
//! tokens and 16 of output holds 49% of it, so two running hold more than
//! the highest class threshold (92%); each step takes 0.5 s, so a request
//! left running (2 steps of prefill, 16 of output) outlasts every test.
//! The replica answers a request between two steps, so a refusal comes
//! at most one step after the budget. [`Rig::full`] fills it; a request
//! that ends there ([`Rig::end`]) wakes the queue, as the gateway does.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine::simulator::Simulator;
use engine::{CompletionRequest, ModelProfile, ServiceClass};
use tokio::time::Instant;

use super::*;
use crate::admission_queue::{Discipline, Queues, BEST_EFFORT_WAIT};
use crate::cluster::Cluster;
use crate::preemption::{Registration, Run};

const MODEL: &str = "tiny";
/// Output tokens a request asks for.
const OUTPUT: u32 = 16;
/// Words of its prompt, one token each: with its output, 49% of the KV.
const PROMPT_WORDS: usize = 990;
/// One step of the replica (its weights read once).
const STEP: Duration = Duration::from_millis(500);

struct Rig {
    limiter: Limiter,
    engine: Upstreams,
    /// The pool behind `engine`, for its replicas' own GPU time.
    simulator: Arc<Simulator>,
    queues: Queues,
    retry_budget: RetryBudget,
    /// Requests that hold their place until the test ends.
    kept: Mutex<Vec<Placed>>,
}

impl Rig {
    fn new() -> Arc<Self> {
        Self::with_pool(serde_json::json!({
            "name": MODEL,
            "version": "tiny-1",
            "gpus": 1,
            "replicas": 1,
            "weight_bytes": 500_000_000_u64,
            "flops_per_token": 1_000_000_000_u64,
            "kv_bytes_per_token": 1024,
            "kv_budget_bytes": 2_097_152,
            "hbm_bytes_per_second": 1_000_000_000_u64,
            "bandwidth_efficiency_percent": 100,
            "flops_per_second": 100_000_000_000_000_u64,
            "max_context": 1024,
        }))
    }

    /// A fast pool of `replicas`: 10 ms steps and KV for 4,096 tokens
    /// each, so a dozen requests run at once on each replica and hundreds
    /// complete every simulated 10 s.
    fn fast_pool(replicas: u64) -> serde_json::Value {
        serde_json::json!({
            "name": MODEL,
            "version": "fast-1",
            "gpus": 1,
            "replicas": replicas,
            "weight_bytes": 10_000_000_u64,
            "flops_per_token": 1_000_000_000_u64,
            "kv_bytes_per_token": 1024,
            "kv_budget_bytes": 4_194_304,
            "hbm_bytes_per_second": 1_000_000_000_u64,
            "bandwidth_efficiency_percent": 100,
            "flops_per_second": 100_000_000_000_000_u64,
            "max_context": 2048,
        })
    }

    /// A rig whose one model's pool is `profile` (named [`MODEL`]).
    fn with_pool(profile: serde_json::Value) -> Arc<Self> {
        Self::with_discipline(profile, Discipline::Full)
    }

    /// A rig whose queue applies only `discipline`.
    fn with_discipline(profile: serde_json::Value, discipline: Discipline) -> Arc<Self> {
        let profile: ModelProfile = serde_json::from_value(profile).unwrap();
        let simulator = Arc::new(Simulator::try_new(vec![profile], 1).unwrap());
        Arc::new(Self {
            limiter: Limiter::new(None, Cluster::local("place-tests")),
            engine: Upstreams::simulated(simulator.clone()),
            simulator,
            queues: Queues::with([MODEL.to_owned()], 100_000, discipline),
            retry_budget: RetryBudget::default(),
            kept: Mutex::default(),
        })
    }

    fn admission(&self) -> Admission<'_> {
        Admission {
            limiter: &self.limiter,
            engine: &self.engine,
            queues: Some(&self.queues),
            retry_budget: &self.retry_budget,
        }
    }

    /// Places one request of `caller` (numbered `n`, which seeds it).
    async fn place(&self, caller: &Caller, n: u64) -> Result<Placed, Refused> {
        self.place_sized(caller, n, PROMPT_WORDS, OUTPUT, 1_000_000)
            .await
    }

    /// Request `n` of `caller`: `prompt_words` words (one token each) and
    /// `output` tokens.
    fn request(caller: &Caller, n: u64, prompt_words: usize, output: u32) -> CompletionRequest {
        CompletionRequest {
            model: MODEL.to_owned(),
            // Its own first words, so no two share a cached prefix.
            prompt: format!(
                "request {n} of {}{}",
                caller.tenant_id,
                " the".repeat(prompt_words)
            ),
            max_tokens: Some(output),
            seed: n,
            tenant_id: caller.tenant_id.clone(),
            class: ServiceClass::from_priority(caller.priority),
            body: None,
        }
    }

    /// Places request `n` of `caller` ([`Rig::request`]), charged
    /// `cost_gpu_micros` in the queue.
    async fn place_sized(
        &self,
        caller: &Caller,
        n: u64,
        prompt_words: usize,
        output: u32,
        cost_gpu_micros: u64,
    ) -> Result<Placed, Refused> {
        let request = Self::request(caller, n, prompt_words, output);
        let ask = Ask {
            caller,
            request: &request,
            request_id: format!("req-{n}"),
            streams: false,
            retry: false,
            estimate: prompt_words as u64 + u64::from(output) + 8,
            kv_mib_seconds: 1,
            cost_gpu_micros,
        };
        place(self.admission(), ask).await
    }

    /// The request ends (cancelled here) and the next in line is woken,
    /// as the gateway does when a request ends.
    async fn end(&self, placed: Placed) {
        let Placed {
            generation,
            mut permit,
            ..
        } = placed;
        let _ = generation.cancel().await;
        permit.settle(0, Instant::now().into_std());
        self.queues.wake(MODEL);
    }

    /// Fills the replica: a priority-4 request that holds its place for the
    /// whole test, and one of `priority`, returned.
    async fn full(&self, priority: i16) -> Placed {
        let stays = self.place(&caller("stays", 4), 1_000).await.unwrap();
        self.kept.lock().unwrap().push(stays);
        self.place(&caller("holder", priority), 0).await.unwrap()
    }
}

fn caller(tenant: &str, priority: i16) -> Caller {
    Caller::unlimited(tenant, &format!("key-{tenant}"), priority)
}

#[tokio::test(start_paused = true)]
async fn a_waiter_with_no_room_is_refused_at_its_budget_and_charged_nothing() {
    let rig = Rig::new();
    let holder = rig.full(4).await;
    let waiter = Caller {
        max_concurrency: Some(1),
        ..caller("waiter", 1)
    };
    let began = Instant::now();
    let refused = rig.place(&waiter, 1).await.err().expect("refused");
    let waited = began.elapsed();
    assert!(
        matches!(refused, Refused::QueueTimeout(d) if d == BEST_EFFORT_WAIT),
        "{refused:?}"
    );
    assert_eq!(refused.reason(), Some("queue_timeout"));
    assert!(
        waited >= BEST_EFFORT_WAIT && waited <= BEST_EFFORT_WAIT + STEP,
        "refused after {waited:?}, its budget {BEST_EFFORT_WAIT:?}"
    );
    // Its one concurrency slot was given back: with room, it runs.
    rig.end(holder).await;
    assert!(rig.place(&waiter, 2).await.is_ok());
}

/// A caller of `priority` whose wait budget is `budget_ms` (its TTFT
/// objective).
fn with_budget(tenant: &str, priority: i16, budget_ms: u32) -> Caller {
    Caller {
        slo: fleet::slo::Slo {
            ttft_p95_ms: Some(budget_ms),
            ..Default::default()
        },
        ..caller(tenant, priority)
    }
}

/// A run of `tenant` at `priority` on `placed`'s replica, preemptible as
/// the gateway registers a non-streamed request.
fn register(rig: &Rig, placed: &Placed, tenant: &str, priority: i16) -> Registration {
    rig.queues.preemptions(MODEL).unwrap().register(Run {
        model: MODEL,
        replica: placed.generation.replica_id().unwrap(),
        owner: None,
        tenant,
        priority,
    })
}

#[tokio::test(start_paused = true)]
async fn a_priority_5_waiter_preempts_the_lowest_run_at_half_its_budget() {
    let rig = Rig::new();
    let low = rig.full(1).await;
    let mut victim = register(&rig, &low, "low", 1);
    // A second run of priority 3 on the same replica is not the lowest.
    let mut spared = register(&rig, &low, "standard", 3);
    let began = Instant::now();
    let waiter = {
        let rig = rig.clone();
        tokio::spawn(async move {
            rig.place(&with_budget("urgent", 5, 10_000), 1)
                .await
                .map(|p| p.queued)
        })
    };
    let told = victim.preempted().await;
    assert_eq!(told.by_tenant, "urgent");
    let at = began.elapsed();
    assert!(
        at >= Duration::from_secs(5) && at <= Duration::from_secs(5) + STEP,
        "preempted after {at:?}, half of a 10 s budget"
    );
    assert!(
        tokio::time::timeout(Duration::ZERO, spared.preempted())
            .await
            .is_err(),
        "the priority-3 run is spared"
    );
    // The victim gives its room up; the preemptor runs, within its budget.
    drop(victim);
    rig.end(low).await;
    let queued = waiter.await.unwrap().expect("placed");
    assert!(queued < Duration::from_secs(10), "{queued:?}");
}

#[tokio::test(start_paused = true)]
async fn below_priority_5_a_waiter_never_preempts() {
    let rig = Rig::new();
    let low = rig.full(1).await;
    let mut run = register(&rig, &low, "low", 1);
    // Priority 4, a 4 s budget: well within the victim's run.
    let reserved = with_budget("reserved", 4, 4_000);
    let refused = rig.place(&reserved, 1).await.err().expect("refused");
    assert!(matches!(refused, Refused::QueueTimeout(_)), "{refused:?}");
    assert!(
        tokio::time::timeout(Duration::ZERO, run.preempted())
            .await
            .is_err(),
        "a priority-4 waiter preempted"
    );
}

mod drill;
mod fairness;
