//! Builds the gateway: state, router, background tasks, and the serve loop
//! with graceful shutdown (stop taking requests, drain the outbox).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use admission::upstream::{self, Upstreams};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use engine::Simulator;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;
use usage_contract::RequestId;

use crate::config::{GatewayConfig, LimitsMode};
use crate::error::GatewayError;
use crate::idempotency::Idempotency;
use crate::outbox::Outbox;
use crate::readiness::Readiness;
pub use crate::state::AppState;
use crate::tenants::Registry;
use crate::{chat, relay, telemetry};
use admission::cluster::Cluster;
use admission::limits::Limiter;

/// How long shutdown waits for admitted requests to finish.
const RUN_GRACE: Duration = Duration::from_secs(30);

/// The HTTP API. Every response, error or not, carries `X-Request-Id`
/// (an idempotent replay carries the original request's). Every error is
/// in OpenAI's shape: unknown paths (404), wrong methods (405 with
/// `Allow`) and a NUL in the query (400) included.
pub fn app(state: AppState, metrics: Option<PrometheusHandle>) -> Router {
    let mut router = Router::new()
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/models", get(chat::models))
        .route("/v1/slo", get(chat::slo))
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(state): State<AppState>| async move {
                crate::readiness::answer(&state.readiness)
            }),
        );
    if let Some(handle) = metrics {
        let (engine, outbox) = (state.engine.clone(), state.outbox.clone());
        let ledger = state.gpu_ledger.clone();
        let slo = state.slo.clone();
        router = router.route(
            "/metrics",
            get(move || {
                let (engine, outbox, handle, ledger) = (
                    engine.clone(),
                    outbox.clone(),
                    handle.clone(),
                    ledger.clone(),
                );
                let slo = slo.clone();
                async move {
                    telemetry::upstreams(&engine);
                    telemetry::slo(&slo, std::time::Instant::now());
                    relay::report_age(&outbox);
                    let mut text = handle.render();
                    text.push_str(&telemetry::upstream_gpu_seconds(&engine));
                    // The simulated replicas this gateway hosts, under the
                    // engine's own names (vLLM's, and its GPU-second counters).
                    let served: Vec<&str> = engine
                        .models()
                        .iter()
                        .filter(|m| !m.remote)
                        .map(|m| m.name.as_str())
                        .collect();
                    let mut snapshots = engine.simulator().snapshots();
                    snapshots.retain(|s| served.contains(&s.model.as_str()));
                    text.push_str(&engine::metrics::render(&snapshots));
                    let replicas: Vec<String> = engine
                        .remote()
                        .iter()
                        .map(|u| u.config.replica().to_owned())
                        .collect();
                    if let (Some(ledger), false) = (ledger, replicas.is_empty()) {
                        if let Some(figures) = ledger.figures(&replicas).await {
                            text.push_str(&admission::gpu_ledger::render(&engine, &figures));
                        }
                    }
                    text
                }
            }),
        );
    }
    router
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            GatewayError::MethodNotAllowed(format!("{method} {}", uri.path()))
        })
        .fallback(|method: Method, uri: Uri| async move {
            GatewayError::UnknownPath(format!("{method} {}", uri.path()))
        })
        .with_state(state)
        .layer(middleware::from_fn(serving::nul::reject_in_query))
        .layer(middleware::from_fn(request_id))
}

async fn request_id(mut req: Request, next: Next) -> Response {
    let id = RequestId::new();
    req.extensions_mut().insert(id);
    let mut res = next.run(req).await;
    if !res.headers().contains_key("x-request-id") {
        if let Ok(value) = HeaderValue::from_str(&id.to_string()) {
            res.headers_mut().insert("x-request-id", value);
        }
    }
    res
}

/// Runs the gateway until `shutdown` resolves.
pub async fn run(
    config: GatewayConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), GatewayError> {
    config.validate()?;
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| GatewayError::Config(format!("GATEWAY_ADDR {}: {e}", config.addr)))?;
    let prometheus =
        telemetry::install().map_err(|e| GatewayError::Config(format!("metrics recorder: {e}")))?;
    telemetry::describe();

    let pool = schema::connect(&config.database_url, 4, Duration::from_secs(60)).await?;
    let registry = Registry::default();
    let keys = registry.refresh(&pool).await?;
    tracing::info!(keys, "loaded api keys");

    let outbox = Outbox::open(&config.outbox)?;
    tracing::info!(waiting = outbox.depth(), path = %config.outbox.display(), "outbox open");
    let producer = relay::producer(&config.kafka_brokers)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let relay_task = tokio::spawn(relay::run(
        outbox.clone(),
        producer,
        config.topic.clone(),
        stop_rx,
    ));

    let remote = match &config.upstreams_file {
        Some(path) => upstream::load(path)
            .map_err(|e| GatewayError::Config(format!("GATEWAY_UPSTREAMS {e}")))?,
        None => Vec::new(),
    };
    let simulator = Arc::new(Simulator::new(config.profiles()?, config.engine_speedup));
    let cluster = match config.limits {
        LimitsMode::Shared => Cluster::connect(
            &config.redis_url,
            &config.redis_prefix,
            &config.gateway_id,
            config.fail_closed(),
        )
        .map_err(|e| GatewayError::Config(format!("REDIS_URL {:?}: {e}", config.redis_url)))?,
        LimitsMode::Local => Cluster::local(&config.gateway_id),
    };
    // Several gateways in front of one HTTP replica: one ledger for its GPU time.
    let gpu_ledger = admission::gpu_ledger::RedisLedger::new(cluster.clone());
    let shared_ledger: Option<Arc<dyn admission::upstream::ledger::SharedLedger>> =
        match config.limits {
            LimitsMode::Shared => Some(Arc::new(gpu_ledger.clone())),
            LimitsMode::Local => None,
        };
    let upstreams = Upstreams::with_shared_ledger(simulator, remote, shared_ledger)
        .map_err(|e| GatewayError::Config(format!("GATEWAY_UPSTREAMS {e}")))?;
    let floors =
        admission::floors::Floors::new(upstreams.floors_setter(), config.floor_limit_bp()?);
    floors.apply(registry.floors());
    registry.spawn_refresh(
        pool.clone(),
        Duration::from_millis(config.key_refresh_ms),
        move |registry| floors.apply(registry.floors()),
    );
    let remote_models: Vec<String> = upstreams
        .remote()
        .iter()
        .map(|r| r.config.model.clone())
        .collect();
    let served: Vec<String> = upstreams.models().iter().map(|m| m.name.clone()).collect();
    for m in upstreams.models() {
        tracing::info!(model = %m.name, remote = m.remote, replica = %m.replica_id, "serving model");
    }
    let fair = config.queue == crate::config::Switch::On;
    let ladder = fair.then(admission::ladder::Ladder::new);
    let mut limiter = Limiter::new(config.global_rate(), cluster.clone());
    if let Some(ladder) = &ladder {
        limiter = limiter.with_ladder(ladder.clone());
    }
    // One round before serving, so a gateway starts shared when Redis is up
    // (and local, without waiting, when it is not).
    limiter.renew(true).await;
    tracing::info!(
        mode = cluster.mode().as_str(),
        peers = cluster.peers(),
        "limits"
    );
    let renewal = match config.limits {
        LimitsMode::Shared => Some(limiter.spawn_renewal()),
        LimitsMode::Local => None,
    };
    let reaping = gpu_ledger.clone();
    let reaper = (config.limits == LimitsMode::Shared && !remote_models.is_empty()).then(|| {
        let gpu_ledger = reaping;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(admission::cluster::RENEW_EVERY);
            loop {
                tick.tick().await;
                gpu_ledger.reap().await;
            }
        })
    });
    let state = AppState {
        registry,
        engine: Arc::new(upstreams),
        outbox: outbox.clone(),
        gateway_id: config.gateway_id.clone(),
        speedup: config.engine_speedup,
        request_timeout: config.request_timeout(),
        limiter: limiter.clone(),
        tpot: admission::tpot::Tpot::default(),
        retry_budget: Arc::default(),
        idempotency: Idempotency::new(outbox.clone(), cluster.clone())
            .with_shared_ttl(Duration::from_secs(config.idempotency_shared_ttl_secs)),
        runs: TaskTracker::new(),
        readiness: Readiness::default(),
        gpu_ledger: (config.limits == LimitsMode::Shared).then(|| gpu_ledger.clone()),
        slo: Arc::default(),
        queues: fair.then(|| admission::admission_queue::Queues::new(served, config.queue_depth)),
        ladder,
    };
    state.spawn_ladder();
    let (stop_reports, reports_stopped) = watch::channel(false);
    let reporter = crate::replica_reports::Reporter::start(
        state.engine.clone(),
        outbox.clone(),
        config.gateway_id.clone(),
        cluster.clone(),
    )
    .await;
    let reports = tokio::spawn(reporter.run(
        Duration::from_secs(config.replica_report_secs),
        reports_stopped,
    ));
    let runs = state.runs.clone();
    // Fail readiness first, keep accepting while the load balancer notices,
    // then stop accepting (serving drains what is in flight).
    let (readiness, delay) = (state.readiness.clone(), config.drain_delay());
    let shutdown = async move {
        shutdown.await;
        readiness.drain();
        tracing::info!(
            ?delay,
            "shutting down: readiness fails; still accepting for the drain delay"
        );
        tokio::time::sleep(delay).await;
    };
    state.idempotency.spawn_sweeper(Duration::from_secs(600));
    tracing::info!(addr = %config.addr, "gateway listening");
    serving::serve(
        listener,
        app(state, Some(prometheus)),
        config.http,
        shutdown,
    )
    .await
    .map_err(|e| GatewayError::Config(format!("serving on {}: {e}", config.addr)))?;
    // Streams still going (their clients may be gone) end with their event.
    runs.close();
    tracing::info!(
        running = runs.len(),
        "stopped taking requests; waiting for admitted requests"
    );
    if tokio::time::timeout(RUN_GRACE, runs.wait()).await.is_err() {
        tracing::warn!(
            running = runs.len(),
            "requests still running after the grace period"
        );
    }
    if let Some(reaper) = reaper {
        reaper.abort();
    }
    if let Some(renewal) = renewal {
        renewal.abort();
        limiter.release().await;
    }
    // The replicas' last interval, after the last request ended on them.
    let _ = stop_reports.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), reports).await;
    tracing::info!("draining the outbox");
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), relay_task).await;
    Ok(())
}
