//! The audit: every tenant's invoice for a month recomputed from the
//! Parquet archive and compared, line by line and in total, to the cent,
//! with billing's (the finalized invoice, or a draft read now).
//!
//! **Independence is in the data path.** Usage comes from the archive's
//! live files, aggregated by a query engine (DataFusion) — not from
//! usage_hourly, dedicated_usage_hourly or request_log, which billing
//! reads. Replica capacity (reserved replicas' GPU time, the fleet's idle
//! time) comes from the replica reports themselves (`replica_reports`,
//! one row per report), not from the hourly tables ingest derives from
//! them. What is taken from billing's own tables is configuration and
//! what was issued: tenants, budgets, price books, and the finalized
//! invoices whose amounts later adjustments are measured against. The
//! price arithmetic is billing's pure rating (`billing_api::rating`, the
//! grace and overhead rules), so a difference found is a difference in the
//! data, not in two implementations of rounding.
//!
//! **Which usage is on which invoice.** A finalized invoice holds exactly
//! the usage ingested before its `finalized_at` (billing reads its draft
//! under ingest's lock, at that instant); a draft holds what was ingested
//! before the instant the audit reads it. The audit classifies archived
//! rows by `ingested_at` against every such instant at once (one scan), so
//! late usage lands where the invoices put it: on the adjustment line of
//! the first invoice finalized after it arrived.
//!
//! Layout:
//! - [`scan`]: the archive, hour by hour, through DataFusion
//! - [`inputs`]: what the audit reads from Postgres (its one home for SQL)
//! - [`recompute`]: an invoice from the scan and the inputs
//! - [`compare`]: recomputed against billing's, as a list of differences
//! - [`run`]: one month's audit, end to end
//! - [`error`]: the crate's error

pub mod cli;
pub mod compare;
pub mod error;
pub mod inputs;
pub mod recompute;
pub mod run;
pub mod scan;

pub use error::AuditError;
