use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ingest::archive::{store, verify, ArchiverConfig};
use ingest::offsets::ConsumerKey;
use ingest::session::println_json;
use serving::shutdown_signal;

/// Meterline archiver: usage events from Kafka into Parquet files listed in
/// a Postgres manifest, exactly once.
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
    /// Check the manifest against the files; list orphans. Prints a JSON
    /// report; exits 1 if a range is missing or overlaps, or a file is
    /// missing or differs.
    Verify,
    /// Delete orphan files whose offsets the archive has already passed.
    Gc,
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
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,rdkafka=warn".into()),
        )
        // Logs to stderr: `verify` and `gc` print their JSON report on stdout.
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let config = cli.config;
    match cli.command.unwrap_or(Command::Run) {
        Command::Run => ingest::archive::service::run(config, shutdown_signal()).await?,
        command @ (Command::Verify | Command::Gc) => {
            config.validate()?;
            let store = store::open(&config.url)?;
            let pool = schema::connect(&config.database_url, 2, std::time::Duration::from_secs(10))
                .await?;
            let key = ConsumerKey {
                group: config.group.clone(),
                topic: config.topic.clone(),
            };
            if matches!(command, Command::Gc) {
                let deleted = verify::gc(&pool, store.as_ref(), &key).await?;
                println_json(&serde_json::json!({ "deleted": deleted }))?;
            } else {
                let report = verify::verify(&pool, store.as_ref(), &key).await?;
                println_json(&report)?;
                if !report.ok() {
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
