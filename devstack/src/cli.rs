//! The `devstack` binary's command line: its settings, each a flag and an
//! environment variable, and its subcommands. Kept in the library so the
//! settings reference (`docs/settings.md`) is generated from this
//! definition.

use clap::{Parser, Subcommand};

/// The local Meterline stack: Postgres, the Nisshi broker, Redis.
#[derive(Parser)]
pub struct Cli {
    /// The checkout whose `.stack/` holds the state (default: the current directory).
    #[arg(long, env = "METERLINE_ROOT", default_value = ".")]
    pub root: std::path::PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Start what is missing (safe to run again) and write .stack/env.
    Up,
    /// Stop what `up` started (never the machine's own servers).
    Down,
    /// One line per component; exit 1 if something is not running.
    Status,
    /// Print .stack/env (source it: `. .stack/env`).
    Env,
    /// Print the path of the broker binary, building it once if needed.
    NisshiPath,
}
