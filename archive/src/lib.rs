//! The Parquet archive of billed usage: one row per request that ingest
//! committed to `request_log`, kept for years on a local directory or any
//! S3-compatible store, listed in a manifest in Postgres.
//!
//! The rule the archive keeps: **a request is in the archive once it is in
//! request_log, with the figures usage_hourly counted, exactly once.** Rows
//! enter the archive queue with their request_log insert (a trigger, same
//! statement: one `archive_queue_batches` row holding the statement's ids);
//! the archiver writes queued rows to files and, in one transaction, takes
//! those queue rows off and lists the files. So a
//! `sum` over the archive's live files plus what is still queued equals the
//! sum over request_log, and so over usage_hourly.
//!
//! Layout:
//! - [`format`]: a row ([`ArchivedRequest`]) ↔ Arrow ↔ Parquet, batch and
//!   compacted layouts, reading files of older schemas (missing columns null)
//! - [`store`]: `ARCHIVE_URL` → an `object_store` store (directory or `s3://`)
//! - [`manifest`]: the files table: listing live files, committing a batch
//!   against the queue, swapping compacted files in
//! - [`queue`]: reading queued request_log rows (`archive_queue`, the view of
//!   queued ids, is for readers elsewhere)
//! - [`reclaim`]: vacuuming what the archiver took off the queue
//! - [`archiver`]: one batch, queue → files → manifest
//! - [`compact`]: merging a closed day's files into few large ones
//! - [`reader`]: lookup of one request, scans of a period
//! - [`verify`]: checking files against the manifest and request_log; gc
//! - [`error`]: the crate's error

pub mod archiver;
pub mod compact;
pub mod error;
pub mod format;
pub mod manifest;
pub mod queue;
pub mod reader;
pub mod reclaim;
pub mod store;
pub mod verify;

pub use error::ArchiveError;
pub use format::ArchivedRequest;
