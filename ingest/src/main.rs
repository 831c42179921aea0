use ingest::cli::{Cli, Command};
use ingest::session::println_json;
use ingest::{dead_letters, redrive};
use serving::shutdown_signal;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            // One line that says what is wrong, not a stack trace.
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run() -> anyhow::Result<std::process::ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,rdkafka=warn".into()),
        )
        // Logs on stderr: the subcommands print JSON on stdout.
        .with_writer(std::io::stderr)
        .init();
    let cli: Cli = serving::retired::parse()?;
    match cli.command.unwrap_or(Command::Run) {
        Command::Run => ingest::service::run(cli.config, shutdown_signal()).await?,
        Command::DeadLetters { reason, limit } => {
            let pool = schema::connect(
                &cli.config.database_url,
                2,
                std::time::Duration::from_secs(10),
            )
            .await?;
            for dl in dead_letters::list_open(&pool, reason.as_deref(), limit).await? {
                println_json(&dl)?;
            }
        }
        Command::Redrive { reason } => {
            let pool = schema::connect(
                &cli.config.database_url,
                2,
                std::time::Duration::from_secs(10),
            )
            .await?;
            let report = redrive::redrive(&pool, reason.as_deref()).await?;
            println_json(&report)?;
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}
