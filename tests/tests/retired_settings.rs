//! A setting the code no longer reads must not be silently ignored: a
//! deployment still setting one is stopped at start, the error naming the
//! setting and what replaced it. Each retired setting is set on its own
//! binary, started as a deployment starts it; the settings reference's
//! drift test checks that every retired setting appears here.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::collections::HashMap;
use std::time::Duration;

/// (binary, its arguments, the retired setting, a value, words of what
/// replaced it that the error must carry).
const CASES: &[(&str, &[&str], &str, &str, &str)] = &[
    (
        "gateway-lite",
        &[],
        "GATEWAY_TENANTS_FILE",
        "config/tenants.yaml",
        "billing-api tenants apply",
    ),
    (
        "archiver",
        &[],
        "ARCHIVE_TOPIC",
        "usage.events.v1",
        "archive_queue",
    ),
    (
        "archiver",
        &["run"],
        "ARCHIVE_GROUP",
        "meterline-archiver",
        "archive_queue",
    ),
    (
        "archiver",
        &[],
        "ARCHIVE_MAX_BYTES",
        "67108864",
        "ARCHIVE_MAX_BATCH",
    ),
    (
        "rollup",
        &["run"],
        "ROLLUP_ARCHIVE_GROUP",
        "meterline-archiver",
        "ROLLUP_REQUIRE_ARCHIVE",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_setting_stops_its_binary_naming_it_and_its_replacement() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (bin, args, setting, value, replacement)) in CASES.iter().enumerate() {
        // Nothing else is set: the refusal comes before any connection.
        let env = HashMap::from([(setting.to_string(), value.to_string())]);
        let name = format!("{bin}-{i}");
        let mut service = tests::Service::start(&name, bin, args, env, dir.path())
            .unwrap_or_else(|e| panic!("{e}"));
        let status = service
            .wait_exit(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("{bin} with {setting} set did not stop"));
        assert!(!status.success(), "{bin} with {setting} set exited 0");
        let log = service.log_text();
        assert!(
            log.contains(&format!("{setting} is retired")) && log.contains(replacement),
            "{bin} with {setting} set: {log}"
        );
    }
}
