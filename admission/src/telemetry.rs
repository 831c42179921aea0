//! The metrics admission records, through the `metrics` facade (the
//! gateway installs the Prometheus recorder and serves `/metrics`): queue
//! depth, the ladder, the limits mode and peers, Redis calls, active
//! requests, and the names of the shared GPU-time ledger's counters.

use metrics::{counter, gauge};

pub const UPSTREAM_SHARED_BUSY: &str = "gateway_upstream_shared_busy_gpu_seconds_total";
pub const UPSTREAM_SHARED_ATTRIBUTED: &str = "gateway_upstream_shared_attributed_gpu_seconds_total";
pub const UPSTREAM_SHARED_REAPED: &str = "gateway_upstream_shared_reaped_gpu_seconds_total";

/// Requests waiting in `model`'s fair queue.
pub fn queued(model: &str, depth: usize) {
    gauge!("gateway_queue_depth", "model" => model.to_owned()).set(depth as f64);
}

/// The ladder's shares and whether a pool is saturated.
pub fn ladder(model: &str, percent: &[u32; 5], saturated: bool) {
    for (i, p) in percent.iter().enumerate() {
        gauge!("gateway_priority_rate_percent", "model" => model.to_owned(), "priority" => (i + 1).to_string())
            .set(f64::from(*p));
    }
    gauge!("gateway_pool_saturated", "model" => model.to_owned()).set(if saturated {
        1.0
    } else {
        0.0
    });
}

pub fn limits_mode(mode: &'static str) {
    for m in ["shared", "local"] {
        gauge!("gateway_limits_mode", "mode" => m).set(if m == mode { 1.0 } else { 0.0 });
    }
}

pub fn peers(n: u32) {
    gauge!("gateway_peers").set(f64::from(n));
}

pub fn closed_peers(n: u32) {
    gauge!("gateway_peers_fail_closed").set(f64::from(n));
}

pub fn redis_call(purpose: &'static str) {
    counter!("gateway_redis_calls_total", "purpose" => purpose).increment(1);
}

pub fn active_requests(tenant: &str, n: u32) {
    gauge!("gateway_active_requests", "tenant" => tenant.to_owned()).set(f64::from(n));
}

/// A label value escaped for the text format.
pub fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
