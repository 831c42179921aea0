//! The archive's processes in tests: starting an archiver on a store, and
//! waiting until ingest has consumed what was produced and the archiver
//! has archived what ingest committed.

use std::time::Duration;

use crate::process::free_port;
use crate::{Service, TestStack};

/// Starts an archiver on `url` (with `extra` settings, e.g. an S3
/// server's credentials); returns it and its metrics port.
pub fn start_archiver(
    stack: &TestStack,
    name: &str,
    url: &str,
    extra: &[(String, String)],
) -> (Service, u16) {
    let mut env = stack.env();
    env.insert("ARCHIVE_URL".into(), url.to_owned());
    let port = free_port();
    env.insert("ARCHIVE_METRICS_ADDR".into(), format!("127.0.0.1:{port}"));
    env.extend(extra.iter().cloned());
    let svc = Service::start(name, "archiver", &[], env, stack.dir.path())
        .unwrap_or_else(|e| panic!("{e}"));
    (svc, port)
}

/// Waits until ingest has consumed `total` messages of the stack's topic.
pub async fn wait_consumed(stack: &TestStack, total: i64, svc: &Service) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let n = stack
            .count("SELECT coalesce(sum(next_offset), 0)::bigint FROM consumer_offsets")
            .await;
        if n == total {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "ingest consumed {n} of {total}:\n{}",
            svc.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until nothing waits in `archive_queue`.
pub async fn wait_archived(stack: &TestStack, svc: &Service) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let n = stack.count("SELECT count(*) FROM archive_queue").await;
        if n == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} rows still queued:\n{}",
            svc.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
