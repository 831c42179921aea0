//! Kafka → Postgres, exactly once.
//!
//! Every usage event on the consumed topic (`INGEST_TOPIC`, by default
//! `usage.events.v1`) becomes one `request_log` row and is added once to
//! `usage_hourly`; everything that can't be counted is kept in
//! `dead_letters` with its reason, filed under that topic. See
//! "Exactly-once, end to end" in the architecture notes.
//!
//! Layout:
//! - [`consumer`]: the group member on its own thread; start offsets come from Postgres
//! - [`batcher`]: size/time batches, retries, fencing
//! - [`batch`]: pure rules: decode, in-batch repeats, duplicate vs conflict, hourly sums
//! - [`store`]: the one transaction per batch
//! - [`request_rows`], [`hourly`]: its request_log insert, and one pass and
//!   one statement for the hourly rollups (usage_hourly, usage_key_hourly per
//!   API key, dedicated_usage_hourly) and the late hours
//! - [`unnest_path`]: the earlier statements for both, kept for `ingest-bench`'s
//!   before and after (`INGEST_WRITE_PATH=unnest`); [`write_path`] names
//!   which of the two a batch uses
//! - [`capacity`]: replica reports (idle and dedicated GPU time) and the
//!   usage that ran on dedicated replicas, in the same transaction
//! - [`offsets`]: offsets in Postgres, moved by compare-and-set
//! - [`dead_letters`]: store and list the messages that cannot be counted
//! - [`redrive`]: re-drive them after a fix, exactly once
//! - [`telemetry`]: Prometheus metrics
//! - [`service`], [`config`], [`error`]: the process around it
//! - [`session`]: what ingest and the archiver share as processes (metrics
//!   endpoint, the consumer-group session loop)
//! - [`archive`]: the Parquet archiver process (its own binary, `archiver`):
//!   it archives what ingest committed (request_log rows, through the
//!   archive queue), with the `archive` crate
//!
//! Invariants: a batch's rows, hourly deltas, dead letters and offsets commit
//! in one transaction or not at all; usage_hourly only ever receives rows
//! that `INSERT … ON CONFLICT DO NOTHING` actually inserted; a consumer whose
//! stored offset moved under it writes nothing. Every request_log row
//! enters the archive queue in the statement that inserts it (a trigger:
//! one `archive_queue_batches` row per statement); the archiver lists a
//! batch's files and takes its queue rows off in one transaction, after the
//! files are durably written.

pub mod archive;
pub mod batch;
pub mod batcher;
pub mod capacity;
pub mod cli;
pub mod config;
pub mod consumer;
pub mod dead_letters;
pub mod error;
pub mod hourly;
pub mod offsets;
pub mod redrive;
pub mod request_rows;
pub mod service;
pub mod session;
pub mod store;
pub mod telemetry;
pub mod unnest_path;
pub mod write_path;

pub use config::IngestConfig;
pub use error::IngestError;
