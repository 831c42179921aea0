//! Ingest's Prometheus metrics. Labels are bounded: outcome, reason code
//! and partition number, never request ids.
//!
//! [`install`] sets up the recorder of both binaries, ingest and the
//! archiver: every histogram is a real histogram with explicit buckets,
//! never a summary (a summary whose window has emptied exports quantiles
//! of 0).

use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

use crate::archive::telemetry as archive;
use crate::store::Counts;

pub const EVENTS: &str = "ingest_events_total";
pub const BATCH_SIZE: &str = "ingest_batch_size";
pub const COMMIT_SECONDS: &str = "ingest_commit_seconds";
pub const COMMIT_ERRORS: &str = "ingest_commit_errors_total";
pub const LAG: &str = "ingest_consumer_lag";
pub const OFFSETS_MISMATCHED: &str = "ingest_offsets_mismatched_total";

/// Bucket bounds of the Postgres transaction times (`ingest_commit_seconds`,
/// `archive_commit_seconds`), and of any histogram not named below: a
/// batch commit takes ~70 ms at 5,000 messages, a manifest commit a few ms.
pub const COMMIT_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Bucket bounds of `ingest_batch_size`, up to `INGEST_MAX_BATCH`'s limit.
pub const BATCH_SIZE_BUCKETS: [f64; 12] = [
    1.0, 10.0, 50.0, 100.0, 500.0, 1_000.0, 2_000.0, 5_000.0, 10_000.0, 20_000.0, 50_000.0,
    100_000.0,
];

/// The recorder's builder, buckets set (see the module docs).
pub fn prometheus() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets(&COMMIT_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(BATCH_SIZE.into()), &BATCH_SIZE_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(archive::BATCH_SECONDS.into()),
            &archive::BATCH_SECONDS_BUCKETS,
        )
}

/// Installs [`prometheus`]'s recorder as the process' recorder.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    prometheus()?.install_recorder()
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distributions_render_as_histograms_with_their_buckets() {
        let recorder = prometheus().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            record_batch(5000, Duration::from_millis(70), &Counts::default());
            let committed = archive::Committed::default();
            archive::record_batch(&committed, Duration::from_millis(3), Duration::from_secs(2));
        });
        let text = handle.render();
        assert!(!text.contains("summary"), "{text}");
        for line in [
            "ingest_batch_size_bucket{le=\"5000\"} 1",
            "ingest_batch_size_bucket{le=\"2000\"} 0",
            "ingest_commit_seconds_bucket{le=\"0.075\"} 1",
            "archive_commit_seconds_bucket{le=\"0.005\"} 1",
            "archive_batch_seconds_bucket{le=\"2.5\"} 1",
            "archive_batch_seconds_bucket{le=\"1\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
    }
}
