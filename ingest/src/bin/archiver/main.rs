use std::process::ExitCode;

use chrono::Utc;
use clap::{Parser, Subcommand};
use ingest::archive::ArchiverConfig;
use ingest::session::println_json;
use serving::shutdown_signal;

/// Meterline archiver: billed usage (what ingest committed to request_log)
/// into Parquet files listed in a Postgres manifest, each request once.
#[derive(Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    config: ArchiverConfig,
}

#[derive(Subcommand)]
enum Command {
    /// Archive until SIGTERM or Ctrl-C (the default).
    Run,
    /// Check the files against the manifest and request_log; list orphans.
    /// Prints a JSON report; exits 1 on a missing, altered or doubled file
    /// or row, or a request_log row neither queued nor archived.
    Verify,
    /// Delete retired files and orphans older than ARCHIVE_GC_GRACE_SECS.
    Gc,
    /// Compact every hour whose end is ARCHIVE_COMPACT_SETTLE_SECS old, once.
    Compact,
}

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
    let cli = Cli::parse();
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
