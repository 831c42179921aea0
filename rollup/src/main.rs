use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use clap::{Parser, Subcommand};
use rollup::{hours, reconcile, retention, service};

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
    /// How long after an hour's end (by the watermark) it stays open for late events.
    #[arg(long, env = "ROLLUP_LATENESS_MINUTES", default_value_t = 10)]
    lateness_minutes: u32,
    /// Days of request_log kept; older day partitions are dropped.
    #[arg(long, env = "ROLLUP_KEEP_DAYS", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    keep_days: u32,
    /// Keep a due request_log day until the Parquet archive has covered it
    /// (none of its ids waits in archive_queue). `false` only for a
    /// deployment that runs no archiver.
    #[arg(long, env = "ROLLUP_REQUIRE_ARCHIVE", default_value_t = true, action = clap::ArgAction::Set)]
    require_archive: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Close hours and apply retention on a schedule, until SIGTERM or Ctrl-C.
    Run {
        #[arg(long, default_value_t = 30)]
        tick_seconds: u64,
    },
    /// Close every hour the watermark has passed, once.
    CloseHours,
    /// Drop request_log day partitions older than --keep-days, once.
    Retention,
    /// Compare request_log, usage_hourly and the Parquet archive for
    /// [from, to); exit 1 listing every difference (JSON, one per line on
    /// stdout) if they disagree.
    Reconcile {
        #[arg(long)]
        from: DateTime<Utc>,
        #[arg(long)]
        to: DateTime<Utc>,
        /// The archive (the archiver's `ARCHIVE_URL`: a directory,
        /// `file:///…` or `s3://bucket/prefix`); `off` compares request_log
        /// with usage_hourly only.
        #[arg(long, env = "ARCHIVE_URL", default_value = ".stack/archive")]
        archive_url: String,
    },
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
        // Logs on stderr: the subcommands print JSON on stdout.
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
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
