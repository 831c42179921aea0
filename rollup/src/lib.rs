//! rollup: what happens to stored usage over time. It never consumes Kafka.
//!
//! Layout:
//! - [`hours`]: closing hours once the watermark passes them; late usage marks them adjusted
//! - [`retention`]: dropping request_log day partitions past the kept window
//! - [`service`]: the loop that does both on a schedule
//! - [`reconcile`]: request_log, usage_hourly and the archive for a period, every difference listed
//!
//! Invariant: closing hours and dropping partitions take the usage lock
//! exclusively, so they never interleave with an ingest batch.

pub mod cli;
pub mod hours;
pub mod reconcile;
pub mod retention;
pub mod service;
