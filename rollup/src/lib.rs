//! rollup: what happens to stored usage over time.
//!
//! Layout:
//! - [`reconcile`]: request_log vs usage_hourly for a period, every difference listed
//!
//! Hour closing, late-data adjustments and partition retention are the
//! ingest issue's remaining work and will live here.

pub mod reconcile;
