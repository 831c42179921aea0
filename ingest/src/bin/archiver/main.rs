use std::process::ExitCode;

use chrono::Utc;
use ingest::archive::cli::{Cli, Command};
use ingest::session::println_json;
use serving::shutdown_signal;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            // One line that says what is wrong, not a stack trace.
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        // Logs to stderr: `verify`, `gc` and `compact` print JSON on stdout.
        .with_writer(std::io::stderr)
        .init();
    let cli: Cli = serving::retired::parse()?;
    let config = cli.config;
    let command = cli.command.unwrap_or(Command::Run);
    if matches!(command, Command::Run) {
        ingest::archive::service::run(config, shutdown_signal()).await?;
        return Ok(ExitCode::SUCCESS);
    }
    config.validate()?;
    let store = archive::store::open(&config.url)?;
    let pool = schema::connect(&config.database_url, 2, std::time::Duration::from_secs(10)).await?;
    match command {
        Command::Run => {}
        Command::Gc => {
            let collected = archive::verify::gc(&pool, &store, config.grace(), Utc::now()).await?;
            println_json(&collected)?;
        }
        Command::Compact => {
            let done =
                archive::compact::compact_due(&pool, &store, Utc::now(), config.policy(), false)
                    .await?;
            println_json(&done)?;
        }
        Command::Verify => {
            let report = archive::verify::verify(&pool, &store).await?;
            println_json(&report)?;
            if !report.ok() {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
