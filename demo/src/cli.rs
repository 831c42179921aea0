//! The `demo` binary's command line: its settings, each a flag and an
//! environment variable with a working default, and its subcommands. Kept
//! in the library so the settings reference (`docs/settings.md`) is
//! generated from this definition.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// The demo's settings; every one has a working default.
#[derive(Parser)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The checkout: `config/` holds the tenants and the price book.
    #[arg(long, env = "METERLINE_ROOT", default_value = ".")]
    pub root: PathBuf,
    /// The services' pid files, logs and the gateway's outbox (default `<root>/.stack/demo`).
    #[arg(long, env = "DEMO_RUN_DIR")]
    pub run_dir: Option<PathBuf>,
    /// Where the archiver writes Parquet (default `<root>/.stack/archive`).
    #[arg(long, env = "ARCHIVE_URL")]
    pub archive_url: Option<String>,
    /// Where the demo's gateway listens.
    #[arg(long, env = "GATEWAY_ADDR", default_value = "127.0.0.1:8080")]
    pub gateway_addr: String,
    /// Where the demo's billing-api listens.
    #[arg(long, env = "BILLING_ADDR", default_value = "127.0.0.1:8082")]
    pub billing_addr: String,
    /// Where the demo's ingest serves `/metrics`.
    #[arg(long, env = "INGEST_METRICS_ADDR", default_value = "127.0.0.1:9101")]
    pub ingest_metrics_addr: String,
    /// Where the demo's archiver serves `/metrics`.
    #[arg(long, env = "ARCHIVE_METRICS_ADDR", default_value = "127.0.0.1:9102")]
    pub archive_metrics_addr: String,
    /// Postgres for every service the demo starts.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/meterline"
    )]
    pub database_url: String,
    /// The broker every service the demo starts uses.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// The topic the gateway publishes to and the backfill produces to.
    #[arg(long, env = "GATEWAY_TOPIC", default_value = "usage.events.v1")]
    pub topic: String,
    /// The finance token billing-api registers and the demo signs in with.
    #[arg(
        long,
        env = "BILLING_BOOTSTRAP_FINANCE_TOKEN",
        default_value = "demo-finance-token-0001"
    )]
    pub finance_token: String,
    /// The bearer token billing-api's `/metrics` asks for (the demo prints it).
    #[arg(
        long,
        env = "BILLING_METRICS_TOKEN",
        default_value = "demo-metrics-token-0001"
    )]
    pub metrics_token: String,
    /// Events in the backfilled month.
    #[arg(long, env = "DEMO_BACKFILL_EVENTS", default_value_t = 2_000_000)]
    pub backfill_events: u64,
    /// Requests a replica runs at once in the backfilled month, which sets
    /// each request's share of the replica's GPU time (see `workload::fleet`).
    #[arg(long, env = "DEMO_BACKFILL_CONCURRENCY", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub backfill_concurrency: u32,
    /// The sample's seed (the same seed gives the same month).
    #[arg(long, env = "DEMO_SEED", default_value_t = 1)]
    pub seed: u64,
    /// Seconds of live traffic.
    #[arg(long, env = "DEMO_SECONDS", default_value_t = 10)]
    pub seconds: u64,
    /// Live traffic runs at the reference rates divided by this.
    #[arg(long, env = "DEMO_RATE_DIVISOR", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub rate_divisor: u32,
    /// `ENGINE_SPEEDUP` of the gateway's simulated engines.
    #[arg(long, env = "ENGINE_SPEEDUP", default_value = "20")]
    pub engine_speedup: String,
}

#[derive(Subcommand)]
pub enum Command {
    /// Start the services, backfill and finalize the month, drive traffic (the default).
    Run,
    /// Stop the services an earlier run left running.
    Stop,
}
