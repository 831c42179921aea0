//! The Parquet archive of the usage topic: every valid event, as it came,
//! one file per (batch, partition, UTC hour), listed in a manifest
//! in Postgres. See [`plan`] for how a batch is cut and what is archived,
//! [`manifest`] for when a file becomes visible.

pub mod archiver;
pub mod config;
pub mod manifest;
pub mod plan;
pub mod service;
pub mod store;
pub mod telemetry;
pub mod verify;
pub mod writer;

pub use config::ArchiverConfig;
