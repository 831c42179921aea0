//! The `ingest` binary's command line: its settings, each a flag and an
//! environment variable, and its subcommands. Kept in the library so the
//! settings reference (`docs/settings.md`) is generated from this
//! definition.

use clap::{Parser, Subcommand};

use crate::IngestConfig;

/// Meterline ingest: usage events from Kafka into Postgres, exactly once.
#[derive(Parser)]
#[command(version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub config: IngestConfig,
}

#[derive(Subcommand)]
pub enum Command {
    /// Consume until SIGTERM or Ctrl-C (the default).
    Run,
    /// List open dead letters as JSON lines.
    DeadLetters {
        #[arg(long)]
        reason: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Re-drive open dead letters (of one reason, or all) after a fix.
    Redrive {
        #[arg(long)]
        reason: Option<String>,
    },
}
