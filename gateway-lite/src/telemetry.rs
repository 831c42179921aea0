//! The gateway's Prometheus metrics (labels: tenant, model, status; never ids).

use metrics::{counter, histogram};
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
