//! Ingest's Prometheus metrics. Labels are bounded: outcome, reason code
//! and partition number, never request ids.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

use crate::store::Counts;

pub const EVENTS: &str = "ingest_events_total";
pub const BATCH_SIZE: &str = "ingest_batch_size";
pub const COMMIT_SECONDS: &str = "ingest_commit_seconds";
pub const COMMIT_ERRORS: &str = "ingest_commit_errors_total";
pub const LAG: &str = "ingest_consumer_lag";
pub const OFFSETS_MISMATCHED: &str = "ingest_offsets_mismatched_total";

/// Describes the metrics so `/metrics` carries HELP lines.
pub fn describe() {
    metrics::describe_counter!(
        EVENTS,
        "Messages ingested, by outcome: inserted, duplicate, conflict, dead_lettered"
    );
    metrics::describe_histogram!(BATCH_SIZE, "Messages per committed batch");
    metrics::describe_histogram!(COMMIT_SECONDS, "Time to commit one batch to Postgres");
    metrics::describe_counter!(COMMIT_ERRORS, "Batch commits that failed and were retried");
    metrics::describe_counter!(
        OFFSETS_MISMATCHED,
        "Partitions whose stored offsets differed from the positions held (Postgres lost commits, or another consumer moved them); each made ingest rejoin"
    );
    metrics::describe_gauge!(
        LAG,
        "Messages between the broker's high watermark and the offset committed in Postgres"
    );
}

pub fn record_batch(size: usize, took: Duration, counts: &Counts) {
    histogram!(BATCH_SIZE).record(size as f64);
    histogram!(COMMIT_SECONDS).record(took.as_secs_f64());
    for (outcome, n) in [
        ("inserted", counts.inserted),
        ("duplicate", counts.duplicates),
        ("conflict", counts.conflicts),
        ("dead_lettered", counts.dead_lettered),
    ] {
        counter!(EVENTS, "outcome" => outcome).increment(n);
    }
}

pub fn record_offsets_mismatch(partitions: usize) {
    counter!(OFFSETS_MISMATCHED).increment(partitions as u64);
}

pub fn record_commit_error() {
    counter!(COMMIT_ERRORS).increment(1);
}

pub fn record_lag(partition: i32, lag: i64) {
    gauge!(LAG, "partition" => partition.to_string()).set(lag as f64);
}
