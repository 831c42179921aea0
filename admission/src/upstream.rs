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
//! one, in KV tokens ([`crate::floors`]), from each replica's KV reading
//! ([`crate::occupancy`]).
//!
//! - [`dedicated`]: a replica one tenant owns, lent while it is idle
//! - [`ledger`]: GPU time from wall time × in-flight token share, exactly
//! - [`http`]: the HTTP client side of one upstream replica
//! - [`config`]: the upstreams file and its checks
//! - [`router`]: which engine and replica run a request
//! - [`generation`]: a request running on either kind of engine

mod config;
pub mod dedicated;
mod generation;
pub mod http;
pub mod ledger;
mod router;
#[cfg(test)]
mod tests;

pub use config::{load, GpuTime, RemoteModel};
pub use generation::{Generation, OwnerWaiting};
pub use router::{ModelInfo, Upstreams};
