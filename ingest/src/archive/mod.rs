//! The archiver process (`archiver` binary): it archives what ingest
//! committed. Rows enter the archive queue with their request_log insert
//! (one `archive_queue_batches` row per statement); the archiver writes
//! them to Parquet, one file per batch and UTC hour of their request ids,
//! lists the files and takes the queue rows off in one transaction (the
//! `archive` crate), vacuums the queue after draining it, compacts closed
//! hours and collects retired files and orphans after their grace period.

pub mod cli;
pub mod config;
pub mod service;
pub mod telemetry;

pub use config::ArchiverConfig;
