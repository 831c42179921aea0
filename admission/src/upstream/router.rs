//! Which engine serves a model and which replica runs a request: the
//! simulator in process, or the better of two HTTP replicas drawn at
//! random (KV in use, then requests in flight), with dedicated replicas
//! and reserved floors held.

use std::sync::Arc;

use rust_decimal::Decimal;

use engine::error::EngineError;
use engine::simulator::{CompletionRequest, Simulator};
use engine::tokenizer;

use super::config::*;
use super::dedicated;
use super::generation::*;
use super::http::HttpUpstream;
use super::ledger;
use crate::floors::{FloorsSetter, HttpFloors};
use crate::occupancy;

/// What the gateway needs to know about a served model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub name: String,
    pub version: String,
    pub max_context: u32,
    pub gpus: u32,
    /// The replica stamped on usage events unless the engine names one.
    pub replica_id: String,
    /// Served over HTTP (the request body is passed through).
    pub remote: bool,
}

/// The models a gateway serves and the engine behind each.
#[derive(Debug)]
pub struct Upstreams {
    pub(super) simulator: Arc<Simulator>,
    pub(super) remote: Vec<Arc<HttpUpstream>>,
    pub(super) models: Vec<ModelInfo>,
    /// What `GET /v1/models` answers, built with `models`.
    pub(super) model_list: openai_wire::ModelList,
    /// The reserved floors of the HTTP-served models' pools.
    pub(super) floors: Arc<HttpFloors>,
}

impl Upstreams {
    /// The simulator's models, except those `remote` takes over, plus `remote`.
    pub fn new(simulator: Arc<Simulator>, remote: Vec<RemoteModel>) -> Result<Self, EngineError> {
        Self::with_shared_ledger(simulator, remote, None)
    }

    /// [`Upstreams::new`], the HTTP upstreams' GPU time attributed through
    /// `shared` (every gateway in front of a replica in one ledger).
    pub fn with_shared_ledger(
        simulator: Arc<Simulator>,
        remote: Vec<RemoteModel>,
        shared: Option<Arc<dyn ledger::SharedLedger>>,
    ) -> Result<Self, EngineError> {
        let remote = remote
            .into_iter()
            .map(|m| {
                HttpUpstream::new(m).map(|mut u| {
                    u.shared = shared.clone();
                    Arc::new(u)
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut models = Self::simulated(simulator.clone()).models;
        models.retain(|m| !remote.iter().any(|r| r.config.model == m.name));
        for r in &remote {
            if models.iter().any(|m| m.name == r.config.model) {
                continue;
            }
            models.push(ModelInfo {
                name: r.config.model.clone(),
                version: r.config.version().to_owned(),
                max_context: r.config.max_context,
                gpus: r.config.gpus,
                replica_id: r.config.replica().to_owned(),
                remote: true,
            });
        }
        let floors = Arc::new(HttpFloors::new(
            remote.iter().map(|r| r.config.model.clone()),
        ));
        Ok(Self {
            simulator,
            remote,
            model_list: list_of(&models),
            models,
            floors,
        })
    }

    /// Only the simulator.
    pub fn simulated(simulator: Arc<Simulator>) -> Self {
        let models: Vec<ModelInfo> = simulator
            .models()
            .iter()
            .map(|p| ModelInfo {
                name: p.name.clone(),
                version: p.version.clone(),
                max_context: p.max_context,
                gpus: p.gpus,
                replica_id: format!("{}-r0", p.name),
                remote: false,
            })
            .collect();
        Self {
            simulator,
            remote: Vec::new(),
            model_list: list_of(&models),
            models,
            floors: Arc::default(),
        }
    }

    pub fn models(&self) -> &[ModelInfo] {
        &self.models
    }

    /// What `GET /v1/models` answers (built once, with the upstreams).
    pub fn model_list(&self) -> &openai_wire::ModelList {
        &self.model_list
    }

    pub fn model(&self, name: &str) -> Option<&ModelInfo> {
        self.models.iter().find(|m| m.name == name)
    }

    pub fn simulator(&self) -> &Arc<Simulator> {
        &self.simulator
    }

    /// The HTTP upstreams (for their ledgers' metrics).
    pub fn remote(&self) -> &[Arc<HttpUpstream>] {
        &self.remote
    }

    /// What sets the floors, to keep (the gateway's tenant refresh).
    pub fn floors_setter(&self) -> FloorsSetter {
        FloorsSetter::new(self.simulator.clone(), self.floors.clone())
    }

    /// Starts a request on the model's engine.
    pub async fn start(
        &self,
        req: &CompletionRequest,
        stream: bool,
    ) -> Result<Generation, EngineError> {
        let replicas: Vec<&Arc<HttpUpstream>> = self
            .remote
            .iter()
            .filter(|r| r.config.model == req.model)
            .collect();
        if replicas.is_empty() {
            return Ok(Generation::Simulated(
                self.simulator.start(req, stream).await?,
            ));
        }
        let threshold = req.class.threshold_percent();
        let prompt_tokens = tokenizer::count(&req.prompt);
        let mut share = match self.floors.pool(&req.model) {
            Some(pool) => {
                let in_pool: Vec<(&str, &occupancy::Occupancy)> = replicas
                    .iter()
                    .filter(|r| !r.is_down())
                    .map(|r| (r.config.replica(), &*r.occupancy))
                    .collect();
                let kv = kv_estimate(req, prompt_tokens, replicas[0].config.max_context);
                Some(
                    pool.admit(&in_pool, &req.tenant_id, kv, threshold)
                        .map_err(|held| EngineError::NoCapacity {
                            model: req.model.clone(),
                            class: req.class.as_str(),
                            why: engine::error::NoRoom::HeldForFloors {
                                held_percent: held.held_percent,
                            },
                        })?,
                )
            }
            None => None,
        };
        let mut last = None;
        for upstream in route_for(&req.tenant_id, &replicas, threshold) {
            match upstream.start_counted(req, stream, prompt_tokens).await {
                Ok(mut g) => {
                    if let Some(mut share) = share.take() {
                        share.placed(&upstream.occupancy);
                        g.hold(share);
                    }
                    return Ok(Generation::Http(Box::new(g)));
                }
                // Busy for its class, or not reached: the next replica.
                Err(e @ EngineError::UpstreamBusy { .. }) => last = Some(e),
                Err(e) if upstream.is_down() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| EngineError::UnknownModel(req.model.clone())))
    }

    /// Whether `tenant` owns replicas of `model` (simulated, or HTTP ones
    /// with `dedicated_to`).
    pub fn owns_replicas(&self, model: &str, tenant: &str) -> bool {
        match self.model(model) {
            Some(m) if m.remote => self.remote.iter().any(|r| {
                r.config.model == model && r.dedicated.as_ref().is_some_and(|d| d.owner == tenant)
            }),
            Some(_) => self
                .simulator
                .profile(model)
                .is_some_and(|p| p.dedicated.contains_key(tenant)),
            None => false,
        }
    }

    /// `tenant`'s request of `model` waits for room: while the guard is
    /// held, no other tenant's request starts on `tenant`'s dedicated
    /// replicas of the model. `None` when it has none.
    pub fn owner_waiting(&self, model: &str, tenant: &str) -> Option<OwnerWaiting> {
        if !self.model(model)?.remote {
            return self
                .simulator
                .owner_waiting(model, tenant)
                .map(OwnerWaiting::Simulated);
        }
        let owned: Vec<_> = self
            .remote
            .iter()
            .filter(|r| r.config.model == model)
            .filter_map(|r| r.dedicated.clone())
            .filter(|d| d.owner == tenant)
            .collect();
        (!owned.is_empty()).then(|| OwnerWaiting::Http(dedicated::Dedicated::hold(owned)))
    }

    /// GPU time of a request whose engine could not say (it failed
    /// mid-way): the simulated model's roofline estimate, else zero.
    pub fn estimated_gpu_seconds(&self, model: &str, prompt: u64, produced: u64) -> Decimal {
        match self.simulator.profile(model) {
            Some(p) if self.model(model).is_some_and(|m| !m.remote) => {
                p.estimated_gpu_seconds(prompt, produced)
            }
            _ => Decimal::ZERO,
        }
    }
}

fn list_of(models: &[ModelInfo]) -> openai_wire::ModelList {
    openai_wire::ModelList::new(models.iter().map(|m| (m.name.as_str(), m.max_context)))
}

/// A request's KV tokens for the floors: its prompt plus its output cap
/// (without one, [`DEFAULT_OUTPUT_ESTIMATE`]), within the context.
pub(super) fn kv_estimate(req: &CompletionRequest, prompt: u64, max_context: u32) -> u64 {
    let output = req
        .max_tokens
        .map_or(engine::completion::DEFAULT_OUTPUT_ESTIMATE, u64::from);
    (prompt + output).min(u64::from(max_context).max(prompt))
}

/// The order to try a model's HTTP replicas in for `tenant`: the
/// replicas dedicated to it, then the shared ones, then those dedicated
/// to a tenant with nothing waiting or running there (lent), each group
/// in [`route`]'s order; last those whose owner is using them, which
/// refuse at once as busy (so a tenant left without a replica waits in
/// the queue rather than seeing a shared replica's connection error).
pub(super) fn route_for<'a>(
    tenant: &str,
    replicas: &[&'a Arc<HttpUpstream>],
    threshold_percent: u64,
) -> Vec<&'a Arc<HttpUpstream>> {
    // Each replica's group, its owner's state read once.
    let ranked: Vec<(u8, &'a Arc<HttpUpstream>)> = replicas
        .iter()
        .map(|u| {
            let rank = match u.dedicated.as_deref() {
                Some(d) if d.owner == tenant => 0,
                None => 1,
                Some(d) if d.lends() => 2,
                Some(_) => 3,
            };
            (rank, *u)
        })
        .collect();
    (0..4)
        .flat_map(|rank| {
            let group: Vec<&'a Arc<HttpUpstream>> = ranked
                .iter()
                .filter(|(r, _)| *r == rank)
                .map(|(_, u)| *u)
                .collect();
            route(&group, threshold_percent, rand::random())
        })
        .collect()
}

/// The order to try a model's HTTP replicas in: the better of two drawn
/// by `draw` first (power of two choices), then the rest, best first.
/// Better: in the pool (not down), admitting the class by its last KV poll,
/// fewer KV basis points in use (the poll plus what this gateway sent it
/// since), fewer requests in flight.
pub(super) fn route<'a>(
    replicas: &[&'a Arc<HttpUpstream>],
    threshold_percent: u64,
    draw: u64,
) -> Vec<&'a Arc<HttpUpstream>> {
    let score = |u: &HttpUpstream| {
        (
            u.is_down(),
            !u.occupancy.admits(threshold_percent),
            u.occupancy.routed_basis_points().unwrap_or(0),
            u.ledger.in_flight(),
        )
    };
    let mut order: Vec<&Arc<HttpUpstream>> = replicas.to_vec();
    let n = order.len();
    if n >= 2 {
        let a = (draw % n as u64) as usize;
        let b = (a + 1 + ((draw >> 32) % (n as u64 - 1)) as usize) % n;
        let first = if score(order[b]) < score(order[a]) {
            b
        } else {
            a
        };
        order.swap(0, first);
        order[1..].sort_by_key(|u| score(u));
    }
    order
}
