use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};

/// Meterline rollup: stored usage over time.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// Postgres URL.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/meterline"
    )]
    database_url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compare request_log with usage_hourly for [from, to); exit 1 listing
    /// every difference if they disagree.
    Reconcile {
        #[arg(long)]
        from: DateTime<Utc>,
        #[arg(long)]
        to: DateTime<Utc>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    let pool = schema::connect(&cli.database_url, 2, Duration::from_secs(30)).await?;
    match cli.command {
        Command::Reconcile { from, to } => {
            anyhow::ensure!(to > from, "--to must be after --from");
            let diffs = rollup::reconcile::reconcile(&pool, from, to).await?;
            for d in &diffs {
                tracing::error!(difference = %serde_json::to_string(d)?, "request_log and usage_hourly disagree");
            }
            if diffs.is_empty() {
                tracing::info!(%from, %to, "request_log and usage_hourly agree");
                Ok(ExitCode::SUCCESS)
            } else {
                tracing::error!(count = diffs.len(), "reconciliation failed");
                Ok(ExitCode::FAILURE)
            }
        }
    }
}
