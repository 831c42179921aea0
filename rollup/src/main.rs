use std::process::ExitCode;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use rollup::cli::{Cli, Command};
use rollup::{hours, reconcile, retention, service};

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
        // Logs on stderr: the subcommands print JSON on stdout.
        .with_writer(std::io::stderr)
        .init();
    let cli: Cli = serving::retired::parse()?;
    let lateness = TimeDelta::minutes(i64::from(cli.lateness_minutes));
    let archive = if cli.require_archive {
        retention::ArchiveRule::Require
    } else {
        retention::ArchiveRule::Ignore
    };
    let pool = schema::connect(&cli.database_url, 2, Duration::from_secs(30)).await?;
    match cli.command {
        Command::Run { tick_seconds } => {
            let schedule = service::Schedule {
                tick: Duration::from_secs(tick_seconds.max(1)),
                lateness,
                keep_days: cli.keep_days,
                archive,
            };
            service::run(pool, schedule, serving::shutdown_signal()).await;
        }
        Command::CloseHours => {
            let report = hours::close(&pool, lateness).await?;
            tracing::info!(report = %serde_json::to_string(&report)?, "hours closed");
        }
        Command::Retention => {
            let today = Utc::now().date_naive();
            let days = retention::drop_expired(&pool, today, cli.keep_days, &archive).await?;
            tracing::info!(?days, "retention applied");
        }
        Command::Reconcile {
            from,
            to,
            archive_url,
        } => {
            anyhow::ensure!(to > from, "--to must be after --from");
            let store = match archive_url.as_str() {
                "off" => None,
                url => Some(
                    archive::store::open(url)
                        .map_err(|e| anyhow::anyhow!("ARCHIVE_URL {url:?}: {e}"))?,
                ),
            };
            let diffs = reconcile::reconcile(&pool, store.as_ref(), from, to).await?;
            for d in &diffs {
                #[expect(
                    clippy::print_stdout,
                    reason = "the command's answer, one JSON line per difference"
                )]
                {
                    println!("{}", serde_json::to_string(d)?);
                }
            }
            if !diffs.is_empty() {
                tracing::error!(
                    count = diffs.len(),
                    "reconciliation failed: the sources disagree"
                );
                return Ok(ExitCode::FAILURE);
            }
            tracing::info!(%from, %to, archive = store.is_some(), "request_log, usage_hourly and the archive agree");
        }
    }
    Ok(ExitCode::SUCCESS)
}
