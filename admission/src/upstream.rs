//! Which engine serves which model: the in-process [`Simulator`] by
//! default, or an OpenAI-compatible server over HTTP (vLLM, or the
//! `engine` binary) for the models listed in an upstreams file:
//!
//! ```yaml
//! upstreams:
//!   - model: llama-3.1-70b          # the name clients ask for
//!     url: http://10.0.0.5:8000     # /v1/chat/completions is appended
//!     upstream_model: meta-llama/Llama-3.1-70B-Instruct   # optional
//!     gpus: 4                       # GPUs of that replica (GPU time = wall time share × gpus)
//!     max_context: 131072
//!     model_version: "3.1"          # optional, stamped on usage events
//!     replica_id: vllm-70b-a        # optional
//!     gpu_time: auto                # auto: the upstream's own figure if it reports one; derived: always the ledger's
//!     api_key_env: VLLM_API_KEY     # optional: the env var holding the upstream's bearer key
//!     identity_secret_env: ENGINE_IDENTITY_SECRET  # optional: the env var holding the secret (≥ 32 bytes)
//!                                   # that signs x-meterline-identity; required by the `engine` binary
//!     cache_salt: false             # optional: true sets vLLM's cache_salt to a per-tenant value
//!     idle_timeout_secs: 60         # optional: longest silence inside a response
//!     kv_poll_ms: 1000              # optional: how often its /metrics KV usage is read (0: never)
//!     replica_reports: false        # optional: true for the `engine` binary — one gateway (elected)
//!                                   # reads its replicas' GPU time and reports their idle time;
//!                                   # otherwise (vLLM) the gateways' GPU ledger is read instead
//!     dedicated_to: acme-corp       # optional: the tenant that owns this replica (reserved capacity)
//!     kv_tokens: 432000             # optional: its KV cache in tokens, for a server whose /metrics
//!                                   # lacks vllm:cache_config_info (the pool's reserved floors need it)
//! ```
//!
//! With `identity_secret_env` every request carries `x-meterline-identity`,
//! the tenant and class signed per request (see
//! [`identity`](engine::identity)) instead of the plain `x-tenant-id` and
//! `x-service-class` headers, which anyone who can reach the upstream could
//! forge. With `cache_salt: true` the body's `cache_salt` (vLLM scopes its
//! prefix cache by it) is set to a value derived from the tenant — keyed by
//! the identity secret when there is one — overwriting what the client
//! sent, so no tenant can hit another's cached prefixes; with `false` (the
//! default: strict OpenAI-compatible servers reject unknown fields) a
//! client's `cache_salt` is removed.
//!
//! A model may be listed several times, once per replica (each its own
//! `url` and `replica_id`; the model's `max_context`, `upstream_model` and
//! `model_version` the same): a request goes to the better of two replicas
//! drawn at random — fewer KV basis points in use by its last poll (plus
//! what this gateway sent it since), then fewer requests in flight from
//! this gateway — and, when that one is busy
//! for its class or cannot be reached, to the others in the same order. A
//! replica that cannot be reached leaves the pool for
//! [`DOWN_FOR`](http::DOWN_FOR) and is tried again after.
//!
//! The tenants' reserved floors are held on such a pool as on a simulated
//! one, in KV tokens ([`floors`]).
//!
//! - [`dedicated`]: a replica one tenant owns, lent while it is idle
//! - [`floors`]: reserved floors on a pool of HTTP replicas
//! - [`ledger`]: GPU time from wall time × in-flight token share, exactly
//! - [`http`]: the HTTP client side of one upstream replica
//! - [`occupancy`]: the upstream's KV usage, polled, for admission by class

pub mod dedicated;
pub mod floors;
pub mod http;
pub mod ledger;
pub mod occupancy;

use std::path::Path;
use std::sync::Arc;

use rust_decimal::Decimal;
use serde::Deserialize;

use engine::error::EngineError;
use engine::simulator::{self, Completion, CompletionRequest, Piece, Simulator};
use engine::tokenizer;
use http::{HttpGeneration, HttpUpstream};

/// Where a request's GPU time comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuTime {
    /// The upstream's own attributed figure when it reports one, else derived.
    #[default]
    Auto,
    /// Always the wall-time × in-flight-token share of the replica.
    Derived,
}

/// One model served by an OpenAI-compatible server; see the module docs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteModel {
    pub model: String,
    pub url: String,
    #[serde(default)]
    pub upstream_model: Option<String>,
    pub gpus: u32,
    pub max_context: u32,
    #[serde(default)]
    pub model_version: Option<String>,
    #[serde(default)]
    pub replica_id: Option<String>,
    #[serde(default)]
    pub gpu_time: GpuTime,
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The env var holding the secret that signs `x-meterline-identity`.
    #[serde(default)]
    pub identity_secret_env: Option<String>,
    /// Set vLLM's `cache_salt` per tenant (else a client's is removed).
    #[serde(default)]
    pub cache_salt: bool,
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_secs: u64,
    #[serde(default = "default_kv_poll")]
    pub kv_poll_ms: u64,
    /// Report this upstream's replicas (busy, idle, lent GPU time) from its
    /// `GET /v1/replicas/gpu-time`: the `engine` binary serves it; vLLM
    /// does not (without it the replica is reported from the gateways'
    /// GPU ledger: busy as they counted it, idle the rest of wall time ×
    /// GPUs). Needs `identity_secret_env` (the read is signed).
    #[serde(default)]
    pub replica_reports: bool,
    /// The tenant this replica is dedicated to (its reserved capacity):
    /// the owner's requests go to it first; another tenant's start on it
    /// only while the owner has nothing waiting or running there (lent),
    /// and its time is reported as the owner's. For a replica the gateway
    /// routes to (vLLM); an `engine` binary routes its own pool
    /// (`ENGINE_DEDICATED`).
    #[serde(default)]
    pub dedicated_to: Option<String>,
    /// The replica's KV cache in tokens, when its `/metrics` does not say
    /// (`vllm:cache_config_info`); the pool's reserved floors need it.
    #[serde(default)]
    pub kv_tokens: Option<u64>,
}

fn default_kv_poll() -> u64 {
    1000
}

fn default_idle_timeout() -> u64 {
    60
}

impl RemoteModel {
    pub fn version(&self) -> &str {
        self.model_version
            .as_deref()
            .or(self.upstream_model.as_deref())
            .unwrap_or(&self.model)
    }

    pub fn replica(&self) -> &str {
        self.replica_id.as_deref().unwrap_or(&self.url)
    }

    fn validate(&self) -> Result<(), String> {
        if self.model.trim().is_empty() {
            return Err("model is empty".into());
        }
        let url = reqwest::Url::parse(&self.url).map_err(|e| format!("url {:?}: {e}", self.url))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("url {:?} must be http:// or https://", self.url));
        }
        if !(1..=1024).contains(&self.gpus) {
            return Err(format!("gpus must be 1 to 1024, got {}", self.gpus));
        }
        if self.max_context == 0 {
            return Err("max_context must be above 0".into());
        }
        if self.kv_poll_ms != 0 && !(100..=60_000).contains(&self.kv_poll_ms) {
            return Err(format!(
                "kv_poll_ms must be 0 (off) or 100 to 60000, got {}",
                self.kv_poll_ms
            ));
        }
        if self.replica_reports && self.identity_secret_env.is_none() {
            return Err(
                "replica_reports: true needs identity_secret_env (the engine answers \
                        GET /v1/replicas/gpu-time only to a signed request)"
                    .into(),
            );
        }
        if let Some(owner) = &self.dedicated_to {
            if owner.trim().is_empty() || owner.len() > 64 {
                return Err(format!(
                    "dedicated_to must be a tenant id of 1 to 64 characters, got {owner:?}"
                ));
            }
            if self.replica_reports {
                return Err(
                    "dedicated_to cannot be set with replica_reports: true (an engine \
                            binary routes its own replicas: set ENGINE_DEDICATED on it)"
                        .into(),
                );
            }
        }
        if let Some(tokens) = self.kv_tokens {
            if !(1..=1_000_000_000_000).contains(&tokens) {
                return Err(format!(
                    "kv_tokens must be 1 to 1000000000000 (the replica's KV cache in tokens), got {tokens}"
                ));
            }
        }
        if !(1..=3600).contains(&self.idle_timeout_secs) {
            return Err(format!(
                "idle_timeout_secs must be 1 to 3600, got {}",
                self.idle_timeout_secs
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamsFile {
    upstreams: Vec<RemoteModel>,
}

/// Reads and checks an upstreams file; the error names the file, the entry
/// and what is wrong with it.
pub fn load(path: &Path) -> Result<Vec<RemoteModel>, EngineError> {
    let bad = |detail: String| EngineError::Config(format!("{}: {detail}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let file: UpstreamsFile = serde_norway::from_str(&text).map_err(|e| bad(e.to_string()))?;
    for (i, m) in file.upstreams.iter().enumerate() {
        m.validate()
            .map_err(|e| bad(format!("upstreams[{i}] ({:?}): {e}", m.model)))?;
        for o in file.upstreams[..i].iter().filter(|o| o.model == m.model) {
            // Replicas of one model: each its own, the model's figures the same.
            let differ = if o.replica() == m.replica() {
                Some("replica (replica_id, or url without one)")
            } else if o.max_context != m.max_context {
                Some("max_context")
            } else if o.upstream_model != m.upstream_model {
                Some("upstream_model")
            } else if o.model_version != m.model_version {
                Some("model_version")
            } else {
                None
            };
            if let Some(field) = differ {
                return Err(bad(format!(
                    "upstreams[{i}]: model {:?} is listed again with {}",
                    m.model,
                    if field.starts_with("replica") {
                        format!("the same {field}")
                    } else {
                        format!("another {field}; the replicas of one model must agree on it")
                    }
                )));
            }
        }
    }
    Ok(file.upstreams)
}

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
    simulator: Arc<Simulator>,
    remote: Vec<Arc<HttpUpstream>>,
    models: Vec<ModelInfo>,
    /// The reserved floors of the HTTP-served models' pools.
    floors: Arc<floors::HttpFloors>,
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
        let floors = Arc::new(floors::HttpFloors::new(
            remote.iter().map(|r| r.config.model.clone()),
        ));
        Ok(Self {
            simulator,
            remote,
            models,
            floors,
        })
    }

    /// Only the simulator.
    pub fn simulated(simulator: Arc<Simulator>) -> Self {
        let models = simulator
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
            models,
            floors: Arc::default(),
        }
    }

    pub fn models(&self) -> &[ModelInfo] {
        &self.models
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
        FloorsSetter {
            simulator: self.simulator.clone(),
            http: self.floors.clone(),
        }
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

/// A request's KV tokens for the floors: its prompt plus its output cap
/// (without one, [`DEFAULT_OUTPUT_ESTIMATE`]), within the context.
fn kv_estimate(req: &CompletionRequest, prompt: u64, max_context: u32) -> u64 {
    let output = req
        .max_tokens
        .map_or(engine::completion::DEFAULT_OUTPUT_ESTIMATE, u64::from);
    (prompt + output).min(u64::from(max_context).max(prompt))
}

/// Sets the tenants' reserved floors on every model pool, simulated and
/// HTTP; kept by the gateway's tenant refresh ([`Upstreams::floors_setter`]).
#[derive(Debug, Clone)]
pub struct FloorsSetter {
    simulator: Arc<Simulator>,
    http: Arc<floors::HttpFloors>,
}

impl FloorsSetter {
    pub fn set(&self, floors: &std::collections::HashMap<String, u32>) {
        self.simulator.set_floors(floors);
        self.http.set(floors);
    }
}

/// The order to try a model's HTTP replicas in for `tenant`: the
/// replicas dedicated to it, then the shared ones, then those dedicated
/// to a tenant with nothing waiting or running there (lent), each group
/// in [`route`]'s order; last those whose owner is using them, which
/// refuse at once as busy (so a tenant left without a replica waits in
/// the queue rather than seeing a shared replica's connection error).
fn route_for<'a>(
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
fn route<'a>(
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

/// An owner's request waiting for room (see [`Upstreams::owner_waiting`]);
/// dropping it ends the wait.
#[derive(Debug)]
pub enum OwnerWaiting {
    Simulated(engine::replica_pool::OwnerWaiting),
    Http(dedicated::OwnerBusy),
}

/// A request running on whichever engine serves its model.
pub enum Generation {
    Simulated(simulator::Generation),
    Http(Box<HttpGeneration>),
}

impl Generation {
    /// The replica running it (an HTTP upstream's configured name, as its
    /// usage event carries it unless the engine names another).
    pub fn replica_id(&self) -> Option<&str> {
        match self {
            Self::Simulated(g) => Some(g.replica_id()),
            Self::Http(g) => Some(g.replica_id()),
        }
    }

    /// The tenant the replica running it is dedicated to, if any.
    pub fn dedicated_to(&self) -> Option<&str> {
        match self {
            Self::Simulated(g) => g.dedicated_to(),
            Self::Http(g) => g.dedicated_to(),
        }
    }

    pub async fn next(&mut self) -> Result<Piece, EngineError> {
        match self {
            Self::Simulated(g) => g.next().await,
            Self::Http(g) => g.next().await,
        }
    }

    pub async fn finish(self) -> Result<Completion, EngineError> {
        match self {
            Self::Simulated(g) => g.finish().await,
            Self::Http(g) => g.finish().await,
        }
    }

    /// Stops the request at its engine (KV freed) and returns what it used.
    pub async fn cancel(self) -> Result<Completion, EngineError> {
        match self {
            Self::Simulated(g) => g.cancel().await,
            Self::Http(g) => Ok(g.cancel().await),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    fn file(body: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!(
            "meterline-upstreams-{}-{}.yaml",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::write(&path, body).unwrap();
        path
    }

    const TWO: &str = "upstreams:
  - {model: m, url: 'http://127.0.0.1:1', gpus: 1, max_context: 1000, replica_id: a}
  - {model: m, url: 'http://127.0.0.1:2', gpus: 1, max_context: 1000, replica_id: b}
";

    /// The upstreams of an upstreams file `body`, without the simulator's.
    fn upstreams(body: &str) -> Upstreams {
        let path = file(body);
        let models = load(&path).unwrap();
        std::fs::remove_file(&path).ok();
        Upstreams::new(Arc::new(Simulator::new(Vec::new(), 0)), models).unwrap()
    }

    #[test]
    fn a_model_may_be_listed_once_per_replica() {
        let ups = upstreams(TWO);
        assert_eq!(ups.models().iter().filter(|m| m.name == "m").count(), 1);
        assert_eq!(ups.remote().len(), 2);
    }

    #[test]
    fn a_replicas_kv_capacity_may_be_set_in_the_file() {
        let ups = upstreams(&TWO.replace("replica_id: a}", "replica_id: a, kv_tokens: 5000}"));
        assert_eq!(ups.remote()[0].occupancy.kv_tokens(), Some(5_000));
        assert_eq!(
            ups.remote()[1].occupancy.kv_tokens(),
            None,
            "read from its /metrics"
        );
    }

    #[test]
    fn replicas_that_repeat_disagree_or_cannot_be_read_are_refused_naming_the_field() {
        for (body, needle) in [
            (
                TWO.replace("replica_id: b", "replica_id: a"),
                "the same replica",
            ),
            (
                TWO.replace(
                    "max_context: 1000, replica_id: b",
                    "max_context: 2000, replica_id: b",
                ),
                "another max_context",
            ),
            (
                TWO.replace("replica_id: b}", "replica_id: b, replica_reports: true}"),
                "replica_reports: true needs identity_secret_env",
            ),
            (
                TWO.replace("replica_id: b}", "replica_id: b, kv_tokens: 0}"),
                "kv_tokens must be 1 to",
            ),
        ] {
            let path = file(&body);
            let err = load(&path).unwrap_err().to_string();
            std::fs::remove_file(&path).ok();
            assert!(
                err.contains("upstreams[1]") && err.contains(needle),
                "{err}"
            );
        }
    }

    #[test]
    fn of_two_replicas_the_one_with_fewer_in_flight_goes_first() {
        let ups = upstreams(TWO);
        let replicas: Vec<&Arc<HttpUpstream>> = ups.remote().iter().collect();
        let _busy = replicas[0].ledger.join(100);
        for draw in 0..8 {
            let order = route(&replicas, 60, draw);
            assert_eq!(order[0].config.replica(), "b", "fewer in flight wins");
            assert_eq!(order.len(), 2);
        }
    }

    #[test]
    fn what_was_sent_since_the_last_poll_counts_in_the_choice() {
        let ups = upstreams(TWO);
        let replicas: Vec<&Arc<HttpUpstream>> = ups.remote().iter().collect();
        for r in &replicas {
            r.occupancy.set_kv_tokens(10_000);
        }
        replicas[0].occupancy.set(1_000);
        replicas[1].occupancy.set(2_000);
        assert_eq!(
            route(&replicas, 60, 0)[0].config.replica(),
            "a",
            "a read emptier"
        );
        // A burst sent to a since: 1,500 of its 10,000 tokens.
        replicas[0].occupancy.sent(1_500);
        for draw in 0..8 {
            assert_eq!(route(&replicas, 60, draw)[0].config.replica(), "b");
        }
    }
}
