//! The `rollup` binary's command line: its settings, each a flag and an
//! environment variable, and its subcommands. Kept in the library so the
//! settings reference (`docs/settings.md`) is generated from this
//! definition.

use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};

/// Meterline rollup: stored usage over time.
#[derive(Parser)]
#[command(version)]
pub struct Cli {
    /// Postgres URL.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/meterline"
    )]
    pub database_url: String,
    /// How long after an hour's end (by the watermark) it stays open for late events.
    #[arg(long, env = "ROLLUP_LATENESS_MINUTES", default_value_t = 10)]
    pub lateness_minutes: u32,
    /// Days of request_log kept; older day partitions are dropped.
    #[arg(long, env = "ROLLUP_KEEP_DAYS", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    pub keep_days: u32,
    /// Keep a due request_log day until the Parquet archive has covered it
    /// (none of its ids waits in archive_queue). `false` only for a
    /// deployment that runs no archiver.
    #[arg(long, env = "ROLLUP_REQUIRE_ARCHIVE", default_value_t = true, action = clap::ArgAction::Set)]
    pub require_archive: bool,
    /// Retention waits for `archive_queue` in Postgres
    /// (`ROLLUP_REQUIRE_ARCHIVE`), not for an archiver's consumer group.
    #[arg(long = "archive-group", env = "ROLLUP_ARCHIVE_GROUP", hide = true, help_heading = serving::retired::HEADING)]
    pub retired_archive_group: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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
