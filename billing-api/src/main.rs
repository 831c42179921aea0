use billing_api::BillingConfig;
use clap::Parser;

/// Meterline billing-api.
#[derive(Parser)]
#[command(version)]
struct Cli {
    #[command(flatten)]
    config: BillingConfig,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    billing_api::service::run(cli.config, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
