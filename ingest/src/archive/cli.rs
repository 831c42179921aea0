//! The `archiver` binary's command line: its settings, each a flag and an
//! environment variable, and its subcommands. Kept in the library so the
//! settings reference (`docs/settings.md`) is generated from this
//! definition.

use clap::{Parser, Subcommand};

use crate::archive::ArchiverConfig;

/// Meterline archiver: billed usage (what ingest committed to request_log)
/// into Parquet files listed in a Postgres manifest, each request once.
#[derive(Parser)]
#[command(version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub config: ArchiverConfig,
}

#[derive(Subcommand)]
pub enum Command {
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
