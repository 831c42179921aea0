//! What every request handler shares: the gateway's state, built once by
//! [`crate::service::run`] (its own module so the handlers need not import
//! the service that mounts them).

use std::sync::Arc;
use std::time::Duration;

use admission::upstream::Upstreams;
use tokio_util::task::TaskTracker;

use crate::idempotency::Idempotency;
use crate::outbox::Outbox;
use crate::readiness::Readiness;
use crate::tenants::Registry;
use admission::limits::Limiter;

#[derive(Clone)]
pub struct AppState {
    pub registry: Registry,
    pub engine: Arc<Upstreams>,
    pub outbox: Outbox,
    pub gateway_id: String,
    pub speedup: u32,
    /// Longest a request may run before it is stopped and billed as an error.
    pub request_timeout: Duration,
    pub limiter: Limiter,
    /// Recent TPOT per model, for the KV·seconds estimate.
    pub tpot: admission::tpot::Tpot,
    /// Retries against admitted traffic over the last minute.
    pub retry_budget: Arc<admission::retry_budget::RetryBudget>,
    pub idempotency: Idempotency,
    /// Every admitted request's task, so shutdown waits until each one has
    /// written its usage event.
    pub runs: TaskTracker,
    /// The GPU-time ledger of HTTP replicas shared by every gateway (none
    /// with `GATEWAY_LIMITS=local`).
    pub gpu_ledger: Option<admission::gpu_ledger::RedisLedger>,
    /// Every tenant's last 60 s of TTFT and end-to-end latency, against its SLO.
    pub slo: Arc<fleet::slo::Windows>,
    /// Each priority's share of its rate (`GATEWAY_QUEUE=on`).
    pub ladder: Option<admission::ladder::Ladder>,
    /// The simulated models' fair queues (`GATEWAY_QUEUE=on`).
    pub queues: Option<admission::admission_queue::Queues>,
    /// What `/readyz` answers; drained on SIGTERM.
    pub readiness: Readiness,
}

impl AppState {
    /// A gateway on its own: limits and idempotency claims in memory (no
    /// Redis), no fairness layer, the engine answering at once
    /// (`speedup` 0) and the default request timeout — what benchmarks and
    /// in-process tests serve; [`crate::service::run`] sets the rest from
    /// its configuration.
    pub fn alone(
        gateway_id: &str,
        registry: Registry,
        engine: Arc<Upstreams>,
        outbox: Outbox,
    ) -> Self {
        let cluster = admission::cluster::Cluster::local(gateway_id);
        Self {
            registry,
            engine,
            idempotency: Idempotency::new(outbox.clone(), cluster.clone()),
            outbox,
            gateway_id: gateway_id.to_owned(),
            speedup: 0,
            request_timeout: Duration::from_secs(600),
            limiter: Limiter::new(None, cluster),
            tpot: Default::default(),
            retry_budget: Arc::default(),
            runs: TaskTracker::new(),
            gpu_ledger: None,
            slo: Arc::default(),
            ladder: None,
            queues: None,
            readiness: Readiness::default(),
        }
    }
}

impl AppState {
    /// What admission decides with (see [`admission::place`]).
    pub fn admission(&self) -> admission::Admission<'_> {
        admission::Admission {
            limiter: &self.limiter,
            engine: &self.engine,
            queues: self.queues.as_ref(),
            retry_budget: &self.retry_budget,
        }
    }

    /// Re-evaluates the ladder every [`admission::ladder::EVERY`] from the
    /// simulated models' KV snapshots, their queues and the SLO windows
    /// (nothing without a ladder and queues, i.e. without
    /// `GATEWAY_QUEUE=on`).
    pub fn spawn_ladder(&self) -> Option<tokio::task::JoinHandle<()>> {
        let (ladder, queues) = (self.ladder.clone()?, self.queues.clone()?);
        let (engine, slo) = (self.engine.clone(), self.slo.clone());
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(admission::ladder::EVERY);
            loop {
                tick.tick().await;
                let models: Vec<(String, usize)> = engine
                    .models()
                    .iter()
                    .filter(|m| queues.serves(&m.name))
                    .map(|m| (m.name.clone(), queues.depth(&m.name)))
                    .collect();
                ladder.evaluate(&models, &slo, std::time::Instant::now());
            }
        }))
    }
}
