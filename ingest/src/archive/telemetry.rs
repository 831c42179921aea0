//! The archiver's Prometheus metrics. Labels are bounded: partition number
//! and violation code.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

pub const FILES: &str = "archive_files_total";
pub const ROWS: &str = "archive_rows_total";
pub const BYTES: &str = "archive_bytes_total";
pub const SKIPPED: &str = "archive_skipped_total";
pub const COMMIT_SECONDS: &str = "archive_commit_seconds";
pub const BATCH_SECONDS: &str = "archive_batch_seconds";
pub const ERRORS: &str = "archive_errors_total";
pub const LAG: &str = "archive_lag";

/// Bucket bounds of `archive_batch_seconds` (encode, write and commit): a
/// batch of 100,000 events takes about a second. The recorder, shared with
/// ingest, is set up by [`crate::telemetry::install`].
pub const BATCH_SECONDS_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Describes the metrics so `/metrics` carries HELP lines.
pub fn describe() {
    metrics::describe_counter!(FILES, "Parquet files committed to the archive");
    metrics::describe_counter!(ROWS, "Events committed to the archive");
    metrics::describe_counter!(BYTES, "Bytes of Parquet committed to the archive");
    metrics::describe_counter!(
        SKIPPED,
        "Messages not archived (undecodable or invalid), by violation code"
    );
    metrics::describe_histogram!(
        COMMIT_SECONDS,
        "Time of the manifest and offsets transaction in Postgres"
    );
    metrics::describe_histogram!(BATCH_SECONDS, "Time to encode, write and commit one batch");
    metrics::describe_counter!(
        ERRORS,
        "Batches that failed to write or commit and were retried"
    );
    metrics::describe_gauge!(
        LAG,
        "Messages between the broker's high watermark and the archive offset in Postgres"
    );
}

/// What one committed batch added.
#[derive(Debug, Default, Clone)]
pub struct Committed {
    pub files: u64,
    pub rows: u64,
    pub bytes: u64,
    pub skipped: Vec<(&'static str, u64)>,
}

pub fn record_batch(c: &Committed, commit: Duration, total: Duration) {
    counter!(FILES).increment(c.files);
    counter!(ROWS).increment(c.rows);
    counter!(BYTES).increment(c.bytes);
    for (code, n) in &c.skipped {
        counter!(SKIPPED, "reason" => *code).increment(*n);
    }
    histogram!(COMMIT_SECONDS).record(commit.as_secs_f64());
    histogram!(BATCH_SECONDS).record(total.as_secs_f64());
}

pub fn record_error() {
    counter!(ERRORS).increment(1);
}

pub fn record_lag(partition: i32, lag: i64) {
    gauge!(LAG, "partition" => partition.to_string()).set(lag as f64);
}
