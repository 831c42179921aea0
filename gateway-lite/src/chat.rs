//! `POST /v1/chat/completions` and `GET /v1/models`: authenticate, check
//! the tenant's limits, claim the `Idempotency-Key`, admit into the engine,
//! and hand the request to a [`Run`] that records exactly one usage event.
//! Every response of an authenticated request carries the
//! `x-ratelimit-*` headers of its key and model.

use std::convert::Infallible;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use engine::completion::DEFAULT_OUTPUT_ESTIMATE;
use engine::{CompletionRequest, EngineError, ServiceClass};
use openai_wire::{ChatRequest, Invalid};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use usage_contract::RequestId;

use crate::error::GatewayError;
use crate::idempotency::{self, Begin, Stored};
use crate::metering::{now_ms, Run};
use crate::state::AppState;
use crate::telemetry;
use crate::tenants::Caller;
use admission::admission_queue;
use admission::limits;

/// SSE frames buffered towards a slow client before the stream waits.
const STREAM_BUFFER: usize = 64;

/// The one value of a header that decides who pays or which answer is
/// replayed (see [`serving::headers`]); two are a 400 naming the header.
fn single_header<'h>(
    headers: &'h HeaderMap,
    name: &'static str,
) -> Result<Option<&'h HeaderValue>, GatewayError> {
    serving::headers::single(headers, name).map_err(|serving::headers::Repeated(name)| {
        GatewayError::InvalidParam {
            param: name.into(),
            message: format!("the request carries more than one {name} header; send exactly one"),
        }
    })
}

fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Caller, GatewayError> {
    let key = single_header(headers, "Authorization")?
        .and_then(|v| v.to_str().ok())
        .and_then(serving::headers::bearer)
        .ok_or(GatewayError::MissingKey)?;
    state
        .registry
        .authenticate(key)
        .ok_or(GatewayError::InvalidKey)
}

pub async fn models(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Value>, GatewayError> {
    authenticate(&state, &headers)?;
    let data: Vec<Value> = state
        .engine
        .models()
        .iter()
        .map(|m| json!({"id": m.name, "object": "model", "created": 0, "owned_by": "meterline", "max_model_len": m.max_context}))
        .collect();
    Ok(Json(json!({"object": "list", "data": data})))
}

/// `GET /v1/slo`: the caller's own tenant's last 60 s against its
/// objectives (a key sees its own tenant only). Latencies in ms, ratios as
/// fractions (null without requests or without that objective).
pub async fn slo(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Json<Value>, GatewayError> {
    let caller = authenticate(&state, &headers)?;
    // Nothing to choose: a key sees its own tenant's window. A parameter
    // (`?tenant=…`) is refused, never ignored.
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        let name = q.split(['=', '&']).next().unwrap_or(&q).to_owned();
        return Err(GatewayError::InvalidParam {
            message: format!(
                "GET /v1/slo takes no query parameters (got {name:?}): an API key sees its own tenant's window"
            ),
            param: name.into(),
        });
    }
    let r = state.slo.report(&caller.tenant_id, Instant::now());
    let slo = caller.slo;
    let p = |p: Option<fleet::slo::Percentiles>| {
        p.map(|p| json!({"p50_ms": p.p50, "p95_ms": p.p95, "p99_ms": p.p99}))
    };
    Ok(Json(json!({
        "object": "slo_window",
        "tenant": caller.tenant_id,
        "window_seconds": fleet::slo::WINDOW.as_secs(),
        "requests": r.requests,
        "objectives": {
            "ttft_p95_ms": slo.ttft_p95_ms,
            "e2e_p95_ms": slo.e2e_p95_ms,
            "availability_bp": slo.availability_bp,
        },
        "ttft": p(r.ttft),
        "e2e": p(r.e2e),
        "compliance": {
            "ttft": r.ttft_compliance,
            "e2e": r.e2e_compliance,
            "availability": r.availability.filter(|_| slo.availability_bp.is_some()),
        },
    })))
}

pub async fn completions(
    State(state): State<AppState>,
    Extension(request_id): Extension<RequestId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let caller = match authenticate(&state, &headers) {
        Ok(caller) => caller,
        Err(e) => return e.into_response(),
    };
    // A body that could not be read (too large, cut off) is answered after
    // authentication, in OpenAI's shape.
    let body = match body {
        Ok(body) => body,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return GatewayError::PayloadTooLarge(e.body_text()).into_response()
        }
        Err(e) => return GatewayError::BadRequest(e.body_text()).into_response(),
    };
    let mut model = None;
    let mut id = request_id;
    let mut res = handle(&state, &caller, &mut id, &headers, body, &mut model)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    // An idempotent request runs under its derived id (a replay carries
    // its original one already).
    if id != request_id && !res.headers().contains_key("x-request-id") {
        if let Ok(v) = HeaderValue::from_str(&id.to_string()) {
            res.headers_mut().insert("x-request-id", v);
        }
    }
    let model = model.as_deref().unwrap_or("*");
    let status = state.limiter.status(&caller, model, Instant::now());
    if let Some(tokens) = status.tokens {
        telemetry::tokens_remaining(&caller.tenant_id, model, tokens.remaining);
    }
    limits::apply_headers(res.headers_mut(), &status);
    res
}

/// Everything after authentication; sets `model` once it is known to be served.
async fn handle(
    state: &AppState,
    caller: &Caller,
    request_id: &mut RequestId,
    headers: &HeaderMap,
    body: Bytes,
    model: &mut Option<String>,
) -> Result<Response, GatewayError> {
    let req: ChatRequest =
        serde_json::from_slice(&body).map_err(|e| GatewayError::BadRequest(e.to_string()))?;
    if let Some(bad) = req.invalid() {
        return Err(invalid(bad));
    }
    if let Some(field) = req.nul_field() {
        return Err(GatewayError::InvalidParam {
            param: field.param.into(),
            message: field.message(),
        });
    }
    let Some(info) = state.engine.model(&req.model).cloned() else {
        return Err(GatewayError::UnknownModel(req.model));
    };
    // An HTTP upstream is sent the client's body and decides for itself.
    if !info.remote {
        if let Some(bad) = req.unsupported_by_simulator() {
            return Err(invalid(bad));
        }
    }
    *model = Some(req.model.clone());
    let limits = caller.limits_for(&req.model);
    let asked = req.max_output();
    if let (Some(asked), Some(limit)) = (asked, limits.max_output) {
        if asked > limit {
            return Err(GatewayError::InvalidParam {
                param: "max_tokens".into(),
                message: format!("max_tokens {asked} exceeds this tenant's max_output of {limit}"),
            });
        }
    }
    let prompt = req.prompt();
    let prompt_tokens = engine::tokenizer::count(&prompt);
    if let Some(limit) = limits.max_context {
        if prompt_tokens > u64::from(limit) {
            return Err(GatewayError::InvalidParam {
                param: "messages".into(),
                message: format!("the prompt has {prompt_tokens} tokens, above this tenant's max_context of {limit}"),
            });
        }
    }
    let max_tokens = asked.or(limits.max_output);

    let class = ServiceClass::from_priority(caller.priority);
    let idempotency = match idempotency_key(headers)? {
        None => None,
        Some(key) => match state
            .idempotency
            .begin(
                &caller.api_key_id,
                key,
                &body,
                now_ms().timestamp_millis(),
                class == ServiceClass::Reserved || state.retry_budget.allows_retry(Instant::now()),
            )
            .await?
        {
            Begin::New(guard) => {
                *request_id = guard.request_id();
                Some(guard)
            }
            Begin::Replay(stored) => return Ok(replay(stored)),
            Begin::InFlight => {
                telemetry::rejected(&caller.tenant_id, "idempotency_in_flight");
                return Err(GatewayError::IdempotencyInFlight);
            }
            Begin::Mismatch => return Err(GatewayError::IdempotencyMismatch),
            Begin::Shed => {
                telemetry::rejected(&caller.tenant_id, "retry_budget");
                return Err(GatewayError::RetryBudget);
            }
        },
    };

    let room = u64::from(info.max_context).saturating_sub(prompt_tokens);
    let output_estimate = max_tokens.map_or(DEFAULT_OUTPUT_ESTIMATE, u64::from);
    let estimate = prompt_tokens + output_estimate.min(room);
    let kv_mib_seconds = kv_estimate(state, &req.model, prompt_tokens, output_estimate.min(room));
    let admitted = state
        .limiter
        .admit(
            caller,
            limits::Ask {
                model: &req.model,
                estimate,
                kv_mib_seconds,
                request_id: request_id.to_string(),
            },
        )
        .await;
    let mut permit = match admitted {
        Ok(permit) => permit,
        Err(r) => {
            telemetry::rejected(&caller.tenant_id, r.limit.as_str());
            if let Some(guard) = idempotency {
                guard.refused().await;
            }
            return Err(GatewayError::RateLimited(r));
        }
    };

    let retry = idempotency.as_ref().is_some_and(|g| g.is_retry());
    state.retry_budget.admitted(retry, Instant::now());
    let engine_request = CompletionRequest {
        model: req.model.clone(),
        prompt,
        max_tokens,
        seed: req.seed.unwrap_or(0),
        tenant_id: caller.tenant_id.clone(),
        class,
        // An HTTP upstream gets the client's request as it was sent.
        body: if info.remote {
            serde_json::from_slice(&body).ok()
        } else {
            None
        },
    };
    let arrived = Instant::now();
    let budget = admission_queue::budget(caller);
    let deadline = arrived + budget;
    // A priority-5 request still waiting at half its budget would miss its
    // TTFT objective: it preempts a lower request in flight, once. So does
    // the owner of dedicated replicas of this model, whatever its priority:
    // it takes back what it lent (the registry then picks lent work first).
    let owns_replicas = state.engine.owns_replicas(&req.model, &caller.tenant_id);
    let preemptor = fleet::preempt::Preemptor {
        tenant: &caller.tenant_id,
        priority: caller.priority,
        depth: 0,
        lent_only: caller.priority < admission::preemption::PREEMPTOR_PRIORITY,
    };
    let preempts = !preemptor.lent_only || owns_replicas;
    let mut preempt_at = preempts.then(|| arrived + budget / 2);
    let cost = gpu_micros(state, &req.model, prompt_tokens, output_estimate.min(room));
    // While an owner's request waits, its dedicated replicas are not lent
    // to anyone else: the room a preemption frees there is its own.
    let mut owner_waiting = None;
    let generation = loop {
        let refused = match state.engine.start(&engine_request, req.streams()).await {
            Ok(generation) => break generation,
            Err(e) => e,
        };
        // No room for its class now (the simulator's replicas, or every
        // HTTP replica, refused it before doing any work): wait in the
        // model's fair queue.
        let queue = state.queues.as_ref().filter(|q| {
            q.serves(&req.model)
                && matches!(
                    refused,
                    EngineError::NoCapacity { .. } | EngineError::UpstreamBusy { .. }
                )
        });
        if owns_replicas && queue.is_some() && owner_waiting.is_none() {
            owner_waiting = state.engine.owner_waiting(&req.model, &caller.tenant_id);
        }
        let waited = match queue {
            None => Err(None),
            Some(q) => {
                let now = Instant::now();
                let left = deadline.saturating_duration_since(now);
                match (preempt_at, q.preemptions(&req.model)) {
                    (Some(at), Some(registry)) if at > now => {
                        // Wait until the preemption point first.
                        match q.wait(&req.model, caller, cost, at - now).await {
                            Ok(()) => Ok(()),
                            Err(admission_queue::NotRun::Timeout(_)) => {
                                preempt_at = None;
                                registry.preempt_for(&req.model, preemptor);
                                Ok(())
                            }
                            Err(full) => Err(Some(full)),
                        }
                    }
                    (Some(_), Some(registry)) => {
                        preempt_at = None;
                        registry.preempt_for(&req.model, preemptor);
                        q.wait(&req.model, caller, cost, left).await.map_err(Some)
                    }
                    _ => q.wait(&req.model, caller, cost, left).await.map_err(Some),
                }
            }
        };
        let why = match waited {
            Ok(()) => continue,
            Err(why) => why,
        };
        // Not admitted by the engine: no usage event, nothing charged.
        permit.settle(0, Instant::now());
        if let Some(guard) = idempotency {
            guard.refused().await;
        }
        return Err(match why {
            Some(admission_queue::NotRun::Full { level, depth }) => {
                telemetry::rejected(&caller.tenant_id, "queue_full");
                GatewayError::QueueFull { level, depth }
            }
            Some(admission_queue::NotRun::Timeout(_)) => {
                telemetry::rejected(&caller.tenant_id, "queue_timeout");
                GatewayError::QueueTimeout(deadline - arrived)
            }
            None => {
                if matches!(
                    refused,
                    EngineError::NoCapacity { .. } | EngineError::UpstreamBusy { .. }
                ) {
                    telemetry::rejected(&caller.tenant_id, "no_capacity");
                }
                GatewayError::from(refused)
            }
        });
    };
    // Placed: the owner now counts as running on its replica, if it is there.
    drop(owner_waiting);
    let started_at = now_ms();
    let queued = arrived.elapsed();
    let include_usage = req.include_usage();
    let streams = req.streams();
    // Only a request that sends nothing before it ends can be preempted.
    let requeue = (!streams
        && state
            .queues
            .as_ref()
            .and_then(|q| q.preemptions(&req.model))
            .is_some())
    .then(|| crate::metering::Requeue {
        request: engine_request.clone(),
        cost_gpu_micros: cost,
    });
    let run = Run {
        state: state.clone(),
        caller: caller.clone(),
        request_id: *request_id,
        model: req.model,
        info,
        started_at,
        queued,
        prompt_tokens,
        permit,
        idempotency,
        requeue,
        lost: crate::metering::Lost::default(),
    };
    if streams {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        state.runs.spawn(run.stream(generation, tx, include_usage));
        let frames = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
        });
        let mut res = Response::new(Body::from_stream(frames));
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(res);
    }
    // The run owns the generation in its own task: if this handler is
    // dropped (client gone), the request still ends with its one event.
    let (tx, rx) = oneshot::channel();
    state.runs.spawn(run.complete(generation, tx));
    let body = rx
        .await
        .map_err(|_| GatewayError::Engine("the request task ended without an answer".into()))??;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// The request's estimated GPU time in GPU-µs (its cost in the fair
/// queue): prompt + `out` through the model's profile. A model without a
/// profile (an HTTP upstream of another name) costs its tokens, prompt +
/// `out`: the queue only compares costs within one model.
fn gpu_micros(state: &AppState, model: &str, prompt: u64, out: u64) -> u64 {
    use rust_decimal::prelude::ToPrimitive;
    state
        .engine
        .simulator()
        .profile(model)
        .map_or(prompt + out, |p| {
            (p.estimated_gpu_seconds(prompt, out) * rust_decimal::Decimal::from(1_000_000))
                .to_u64()
                .unwrap_or(u64::MAX)
        })
}

/// The request's KV·seconds (MiB·s) for the tenant's cap, from the
/// model's profile and the TPOT it runs at now; 0 when the tenant has no
/// cap or the model has no profile (an HTTP upstream of another name).
fn kv_estimate(state: &AppState, model: &str, prompt: u64, out: u64) -> u64 {
    let Some(profile) = state.engine.simulator().profile(model) else {
        return 0;
    };
    let target = std::time::Duration::from_micros(profile.costs().step_micros(1, 0));
    let tpot = state.tpot.estimate(model, target, Instant::now());
    limits::kv_mib_seconds(prompt, out, profile.kv_bytes_per_token, tpot)
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, GatewayError> {
    let Some(value) = single_header(headers, "Idempotency-Key")? else {
        return Ok(None);
    };
    match value.to_str().map(str::trim) {
        Ok(key) if !key.is_empty() && key.len() <= idempotency::MAX_KEY_LEN => Ok(Some(key)),
        _ => Err(GatewayError::InvalidParam {
            param: "Idempotency-Key".into(),
            message: format!(
                "Idempotency-Key must be 1 to {} visible ASCII characters",
                idempotency::MAX_KEY_LEN
            ),
        }),
    }
}

/// A stored answer, sent again with its original `X-Request-Id`.
fn replay(stored: Stored) -> Response {
    let mut res = (StatusCode::OK, stored.body).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(stored.content_type),
    );
    if let Ok(v) = HeaderValue::from_str(&stored.request_id) {
        h.insert("x-request-id", v);
    }
    h.insert("idempotent-replayed", HeaderValue::from_static("true"));
    res
}

fn invalid(bad: Invalid) -> GatewayError {
    GatewayError::InvalidParam {
        param: bad.param.into(),
        message: bad.message,
    }
}
