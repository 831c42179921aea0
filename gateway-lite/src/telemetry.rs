//! The gateway's Prometheus metrics (labels: tenant, model, status; never ids).
//!
//! Latencies are histograms with explicit buckets ([`install`]), never
//! summaries: a summary whose window has emptied exports quantiles of 0. The
//! HTTP upstreams' GPU-second counters are exact decimals, rendered by hand
//! at each scrape ([`upstream_gpu_seconds`]) because the recorder's counters
//! count integers.

use std::fmt::Write as _;

use admission::telemetry::label_value;
use engine::attribution::to_gpu_seconds;
use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use usage_contract::UsageEvent;

pub const E2E_SECONDS: &str = "gateway_e2e_seconds";
pub const TTFT_SECONDS: &str = "gateway_ttft_seconds";
pub const UPSTREAM_BUSY: &str = "gateway_upstream_busy_gpu_seconds_total";
pub const UPSTREAM_ATTRIBUTED: &str = "gateway_upstream_attributed_gpu_seconds_total";

/// Bucket bounds of `gateway_e2e_seconds`: from a cached short answer to
/// the longest request `GATEWAY_REQUEST_TIMEOUT_SECS` allows by default.
const E2E_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Bucket bounds of `gateway_ttft_seconds`: the reference SLOs sit at
/// 0.2–0.8 s, so the buckets are finest there.
const TTFT_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8, 1.5, 3.0, 10.0, 30.0,
];

/// The recorder's builder: every histogram is a real histogram with
/// explicit buckets (one not named here gets the end-to-end buckets), so
/// none is ever rendered as a summary.
pub fn prometheus() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets(&E2E_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(E2E_SECONDS.into()), &E2E_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(TTFT_SECONDS.into()), &TTFT_BUCKETS)
}

/// Installs [`prometheus`]'s recorder as the process' recorder.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    prometheus()?.install_recorder()
}

pub fn describe() {
    metrics::describe_counter!(
        "gateway_requests_total",
        "Admitted requests, by tenant and model"
    );
    metrics::describe_histogram!(E2E_SECONDS, "End-to-end request time, by tenant");
    metrics::describe_histogram!(
        TTFT_SECONDS,
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
        "gateway_replica_reports_total",
        "Replica reports (busy, idle and lent GPU time of a replica over one interval and hour) written to the outbox"
    );
    metrics::describe_gauge!(
        "gateway_replica_reporter",
        "1 while this gateway is the elected reporter of an engine binary's replicas (by model and url), else 0"
    );
    metrics::describe_counter!(
        "gateway_replica_report_errors_total",
        "Ticks at which an engine binary's replica reports could not be made (Redis or the engine did not answer, by model); the time is reported at a later tick"
    );
    metrics::describe_counter!(
        "gateway_relay_errors_total",
        "Publish attempts that failed and will be retried"
    );
    metrics::describe_gauge!(
        "gateway_upstream_kv_usage_ratio",
        "HTTP upstream replicas: KV-cache usage last read from their /metrics (0-1)"
    );
    metrics::describe_gauge!(
        "gateway_upstream_in_flight",
        "HTTP upstream replicas: requests in flight"
    );
    metrics::describe_gauge!(
        "gateway_limits_mode",
        "Where the limits are enforced: 1 on the current mode (shared: leased from Redis with every gateway; local: this gateway's share in memory), 0 on the other"
    );
    metrics::describe_gauge!(
        "slo_compliance_ratio",
        "Share of a tenant's requests in the last 60 s within its objective, by metric (ttft, e2e; availability: the share that did not fail); NaN with no requests or no objective"
    );
    metrics::describe_gauge!(
        "slo_latency_seconds",
        "A tenant's TTFT and end-to-end latency over the last 60 s, nearest-rank p50/p95/p99, in the engine's time"
    );
    metrics::describe_gauge!(
        "gateway_priority_rate_percent",
        "Share of its requests/s each priority keeps on each simulated model's pool (the degradation ladder and capacity borrowing; GATEWAY_QUEUE=on)"
    );
    metrics::describe_gauge!(
        "gateway_pool_saturated",
        "1 while a simulated model's pool refuses requests for their class with its queue not shrinking (its lower priorities degraded, the other pools untouched)"
    );
    metrics::describe_gauge!(
        "gateway_queue_depth",
        "Requests waiting in a simulated model's fair queue (GATEWAY_QUEUE=on), at the last enqueue"
    );
    metrics::describe_gauge!(
        "gateway_reserved_floor_ratio",
        "Each enterprise tenant's reserved floor as applied on the model pools, in KV share (0-1)"
    );
    metrics::describe_gauge!(
        "gateway_reserved_floors_ratio",
        "The reserved floors together, in KV share of a pool: promised by the tenant config, applied (scaled to fit), and the limit (GATEWAY_FLOOR_LIMIT)"
    );
    metrics::describe_gauge!(
        "gateway_peers",
        "Gateways alive at the last heartbeat in Redis, this one included"
    );
    metrics::describe_gauge!(
        "gateway_peers_fail_closed",
        "While Redis is unreachable, the gateways concurrency and KV-seconds caps are divided among: the most seen alive (kept across restarts) or GATEWAY_EXPECTED_PEERS, whichever is larger"
    );
    metrics::describe_counter!(
        "gateway_redis_calls_total",
        "Calls to Redis, by purpose (lease, give_back, renew, heartbeat, idempotency)"
    );
}

/// The HTTP upstreams' ledgers, read at scrape time (their GPU-seconds:
/// [`upstream_gpu_seconds`]).
pub fn upstreams(upstreams: &admission::upstream::Upstreams) {
    for u in upstreams.remote() {
        let replica = u.config.replica().to_owned();
        let model = u.config.model.clone();
        gauge!("gateway_upstream_in_flight", "model" => model.clone(), "replica" => replica.clone())
            .set(u.ledger.in_flight() as f64);
        if let Some(bp) = u.occupancy.basis_points() {
            gauge!("gateway_upstream_kv_usage_ratio", "model" => model, "replica" => replica)
                .set(bp as f64 / 10_000.0);
        }
    }
}

/// The HTTP upstreams' ledgers in GPU-seconds, exact to the microsecond,
/// as Prometheus text to append to the recorder's: busy wall time × GPUs
/// (the ledger's whole) and what was handed to finished requests (equal to
/// busy whenever nothing is in flight). Empty without HTTP upstreams.
pub fn upstream_gpu_seconds(upstreams: &admission::upstream::Upstreams) -> String {
    let mut out = String::new();
    let remote = upstreams.remote();
    if remote.is_empty() {
        return out;
    }
    for (name, help, pick) in [
        (
            UPSTREAM_BUSY,
            "HTTP upstream replicas: busy wall time times GPUs, in GPU-seconds (the ledger's whole)",
            (|l: &admission::upstream::ledger::Ledger| l.busy_gpu_micros())
                as fn(&admission::upstream::ledger::Ledger) -> u64,
        ),
        (
            UPSTREAM_ATTRIBUTED,
            "HTTP upstream replicas: GPU-seconds handed to finished requests (equals busy when idle)",
            |l| l.attributed_gpu_micros(),
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for u in remote {
            let _ = writeln!(
                out,
                "{name}{{model=\"{}\",replica=\"{}\"}} {}",
                label_value(&u.config.model),
                label_value(u.config.replica()),
                to_gpu_seconds(pick(&u.ledger))
            );
        }
    }
    out
}

pub fn record_request(tenant: &str, model: &str, e: &UsageEvent) {
    counter!("gateway_requests_total", "tenant" => tenant.to_owned(), "model" => model.to_owned())
        .increment(1);
    let e2e = (e.finished_at - e.started_at).num_milliseconds().max(0) as f64 / 1000.0;
    histogram!(E2E_SECONDS, "tenant" => tenant.to_owned()).record(e2e);
    if let Some(ttft) = e.ttft_ms {
        histogram!(TTFT_SECONDS, "tenant" => tenant.to_owned()).record(ttft as f64 / 1000.0);
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

/// The limits' mode (`shared` or `local`; see `cluster::Mode`): 1 on it, 0 on the other.
/// Every tenant's SLO window, at scrape time: `slo_compliance_ratio{tenant,
/// metric}` (metric `ttft`, `e2e`, `availability`; NaN without an
/// objective or without requests in the window) and
/// `slo_latency_seconds{tenant,metric,percentile}` (a `quantile` label is
/// a summary's, and this is a gauge).
pub fn slo(windows: &fleet::slo::Windows, now: std::time::Instant) {
    for tenant in windows.tenants() {
        let r = windows.report(&tenant, now);
        let ratios = [
            ("ttft", r.ttft_compliance),
            ("e2e", r.e2e_compliance),
            (
                "availability",
                r.availability.filter(|_| r.slo.availability_bp.is_some()),
            ),
        ];
        for (metric, ratio) in ratios {
            gauge!("slo_compliance_ratio", "tenant" => tenant.clone(), "metric" => metric)
                .set(ratio.unwrap_or(f64::NAN));
        }
        for (metric, p) in [("ttft", r.ttft), ("e2e", r.e2e)] {
            let Some(p) = p else { continue };
            for (q, ms) in [("50", p.p50), ("95", p.p95), ("99", p.p99)] {
                gauge!("slo_latency_seconds", "tenant" => tenant.clone(), "metric" => metric, "percentile" => q)
                    .set(ms as f64 / 1000.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeDelta, TimeZone, Utc};
    use rust_decimal::Decimal;
    use usage_contract::{FinishReason, RequestId};

    #[test]
    fn latencies_render_as_histograms_with_their_buckets() {
        let started = Utc.with_ymd_and_hms(2026, 11, 29, 10, 0, 0).unwrap();
        let event = UsageEvent {
            schema_version: 1,
            request_id: RequestId::at(started),
            tenant_id: "t".into(),
            api_key_id: "k".into(),
            model: "m".into(),
            model_version: "v".into(),
            priority: 3,
            started_at: started,
            first_token_at: None,
            finished_at: started + TimeDelta::milliseconds(700),
            prompt_tokens: 10,
            cached_tokens: 0,
            completion_tokens: 5,
            gpu_seconds: Decimal::new(1, 6),
            preempted_gpu_seconds: Decimal::ZERO,
            finish_reason: FinishReason::Stop,
            ttft_ms: Some(150),
            tpot_ms: None,
            replica_id: "r".into(),
            gateway_id: "g".into(),
            stream: false,
            placement: None,
        };
        let recorder = prometheus().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || record_request("t", "m", &event));
        let text = handle.render();
        assert!(!text.contains("summary"), "{text}");
        for line in [
            "gateway_e2e_seconds_bucket{tenant=\"t\",le=\"0.5\"} 0",
            "gateway_e2e_seconds_bucket{tenant=\"t\",le=\"1\"} 1",
            "gateway_ttft_seconds_bucket{tenant=\"t\",le=\"0.1\"} 0",
            "gateway_ttft_seconds_bucket{tenant=\"t\",le=\"0.2\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
    }
}
