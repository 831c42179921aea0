//! `POST /v1/chat/completions` and `GET /v1/models`: authenticate, validate
//! the request, claim the `Idempotency-Key`, place it through
//! [`admission::place`] (limits, engine, fair queue, preemption), and hand
//! it to a [`Run`] that records exactly one usage event.
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
use engine::{CompletionRequest, ServiceClass};
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
use admission::limits;
use admission::upstream::ModelInfo;

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

/// `GET /v1/models`: the list built when the gateway started.
pub async fn models(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, GatewayError> {
    authenticate(&state, &headers)?;
    Ok(Json(state.engine.model_list()).into_response())
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

/// Everything after authentication: validate → idempotency claim → place →
/// run. Sets `model` once it is known to be served.
async fn handle(
    state: &AppState,
    caller: &Caller,
    request_id: &mut RequestId,
    headers: &HeaderMap,
    body: Bytes,
    model: &mut Option<String>,
) -> Result<Response, GatewayError> {
    let mut checked = check(state, caller, &body, model)?;
    let class = ServiceClass::from_priority(caller.priority);
    let idempotency = match claim(state, caller, headers, &body, class).await? {
        Claimed::Replay(stored) => return Ok(replay(stored)),
        Claimed::Run(guard) => guard,
    };
    if let Some(guard) = &idempotency {
        *request_id = guard.request_id();
    }
    let engine_request = checked.engine_request(caller, class, &body);
    let output = checked.output_estimate();
    let (req, info, prompt_tokens) = (checked.req, checked.info, checked.prompt_tokens);
    let cost = gpu_micros(state, &req.model, prompt_tokens, output);
    let ask = admission::place::Ask {
        caller,
        request: &engine_request,
        request_id: request_id.to_string(),
        streams: req.streams(),
        retry: idempotency.as_ref().is_some_and(|g| g.is_retry()),
        estimate: prompt_tokens + output,
        kv_mib_seconds: kv_estimate(state, &req.model, prompt_tokens, output),
        cost_gpu_micros: cost,
    };
    let placed = match admission::place(state.admission(), ask).await {
        Ok(placed) => placed,
        Err(refused) => return Err(not_placed(caller, idempotency, refused).await),
    };
    // Only a request that sends nothing before it ends can be preempted.
    let requeue = placed.preemptible.then(|| crate::metering::Requeue {
        request: engine_request.clone(),
    });
    let run = Run {
        state: state.clone(),
        caller: caller.clone(),
        request_id: *request_id,
        model: req.model.clone(),
        info,
        started_at: now_ms(),
        queued: placed.queued,
        prompt_tokens,
        cost_gpu_micros: cost,
        permit: placed.permit,
        idempotency,
        requeue,
        lost: crate::metering::Lost::default(),
    };
    respond(state, run, placed.generation, &req).await
}

/// A request that passed the wire rules, names a served model, and fits
/// the tenant's `max_output` and `max_context`.
struct Checked {
    req: ChatRequest,
    info: ModelInfo,
    prompt: String,
    prompt_tokens: u64,
    /// The output cap: the client's, else the tenant's `max_output`.
    max_tokens: Option<u32>,
}

impl Checked {
    /// The output it is expected to produce: its cap, else the default
    /// estimate, within what the model's context leaves.
    fn output_estimate(&self) -> u64 {
        let room = u64::from(self.info.max_context).saturating_sub(self.prompt_tokens);
        self.max_tokens
            .map_or(DEFAULT_OUTPUT_ESTIMATE, u64::from)
            .min(room)
    }

    /// What the engine is asked to run (the prompt moves into it).
    fn engine_request(
        &mut self,
        caller: &Caller,
        class: ServiceClass,
        body: &[u8],
    ) -> CompletionRequest {
        CompletionRequest {
            model: self.req.model.clone(),
            prompt: std::mem::take(&mut self.prompt),
            max_tokens: self.max_tokens,
            seed: self.req.seed.unwrap_or(0),
            tenant_id: caller.tenant_id.clone(),
            class,
            // An HTTP upstream gets the client's request as it was sent.
            body: self
                .info
                .remote
                .then(|| serde_json::from_slice(body).ok())
                .flatten(),
        }
    }
}

/// A request admission refused: counted, its idempotency claim released
/// (a retry may run), and answered.
async fn not_placed(
    caller: &Caller,
    idempotency: Option<idempotency::Guard>,
    refused: admission::Refused,
) -> GatewayError {
    if let Some(reason) = refused.reason() {
        telemetry::rejected(&caller.tenant_id, reason);
    }
    if let Some(guard) = idempotency {
        guard.refused().await;
    }
    refused.into()
}

/// Parses and checks the body; sets `model` once it is known to be served.
fn check(
    state: &AppState,
    caller: &Caller,
    body: &[u8],
    model: &mut Option<String>,
) -> Result<Checked, GatewayError> {
    let req: ChatRequest =
        serde_json::from_slice(body).map_err(|e| GatewayError::BadRequest(e.to_string()))?;
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
        if let Some(bad) = engine::wire::unsupported_by_simulator(&req) {
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
    Ok(Checked {
        max_tokens: asked.or(limits.max_output),
        req,
        info,
        prompt,
        prompt_tokens,
    })
}

/// What the `Idempotency-Key` claim decided.
enum Claimed {
    /// Answered before: send the stored answer.
    Replay(Stored),
    /// Run it (under the guard's request id, when it has a key).
    Run(Option<idempotency::Guard>),
}

/// Claims the request's `Idempotency-Key`, if it has one.
async fn claim(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    body: &[u8],
    class: ServiceClass,
) -> Result<Claimed, GatewayError> {
    let Some(key) = idempotency_key(headers)? else {
        return Ok(Claimed::Run(None));
    };
    let begun = state
        .idempotency
        .begin(
            &caller.api_key_id,
            key,
            body,
            now_ms().timestamp_millis(),
            class == ServiceClass::Reserved || state.retry_budget.allows_retry(Instant::now()),
        )
        .await?;
    match begun {
        Begin::New(guard) => Ok(Claimed::Run(Some(guard))),
        Begin::Replay(stored) => Ok(Claimed::Replay(stored)),
        Begin::InFlight => {
            telemetry::rejected(&caller.tenant_id, "idempotency_in_flight");
            Err(GatewayError::IdempotencyInFlight)
        }
        Begin::Mismatch => Err(GatewayError::IdempotencyMismatch),
        Begin::Shed => {
            telemetry::rejected(&caller.tenant_id, "retry_budget");
            Err(GatewayError::RetryBudget)
        }
    }
}

/// Hands the placed request to its run, in a task of its own, and answers:
/// a stream of SSE frames, or the JSON completion once it ends.
async fn respond(
    state: &AppState,
    run: Run,
    generation: admission::upstream::Generation,
    req: &ChatRequest,
) -> Result<Response, GatewayError> {
    if req.streams() {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        state
            .runs
            .spawn(run.stream(generation, tx, req.include_usage()));
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
