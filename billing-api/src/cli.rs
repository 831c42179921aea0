//! The `billing-api` binary's command line: its settings, each a flag and an
//! environment variable, and its subcommands. Kept in the library so the
//! settings reference (`docs/settings.md`) is generated from this
//! definition.

use clap::{Parser, Subcommand};

use crate::BillingConfig;

/// Meterline billing-api: serves the API and the pages; `token …`
/// administers billing tokens directly on the database (as finance, audited
/// as `cli`).
#[derive(Parser)]
#[command(version)]
pub struct Cli {
    #[command(flatten)]
    pub config: BillingConfig,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Billing tokens: issue, list, revoke.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Tenants, their keys and limits: `apply FILE` upserts a seed file
    /// shaped like `config/tenants.yaml`, validated as a whole first.
    #[command(subcommand)]
    Tenants(TenantsCommand),
}

#[derive(Subcommand)]
pub enum TenantsCommand {
    /// Validates the file and upserts every tenant, key and limit in it
    /// (one transaction; nothing is written if any tenant is refused).
    Apply { file: std::path::PathBuf },
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Issues a token and prints it (once; only its hash is stored).
    Issue {
        /// finance, team_lead or support.
        #[arg(long)]
        role: String,
        /// The tenant a team lead sees.
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long, default_value = "")]
        label: String,
    },
    /// Lists every token (never the token itself).
    List,
    /// Revokes a token; its page sessions end.
    Revoke { token_id: String },
}
