//! Every binary a deployment or a developer runs, with its command line as
//! its own crate defines it (each crate keeps its `Cli` in its library for
//! this). A new binary is added here, and the drift test fails until its
//! settings are in the reference.

use clap::{Command, CommandFactory};

/// One binary: its name as installed, and its clap command.
pub struct Binary {
    pub name: &'static str,
    /// What it is for, one line.
    pub role: &'static str,
    pub command: Command,
}

/// All of them, in the order the reference lists them.
pub fn all() -> Vec<Binary> {
    vec![
        Binary {
            name: "gateway-lite",
            role: "the OpenAI-compatible edge: admits, runs and meters every request",
            command: gateway_lite::cli::Cli::command(),
        },
        Binary {
            name: "engine",
            role: "the simulated GPU engine as a stand-alone server",
            command: engine::cli::EngineConfig::command(),
        },
        Binary {
            name: "ingest",
            role: "the topic into Postgres: request_log and the hourly rollups, exactly once",
            command: ingest::cli::Cli::command(),
        },
        Binary {
            name: "archiver",
            role: "request_log into the Parquet archive, following archive_queue",
            command: ingest::archive::cli::Cli::command(),
        },
        Binary {
            name: "rollup",
            role: "closes hours, keeps request_log's retention, reconciles",
            command: rollup::cli::Cli::command(),
        },
        Binary {
            name: "billing-api",
            role: "invoices, shadow bills, lookups, tenants and tokens; the pages",
            command: billing_api::cli::Cli::command(),
        },
        Binary {
            name: "audit",
            role: "recomputes invoices from the Parquet archive, independently",
            command: audit::cli::Cli::command(),
        },
        Binary {
            name: "demo",
            role: "the main job: a backfilled, invoiced month and live traffic",
            command: demo::cli::Cli::command(),
        },
        Binary {
            name: "devstack",
            role: "the local stack: Postgres, the broker, Redis (`scripts/stack.sh`)",
            command: devstack::cli::Cli::command(),
        },
    ]
}
