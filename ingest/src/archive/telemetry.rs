//! The archiver's Prometheus metrics (no labels).

use std::time::Duration;

use metrics::{counter, gauge, histogram};

pub const FILES: &str = "archive_files_total";
pub const ROWS: &str = "archive_rows_total";
pub const BYTES: &str = "archive_bytes_total";
pub const COMMIT_SECONDS: &str = "archive_commit_seconds";
pub const BATCH_SECONDS: &str = "archive_batch_seconds";
pub const ERRORS: &str = "archive_errors_total";
pub const LOST: &str = "archive_lost_batches_total";
pub const COMPACTIONS: &str = "archive_compactions_total";
pub const LAG: &str = "archive_lag";
pub const VACUUM_SECONDS: &str = "archive_queue_vacuum_seconds";

/// Bucket bounds of `archive_batch_seconds` (read, encode, write and
/// commit): a batch of 100,000 rows takes about a second. The recorder,
/// shared with ingest, is set up by [`crate::telemetry::install`].
pub const BATCH_SECONDS_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Describes the metrics so `/metrics` carries HELP lines.
pub fn describe() {
    metrics::describe_counter!(FILES, "Parquet files committed to the archive by batches");
    metrics::describe_counter!(ROWS, "Requests committed to the archive");
    metrics::describe_counter!(
        BYTES,
        "Bytes of Parquet committed to the archive by batches"
    );
    metrics::describe_histogram!(
        COMMIT_SECONDS,
        "Time of the manifest and queue transaction in Postgres"
    );
    metrics::describe_histogram!(
        BATCH_SECONDS,
        "Time to read, encode, write and commit one batch"
    );
    metrics::describe_counter!(
        ERRORS,
        "Batches or compactions that failed and were retried"
    );
    metrics::describe_counter!(
        LOST,
        "Batches another archiver committed first (their files are orphans)"
    );
    metrics::describe_counter!(COMPACTIONS, "Hours compacted and swapped in");
    metrics::describe_gauge!(
        LAG,
        "Rows in request_log not archived yet (the archive queue)"
    );
    metrics::describe_histogram!(
        VACUUM_SECONDS,
        "Time of each VACUUM of the archive queue the archiver ran (at start, after draining it)"
    );
}

/// Exports every counter at 0 before the first batch (histograms appear
/// with their first observation).
pub fn register() {
    for name in [FILES, ROWS, BYTES, ERRORS, LOST, COMPACTIONS] {
        counter!(name).increment(0);
    }
}

/// What one committed batch added.
#[derive(Debug, Default, Clone)]
pub struct Committed {
    pub files: u64,
    pub rows: u64,
    pub bytes: u64,
}

pub fn record_batch(c: &Committed, commit: Duration, total: Duration) {
    counter!(FILES).increment(c.files);
    counter!(ROWS).increment(c.rows);
    counter!(BYTES).increment(c.bytes);
    histogram!(COMMIT_SECONDS).record(commit.as_secs_f64());
    histogram!(BATCH_SECONDS).record(total.as_secs_f64());
}

pub fn record_lost() {
    counter!(LOST).increment(1);
}

pub fn record_error() {
    counter!(ERRORS).increment(1);
}

pub fn record_compactions(n: u64) {
    counter!(COMPACTIONS).increment(n);
}

pub fn record_vacuum(took: Duration) {
    histogram!(VACUUM_SECONDS).record(took.as_secs_f64());
}

pub fn record_lag(queued: i64) {
    gauge!(LAG).set(queued as f64);
}
