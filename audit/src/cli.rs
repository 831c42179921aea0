//! The `audit` binary's command line: its settings, each a flag and an
//! environment variable, and its subcommands. Kept in the library so the
//! settings reference (`docs/settings.md`) is generated from this
//! definition.

use clap::Parser;

/// Meterline audit: invoices proven from the archive.
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
    /// The archive: a directory, `file:///…` or `s3://bucket/prefix` (the
    /// archiver's `ARCHIVE_URL`).
    #[arg(long, env = "ARCHIVE_URL", default_value = ".stack/archive")]
    pub archive_url: String,
    /// The month to audit, `YYYY-MM`.
    #[arg(long)]
    pub month: String,
    /// Audit only these tenants (repeatable); all by default.
    #[arg(long = "tenant")]
    pub tenants: Vec<String>,
    /// How long to wait for the archiver to catch up with what the
    /// invoices hold before giving up.
    #[arg(long, default_value_t = 60)]
    pub wait_seconds: u64,
}
