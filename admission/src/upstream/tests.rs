//! The upstreams file and routing, tested.

#![allow(clippy::unwrap_used, reason = "tests fail loudly")]

use super::http::HttpUpstream;
use super::{config::*, router::*};
use engine::simulator::Simulator;
use std::sync::Arc;

fn file(body: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "meterline-upstreams-{}-{}.yaml",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::write(&path, body).unwrap();
    path
}

const TWO: &str = "upstreams:
  - {model: m, url: 'http://127.0.0.1:1', gpus: 1, max_context: 1000, replica_id: a}
  - {model: m, url: 'http://127.0.0.1:2', gpus: 1, max_context: 1000, replica_id: b}
";

/// The upstreams of an upstreams file `body`, without the simulator's.
fn upstreams(body: &str) -> Upstreams {
    let path = file(body);
    let models = load(&path).unwrap();
    std::fs::remove_file(&path).ok();
    Upstreams::new(Arc::new(Simulator::new(Vec::new(), 0)), models).unwrap()
}

#[test]
fn a_model_may_be_listed_once_per_replica() {
    let ups = upstreams(TWO);
    assert_eq!(ups.models().iter().filter(|m| m.name == "m").count(), 1);
    assert_eq!(ups.remote().len(), 2);
}

#[test]
fn a_replicas_kv_capacity_may_be_set_in_the_file() {
    let ups = upstreams(&TWO.replace("replica_id: a}", "replica_id: a, kv_tokens: 5000}"));
    assert_eq!(ups.remote()[0].occupancy.kv_tokens(), Some(5_000));
    assert_eq!(
        ups.remote()[1].occupancy.kv_tokens(),
        None,
        "read from its /metrics"
    );
}

#[test]
fn replicas_that_repeat_disagree_or_cannot_be_read_are_refused_naming_the_field() {
    for (body, needle) in [
        (
            TWO.replace("replica_id: b", "replica_id: a"),
            "the same replica",
        ),
        (
            TWO.replace(
                "max_context: 1000, replica_id: b",
                "max_context: 2000, replica_id: b",
            ),
            "another max_context",
        ),
        (
            TWO.replace("replica_id: b}", "replica_id: b, replica_reports: true}"),
            "replica_reports: true needs identity_secret_env",
        ),
        (
            TWO.replace("replica_id: b}", "replica_id: b, kv_tokens: 0}"),
            "kv_tokens must be 1 to",
        ),
    ] {
        let path = file(&body);
        let err = load(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).ok();
        assert!(
            err.contains("upstreams[1]") && err.contains(needle),
            "{err}"
        );
    }
}

#[test]
fn of_two_replicas_the_one_with_fewer_in_flight_goes_first() {
    let ups = upstreams(TWO);
    let replicas: Vec<&Arc<HttpUpstream>> = ups.remote().iter().collect();
    let _busy = replicas[0].ledger.join(100);
    for draw in 0..8 {
        let order = route(&replicas, 60, draw);
        assert_eq!(order[0].config.replica(), "b", "fewer in flight wins");
        assert_eq!(order.len(), 2);
    }
}

#[test]
fn what_was_sent_since_the_last_poll_counts_in_the_choice() {
    let ups = upstreams(TWO);
    let replicas: Vec<&Arc<HttpUpstream>> = ups.remote().iter().collect();
    for r in &replicas {
        r.occupancy.set_kv_tokens(10_000);
    }
    replicas[0].occupancy.set(1_000);
    replicas[1].occupancy.set(2_000);
    assert_eq!(
        route(&replicas, 60, 0)[0].config.replica(),
        "a",
        "a read emptier"
    );
    // A burst sent to a since: 1,500 of its 10,000 tokens.
    replicas[0].occupancy.sent(1_500);
    for draw in 0..8 {
        assert_eq!(route(&replicas, 60, draw)[0].config.replica(), "b");
    }
}
