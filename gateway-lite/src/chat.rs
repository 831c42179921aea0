//! `POST /v1/chat/completions` and `GET /v1/models`: authenticate, check
//! the tenant's limits, run the engine, record exactly one usage event
//! durably, answer in OpenAI's shape.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::{Extension, Json};
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use engine::{CompletionRequest, EngineError, ServiceClass};
use serde::Deserialize;
use serde_json::{json, Value};
use usage_contract::{FinishReason, RequestId, UsageEvent, SCHEMA_VERSION};

use crate::error::GatewayError;
use crate::service::AppState;
use crate::tenants::Caller;

#[derive(Debug, Deserialize)]
struct ChatRequest {
    model: String,
    messages: Vec<Message>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    seed: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Message {
    #[allow(
        dead_code,
        reason = "part of the OpenAI shape; the simulator ignores roles"
    )]
    role: String,
    content: String,
}

fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Caller, GatewayError> {
    let key = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty())
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
        .map(|p| json!({"id": p.name, "object": "model", "created": 0, "owned_by": "meterline"}))
        .collect();
    Ok(Json(json!({"object": "list", "data": data})))
}

pub async fn completions(
    State(state): State<AppState>,
    Extension(request_id): Extension<RequestId>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, GatewayError> {
    let caller = authenticate(&state, &headers)?;
    let req: ChatRequest =
        serde_json::from_slice(&body).map_err(|e| GatewayError::BadRequest(e.to_string()))?;
    if req.stream {
        return Err(GatewayError::InvalidParam {
            param: "stream",
            message: "streaming is not supported by this gateway yet; send stream: false".into(),
        });
    }
    if req.messages.is_empty() {
        return Err(GatewayError::InvalidParam {
            param: "messages",
            message: "messages must contain at least one message".into(),
        });
    }
    if state.engine.profile(&req.model).is_none() {
        return Err(GatewayError::UnknownModel(req.model));
    }
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    if let (Some(asked), Some(limit)) = (max_tokens, caller.max_output) {
        if i64::from(asked) > i64::from(limit) {
            return Err(GatewayError::InvalidParam {
                param: "max_tokens",
                message: format!("max_tokens {asked} exceeds this tenant's max_output of {limit}"),
            });
        }
    }
    let prompt: String = req
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let prompt_tokens = engine::tokenizer::count(&prompt);
    if let Some(limit) = caller.max_context {
        if prompt_tokens > limit.max(0) as u64 {
            return Err(GatewayError::InvalidParam {
                param: "messages",
                message: format!("the prompt has {prompt_tokens} tokens, above this tenant's max_context of {limit}"),
            });
        }
    }
    let max_tokens = max_tokens.or(caller.max_output.map(|m| m.max(0) as u32));

    let started_at = now_ms();
    let done = state
        .engine
        .complete(&CompletionRequest {
            model: req.model.clone(),
            prompt,
            max_tokens,
            seed: req.seed.unwrap_or(0),
            tenant_id: caller.tenant_id.clone(),
            class: ServiceClass::from_priority(caller.priority),
        })
        .await
        .map_err(|e| match e {
            EngineError::NoCapacity { .. } => GatewayError::NoCapacity(e.to_string()),
            EngineError::Stopped(_) | EngineError::Profile(_) => {
                GatewayError::Engine(e.to_string())
            }
            _ => GatewayError::InvalidParam {
                param: "messages",
                message: e.to_string(),
            },
        })?;
    let finished_at = now_ms().max(started_at);
    let finish_reason = if done.length_capped {
        FinishReason::Length
    } else {
        FinishReason::Stop
    };
    let ttft_ms = done.ttft.as_millis() as i64;
    let first_token_at = (done.completion_tokens > 0).then(|| {
        let real = ChronoDuration::milliseconds(ttft_ms / i64::from(state.speedup.max(1)));
        (started_at + real).min(finished_at)
    });
    let tpot_ms = (done.completion_tokens > 1)
        .then(|| (done.total.as_millis() as i64 - ttft_ms) / (done.completion_tokens as i64 - 1));
    let event = UsageEvent {
        schema_version: SCHEMA_VERSION,
        request_id,
        tenant_id: caller.tenant_id.clone(),
        api_key_id: caller.api_key_id.clone(),
        model: req.model.clone(),
        model_version: done.model_version.clone(),
        priority: caller.priority,
        started_at,
        first_token_at,
        finished_at,
        prompt_tokens: done.prompt_tokens as i64,
        cached_tokens: done.cached_tokens as i64,
        completion_tokens: done.completion_tokens as i64,
        gpu_seconds: done.gpu_seconds,
        preempted_gpu_seconds: done.preempted_gpu_seconds,
        finish_reason,
        ttft_ms: Some(ttft_ms),
        tpot_ms,
        replica_id: done.replica_id.clone(),
        gateway_id: state.gateway_id.clone(),
        stream: false,
    };
    // Durable before the client hears anything: an answered request is a
    // billed request, whatever happens to this process next.
    state
        .outbox
        .append(caller.tenant_id.clone(), event.to_json())
        .await?;
    crate::telemetry::record_request(&caller.tenant_id, &req.model, &event);

    let total = done.prompt_tokens + done.completion_tokens;
    Ok(Json(json!({
        "id": format!("chatcmpl-{}", request_id.as_uuid().simple()),
        "object": "chat.completion",
        "created": started_at.timestamp(),
        "model": req.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": done.text},
            "finish_reason": finish_reason.as_str(),
        }],
        "usage": {
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "total_tokens": total,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
        },
    })))
}

/// Now, truncated to the millisecond the contract carries.
fn now_ms() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now)
}
