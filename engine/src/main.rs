//! `engine`: the simulated GPU engine over HTTP (OpenAI-compatible API and
//! vLLM-named metrics). Parses config, builds, runs.

use std::sync::Arc;

use anyhow::Context;
use engine::cli::EngineConfig;
use engine::{ModelProfile, Simulator};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let config: EngineConfig = serving::retired::parse()?;
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
