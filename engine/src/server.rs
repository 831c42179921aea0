//! The OpenAI-compatible HTTP API over a [`Simulator`]:
//! `POST /v1/chat/completions` (streaming as SSE or not; `usage` with
//! `prompt_tokens_details.cached_tokens`), `GET /v1/models`, `GET /metrics`
//! (see [`metrics`](crate::metrics)), `GET /health`, and
//! `GET /v1/replicas/gpu-time`: every replica's busy, idle and lent GPU
//! time so far ([`GpuTimeReadings`]), which the gateway elected to report
//! this engine's replicas reads (it needs a valid identity too: the
//! figures are what idle and dedicated capacity are billed from).
//!
//! The tenant (prefix-cache key) and the admission class (`best-effort`,
//! `standard`, `reserved`) come only from the signed `x-meterline-identity`
//! header (see [`identity`](crate::identity)), checked against the secret
//! the server is built with; a chat completion without a valid one is 401
//! `invalid_identity` before anything starts on the simulator. Plain
//! `X-Tenant-Id` / `X-Service-Class` headers are ignored. `/v1/models`,
//! `/metrics` and `/health` need no identity. When the client goes away the handler's
//! future or the SSE stream is dropped, which drops the [`Generation`] and
//! cancels the request on its replica. Errors use OpenAI's shape (unknown
//! paths, wrong methods, a body too large and a NUL in the request
//! included; a NUL in the query through `serving::nul::reject_in_query`); "no capacity" is 503 with a jittered `Retry-After`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream;
use rand::Rng;

use tokio::net::TcpListener;

use crate::error::EngineError;
use crate::identity::{self, Secret};
use openai_wire::{ChatRequest, ChunkStream, ErrorBody};

use crate::simulator::{CompletionRequest, Generation, Piece, Simulator};
use crate::simulator::{GpuTimeReadings, GPU_TIME_PATH};
use crate::wire;

/// What the handlers share.
#[derive(Clone)]
struct EngineState {
    sim: Arc<Simulator>,
    /// What `GET /v1/models` answers, built once.
    models: Arc<openai_wire::ModelList>,
    /// Verifies `x-meterline-identity`.
    secret: Arc<Secret>,
}

/// The engine's HTTP API; chat completions need an identity signed with `secret`.
pub fn app(sim: Arc<Simulator>, secret: Secret) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(completions))
        .route("/v1/models", get(models))
        .route(GPU_TIME_PATH, get(gpu_time))
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "ok" }))
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            EngineError::MethodNotAllowed(format!("{method} {}", uri.path()))
        })
        .fallback(|method: Method, uri: Uri| async move {
            EngineError::UnknownPath(format!("{method} {}", uri.path()))
        })
        .with_state(EngineState {
            models: Arc::new(openai_wire::ModelList::new(
                sim.models()
                    .iter()
                    .map(|p| (p.name.as_str(), p.max_context)),
            )),
            sim,
            secret: Arc::new(secret),
        })
        .layer(axum::middleware::from_fn(serving::nul::reject_in_query))
}

/// Serves `app(sim, secret)` on `listener` until `shutdown` resolves.
pub async fn run(
    listener: TcpListener,
    sim: Arc<Simulator>,
    secret: Secret,
    http: serving::HttpSettings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), serving::ServeError> {
    serving::serve(listener, app(sim, secret), http, shutdown).await
}

impl IntoResponse for EngineError {
    fn into_response(self) -> Response {
        let status = self.status_code();
        let (kind, code) = match &self {
            Self::UnknownModel(_) => ("invalid_request_error", Some("model_not_found")),
            Self::ContextTooLong { .. } => {
                ("invalid_request_error", Some("context_length_exceeded"))
            }
            Self::BadRequest(_) | Self::PayloadTooLarge(_) | Self::InvalidParam { .. } => {
                ("invalid_request_error", None)
            }
            Self::Identity(_) => ("invalid_request_error", Some("invalid_identity")),
            Self::UnknownPath(_) => ("invalid_request_error", Some("unknown_url")),
            Self::MethodNotAllowed(_) => ("invalid_request_error", Some("method_not_allowed")),
            Self::NoCapacity { .. } | Self::UpstreamBusy { .. } => {
                ("server_error", Some("no_capacity"))
            }
            Self::ReplicaFailed { .. } => ("server_error", Some("replica_failed")),
            Self::Stopped(_) | Self::Profile(_) | Self::Upstream { .. } | Self::Config(_) => {
                ("server_error", None)
            }
        };
        let busy = matches!(self, Self::NoCapacity { .. } | Self::UpstreamBusy { .. });
        let param = match &self {
            Self::InvalidParam { param, .. } => Some(param.as_str()),
            _ => None,
        };
        let told = busy || matches!(self, Self::ReplicaFailed { .. });
        let body = if status.is_server_error() && !told {
            tracing::error!(error = %self, "request failed");
            ErrorBody::server_error()
        } else {
            ErrorBody::new(self.to_string(), kind, param, code)
        };
        let mut res = (status, Json(body)).into_response();
        if busy {
            let secs = rand::rng().random_range(1..=3u32);
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        res
    }
}

async fn models(State(state): State<EngineState>) -> Response {
    Json(&*state.models).into_response()
}

async fn gpu_time(
    State(state): State<EngineState>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Json<GpuTimeReadings>, EngineError> {
    verify(&headers, &state.secret)?;
    if let Some(query) = uri.query() {
        return Err(EngineError::BadRequest(format!(
            "GET {GPU_TIME_PATH} takes no parameters (it reports every replica); got ?{query}"
        )));
    }
    Ok(Json(GpuTimeReadings {
        instance: state.sim.instance().to_owned(),
        started_at_ms: state.sim.started_at_ms(),
        replicas: state.sim.gpu_time().await,
    }))
}

/// The identity the request carries, verified.
fn verify(headers: &HeaderMap, secret: &Secret) -> Result<identity::Identity, EngineError> {
    let token = headers
        .get(identity::HEADER)
        .map(|v| v.to_str().unwrap_or_default());
    Ok(identity::verify(token, secret, identity::unix_now())?)
}

async fn metrics(State(state): State<EngineState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::metrics::render(&state.sim.snapshots()),
    )
}

async fn completions(
    State(EngineState { sim, secret, .. }): State<EngineState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, EngineError> {
    let now = identity::unix_now();
    let who = verify(&headers, &secret)?;
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => EngineError::PayloadTooLarge(e.body_text()),
        _ => EngineError::BadRequest(e.body_text()),
    })?;
    let req: ChatRequest =
        serde_json::from_slice(&body).map_err(|e| EngineError::BadRequest(e.to_string()))?;
    if let Some(field) = req.nul_field() {
        return Err(EngineError::BadRequest(field.message()));
    }
    if let Some(bad) = req
        .invalid()
        .or_else(|| wire::unsupported_by_simulator(&req))
    {
        return Err(EngineError::InvalidParam {
            param: bad.param.to_owned(),
            message: bad.message,
        });
    }
    let prompt = req.prompt();
    let creq = CompletionRequest {
        model: req.model.clone(),
        prompt,
        max_tokens: req.max_output(),
        seed: req.seed.unwrap_or(0),
        tenant_id: who.tenant,
        class: who.class,
        body: None,
    };
    let id = format!("chatcmpl-{:032x}", rand::random::<u128>());
    let created = now as i64;
    let generation = sim.start(&creq, req.streams()).await?;
    if !req.streams() {
        let done = generation.finish().await?;
        let mut body = wire::chat_completion(id, created, req.model, &done);
        body.meterline = Some(wire::meterline(&done));
        return Ok(Json(body).into_response());
    }
    let state = SseState {
        generation: Some(generation),
        pending: VecDeque::new(),
        chunks: ChunkStream {
            id,
            created,
            include_usage: req.include_usage(),
            model: req.model,
        },
        first: true,
    };
    let events = stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.pending.pop_front() {
                return Some((Ok::<_, Infallible>(ev), st));
            }
            let generation = st.generation.as_mut()?;
            match generation.next().await {
                Ok(Piece::Token(text)) => {
                    let chunk = st.chunks.token(&text, st.first);
                    st.first = false;
                    st.push(chunk.to_json());
                }
                Ok(Piece::Done(done)) => {
                    st.push(st.chunks.finish(wire::finish_reason(&done)).to_json());
                    if st.chunks.include_usage {
                        let mut last = st.chunks.usage(wire::usage(&done));
                        last.meterline = Some(wire::meterline(&done));
                        st.push(last.to_json());
                    }
                    st.pending.push_back(Event::default().data("[DONE]"));
                    st.generation = None;
                }
                Err(e) => {
                    tracing::error!(error = %e, "stream failed");
                    st.push(ErrorBody::server_error().to_json());
                    st.pending.push_back(Event::default().data("[DONE]"));
                    st.generation = None;
                }
            }
        }
    });
    Ok(Sse::new(events).into_response())
}

struct SseState {
    generation: Option<Generation>,
    pending: VecDeque<Event>,
    chunks: ChunkStream,
    first: bool,
}

impl SseState {
    fn push(&mut self, data: String) {
        self.pending.push_back(Event::default().data(data));
    }
}
