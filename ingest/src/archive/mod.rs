//! The archiver process (`archiver` binary): it archives what ingest
//! committed. Rows enter `archive_queue` with their request_log insert; the
//! archiver writes them to Parquet, one file per batch and UTC hour of
//! their request ids, lists the files and takes the ids off the queue in
//! one transaction (the `archive` crate), compacts closed hours and
//! collects retired files and orphans after their grace period.

pub mod config;
pub mod service;
pub mod telemetry;

pub use config::ArchiverConfig;
