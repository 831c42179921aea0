//! The gateway's Prometheus metrics (labels: tenant, model, status; never ids).

use metrics::{counter, gauge, histogram};
use usage_contract::UsageEvent;

pub fn describe() {
    metrics::describe_counter!(
        "gateway_requests_total",
        "Admitted requests, by tenant and model"
    );
    metrics::describe_histogram!("gateway_e2e_seconds", "End-to-end request time, by tenant");
    metrics::describe_histogram!(
        "gateway_ttft_seconds",
        "Time to first token reported by the engine, by tenant"
    );
    metrics::describe_gauge!(
        "gateway_active_requests",
        "Admitted requests in flight, by tenant"
    );
    metrics::describe_counter!(
        "gateway_rejections_total",
        "Requests turned away, by tenant and reason (requests, tokens, concurrency, no_capacity, idempotency_in_flight)"
    );
    metrics::describe_gauge!(
        "gateway_tokens_remaining",
        "Tokens left in the per-minute bucket at the last response, by tenant and model"
    );
    metrics::describe_gauge!("gateway_outbox_depth", "Usage events waiting in the outbox");
    metrics::describe_gauge!(
        "gateway_outbox_age_seconds",
        "Age of the oldest event in the outbox"
    );
    metrics::describe_counter!(
        "gateway_relay_published_total",
        "Usage events the broker acknowledged"
    );
    metrics::describe_counter!(
        "gateway_relay_errors_total",
        "Publish attempts that failed and will be retried"
    );
    metrics::describe_counter!(
        "gateway_upstream_busy_gpu_microseconds_total",
        "HTTP upstream replicas: busy wall time × GPUs, in micro-GPU-seconds (the ledger's whole)"
    );
    metrics::describe_counter!(
        "gateway_upstream_attributed_gpu_microseconds_total",
        "HTTP upstream replicas: micro-GPU-seconds handed to finished requests (equals busy when idle)"
    );
    metrics::describe_gauge!(
        "gateway_upstream_kv_usage_ratio",
        "HTTP upstream replicas: KV-cache usage last read from their /metrics (0-1)"
    );
    metrics::describe_gauge!(
        "gateway_upstream_in_flight",
        "HTTP upstream replicas: requests in flight"
    );
}

/// The HTTP upstreams' ledgers, read at scrape time.
pub fn upstreams(upstreams: &engine::upstream::Upstreams) {
    for u in upstreams.remote() {
        let replica = u.config.replica().to_owned();
        let model = u.config.model.clone();
        counter!("gateway_upstream_busy_gpu_microseconds_total", "model" => model.clone(), "replica" => replica.clone())
            .absolute(u.ledger.busy_gpu_micros());
        counter!("gateway_upstream_attributed_gpu_microseconds_total", "model" => model.clone(), "replica" => replica.clone())
            .absolute(u.ledger.attributed_gpu_micros());
        gauge!("gateway_upstream_in_flight", "model" => model.clone(), "replica" => replica.clone())
            .set(u.ledger.in_flight() as f64);
        if let Some(bp) = u.occupancy.basis_points() {
            gauge!("gateway_upstream_kv_usage_ratio", "model" => model, "replica" => replica)
                .set(bp as f64 / 10_000.0);
        }
    }
}

pub fn record_request(tenant: &str, model: &str, e: &UsageEvent) {
    counter!("gateway_requests_total", "tenant" => tenant.to_owned(), "model" => model.to_owned())
        .increment(1);
    let e2e = (e.finished_at - e.started_at).num_milliseconds().max(0) as f64 / 1000.0;
    histogram!("gateway_e2e_seconds", "tenant" => tenant.to_owned()).record(e2e);
    if let Some(ttft) = e.ttft_ms {
        histogram!("gateway_ttft_seconds", "tenant" => tenant.to_owned())
            .record(ttft as f64 / 1000.0);
    }
}

pub fn rejected(tenant: &str, reason: &'static str) {
    counter!("gateway_rejections_total", "tenant" => tenant.to_owned(), "reason" => reason)
        .increment(1);
}

pub fn tokens_remaining(tenant: &str, model: &str, remaining: u64) {
    gauge!("gateway_tokens_remaining", "tenant" => tenant.to_owned(), "model" => model.to_owned())
        .set(remaining as f64);
}

pub fn active_requests(tenant: &str, n: u32) {
    gauge!("gateway_active_requests", "tenant" => tenant.to_owned()).set(f64::from(n));
}
