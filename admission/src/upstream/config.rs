//! The upstreams file: each served model replica ([`RemoteModel`]), where
//! its GPU time comes from ([`GpuTime`]), and [`load`], which refuses a bad
//! file naming the entry and the field.

use std::path::Path;

use serde::Deserialize;

use engine::error::EngineError;

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

pub(super) fn default_kv_poll() -> u64 {
    1000
}

pub(super) fn default_idle_timeout() -> u64 {
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

    pub(super) fn validate(&self) -> Result<(), String> {
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
pub(super) struct UpstreamsFile {
    pub(super) upstreams: Vec<RemoteModel>,
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
