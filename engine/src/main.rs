//! `engine`: the simulated GPU engine over HTTP (OpenAI-compatible API and
//! vLLM-named metrics). Parses config, builds, runs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use clap::Parser;
use engine::identity::{Secret, MIN_SECRET_BYTES};
use engine::{ModelProfile, Simulator};

/// Settings, each also an environment variable.
#[derive(Debug, Parser)]
#[command(
    name = "engine",
    about = "Simulated GPU inference engine with an OpenAI-compatible API"
)]
struct EngineConfig {
    /// Listen address.
    #[arg(long, env = "ENGINE_ADDR", default_value = "127.0.0.1:8081")]
    addr: SocketAddr,
    /// YAML or JSON file of model profiles (`profiles: [...]`); the reference profiles if unset.
    #[arg(long, env = "ENGINE_PROFILES")]
    profiles: Option<PathBuf>,
    /// Replicas per model over the profiles' own (`llama-3.1-70b=12,llama-3.1-8b=2`).
    #[arg(long, env = "ENGINE_REPLICAS")]
    replicas: Option<String>,
    /// Replicas dedicated to tenants (`llama-3.1-70b:acme-corp=4`).
    #[arg(long, env = "ENGINE_DEDICATED")]
    dedicated: Option<String>,
    /// Pacing: 1 = real time, N = N times faster, 0 = no waiting (figures unchanged).
    #[arg(long, env = "ENGINE_SPEEDUP", default_value_t = 1)]
    speedup: u32,
    /// Required: the secret shared with the gateway that signs `x-meterline-identity`
    /// (at least 32 bytes); chat completions without a valid identity are refused.
    #[arg(long, env = "ENGINE_IDENTITY_SECRET", hide_env_values = true)]
    identity_secret: Option<String>,
    /// Slow-client bounds and the shutdown grace of the listener.
    #[command(flatten)]
    http: serving::HttpSettings,
}

impl EngineConfig {
    /// Checks the settings; returns the identity secret.
    fn validate(&self) -> anyhow::Result<Secret> {
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let config = EngineConfig::parse();
    let secret = config.validate()?;
    let mut profiles = match &config.profiles {
        Some(path) => ModelProfile::load(path).context("ENGINE_PROFILES")?,
        None => ModelProfile::reference(),
    };
    if let Some(spec) = &config.replicas {
        ModelProfile::set_replicas(&mut profiles, spec).context("ENGINE_REPLICAS")?;
    }
    if let Some(spec) = &config.dedicated {
        ModelProfile::set_dedicated(&mut profiles, spec).context("ENGINE_DEDICATED")?;
    }
    let sim = Arc::new(Simulator::try_new(profiles, config.speedup)?);
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .with_context(|| format!("ENGINE_ADDR {}", config.addr))?;
    tracing::info!(addr = %config.addr, models = sim.models().len(), "engine listening");
    engine::server::run(
        listener,
        sim,
        secret,
        config.http,
        serving::shutdown_signal(),
    )
    .await
    .context("serving")?;
    Ok(())
}
