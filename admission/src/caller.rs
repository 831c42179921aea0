//! The caller as admission sees it: a tenant's key, priority, weight,
//! caps, rates, objectives and per-model limits. The gateway builds it from
//! the tenant config it reads (`gateway_lite::tenants`); everything here
//! decides with it.

use std::collections::HashMap;
use std::sync::Arc;

/// What admission needs to know about a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub tenant_id: String,
    pub api_key_id: String,
    pub priority: i16,
    /// The tenant's weight in its priority level's fair queue.
    pub weight: u32,
    /// The tenant's cap on concurrent in-flight requests, all keys together.
    pub max_concurrency: Option<u32>,
    /// The tenant's cap on KV·seconds in flight, all keys together, in MiB·s.
    pub max_kv_mib_seconds: Option<u64>,
    /// The tenant's requests/s and burst, all keys and models together.
    pub rate: Option<RequestRate>,
    /// The tenant's service-level objectives (its window is reported
    /// against them).
    pub slo: fleet::slo::Slo,
    /// The tenant's `limits` rows by model (`*` applies to every model
    /// without its own row).
    pub limits: Arc<HashMap<String, ModelLimits>>,
}

/// Requests per second with a burst: a token bucket holding `burst`,
/// refilled at `per_second` (a tenant's `rateLimit`, or the global one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRate {
    pub per_second: u32,
    pub burst: u32,
}

/// One `limits` row: what a tenant may do with one model (or `*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelLimits {
    /// Requests per minute, per key and model.
    pub rpm: Option<u32>,
    /// Tokens (prompt + completion) per minute, per key and model.
    pub tpm: Option<u64>,
    pub max_context: Option<u32>,
    pub max_output: Option<u32>,
}

impl Caller {
    /// A caller of `tenant_id` through key `api_key_id` at `priority`, with
    /// no limit, weight 1 and no objectives (tests, benchmarks and drills
    /// set what they need on top).
    pub fn unlimited(tenant_id: &str, api_key_id: &str, priority: i16) -> Self {
        Self {
            tenant_id: tenant_id.into(),
            api_key_id: api_key_id.into(),
            priority,
            weight: 1,
            max_concurrency: None,
            max_kv_mib_seconds: None,
            rate: None,
            slo: fleet::slo::Slo::default(),
            limits: Arc::new(HashMap::new()),
        }
    }

    /// The limits that apply to `model`: its own row, else the `*` row, else none.
    pub fn limits_for(&self, model: &str) -> ModelLimits {
        self.limits
            .get(model)
            .or_else(|| self.limits.get("*"))
            .copied()
            .unwrap_or_default()
    }
}
