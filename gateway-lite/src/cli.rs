//! The `gateway-lite` binary's command line: its settings, each a flag and an
//! environment variable, and its subcommands. Kept in the library so the
//! settings reference (`docs/settings.md`) is generated from this
//! definition.

use clap::Parser;

use crate::GatewayConfig;

/// Meterline gateway-lite: the OpenAI-compatible edge that meters every request.
#[derive(Parser)]
#[command(version)]
pub struct Cli {
    #[command(flatten)]
    pub config: GatewayConfig,
}
