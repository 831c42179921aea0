//! The `engine` binary's settings: each a flag and an environment variable,
//! checked into what the server runs with. Kept in the library so the
//! settings reference (`docs/settings.md`) is generated from this definition.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{anyhow, bail};
use clap::Parser;

use crate::identity::{Secret, MIN_SECRET_BYTES};

/// Settings, each also an environment variable.
#[derive(Debug, Parser)]
#[command(
    name = "engine",
    about = "Simulated GPU inference engine with an OpenAI-compatible API"
)]
pub struct EngineConfig {
    /// Where the stand-alone engine's API listens.
    #[arg(long, env = "ENGINE_ADDR", default_value = "127.0.0.1:8081")]
    pub addr: SocketAddr,
    /// YAML or JSON file of model profiles (`profiles: [...]`, each with
    /// its `replicas`, default 1); the reference profiles if unset.
    #[arg(long, env = "ENGINE_PROFILES")]
    pub profiles: Option<PathBuf>,
    /// Replicas per model over the profiles' own
    /// (`llama-3.1-70b=12,llama-3.1-8b=2`; 1 to 256 each; a model without a
    /// profile or a count out of range stops the engine naming the setting).
    #[arg(long, env = "ENGINE_REPLICAS")]
    pub replicas: Option<String>,
    /// Replicas dedicated to tenants (`llama-3.1-70b:acme-corp=4`): the
    /// pool's first replicas, at most its replicas in all.
    #[arg(long, env = "ENGINE_DEDICATED")]
    pub dedicated: Option<String>,
    /// Pacing: 1 = real time, N = N times faster, 0 = no waiting (figures unchanged).
    #[arg(long, env = "ENGINE_SPEEDUP", default_value_t = 1)]
    pub speedup: u32,
    /// Required: the secret shared with the gateway (the variable its
    /// upstream's `identity_secret_env` names), at least 32 bytes, that
    /// signs `x-meterline-identity`; a chat completion without a valid
    /// identity is 401 `invalid_identity`.
    #[arg(long, env = "ENGINE_IDENTITY_SECRET", hide_env_values = true)]
    pub identity_secret: Option<String>,
    /// Slow-client bounds and the shutdown grace of the listener.
    #[command(flatten)]
    pub http: serving::HttpSettings,
}

impl EngineConfig {
    /// Checks the settings; returns the identity secret.
    pub fn validate(&self) -> anyhow::Result<Secret> {
        if self.speedup > 1_000_000 {
            bail!(
                "ENGINE_SPEEDUP must be between 0 and 1000000, got {}",
                self.speedup
            );
        }
        let Some(secret) = &self.identity_secret else {
            bail!("ENGINE_IDENTITY_SECRET is required: the secret shared with the gateway (identity_secret_env of its upstream), at least {MIN_SECRET_BYTES} bytes");
        };
        Secret::new(secret.as_bytes()).map_err(|e| anyhow!("ENGINE_IDENTITY_SECRET {e}"))
    }
}
