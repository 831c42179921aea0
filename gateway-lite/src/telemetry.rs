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
