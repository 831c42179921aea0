//! An admitted request, from the engine's admission to its one usage event.
//!
//! A [`Run`] owns everything that must be settled when the request ends,
//! however it ends: its limits [`Permit`] (the token estimate is reconciled
//! with the actual count, the concurrency slot released), its claimed
//! `Idempotency-Key`, and the duty to write exactly one usage event to the
//! outbox. Runs are driven by spawned tasks that own the engine's
//! [`Generation`], so they finish even when axum drops the handler future
//! or the response body because the client went away:
//!
//! - non-streaming: the task awaits the completion and hands the answer
//!   back; if nobody is waiting any more, the event is written all the same;
//! - streaming: the task forwards tokens as SSE chunks; when the client
//!   disconnects it drops the generation (the engine cancels it and frees
//!   its KV) and writes a `cancelled` event with the tokens produced. On
//!   completion the event is durable in the outbox before the final chunks
//!   and `data: [DONE]` are sent.

use std::time::Instant;

use axum::body::Bytes;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use engine::{Completion, Generation, ModelProfile, Piece};
use rust_decimal::Decimal;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use usage_contract::{FinishReason, RequestId, UsageEvent, SCHEMA_VERSION};

use crate::error::GatewayError;
use crate::idempotency::{Guard, Stored};
use crate::limits::Permit;
use crate::service::AppState;
use crate::tenants::Caller;

/// One admitted request; see the module docs.
pub struct Run {
    pub state: AppState,
    pub caller: Caller,
    pub request_id: RequestId,
    pub model: String,
    pub profile: ModelProfile,
    pub started_at: DateTime<Utc>,
    pub prompt_tokens: u64,
    pub permit: Permit,
    pub idempotency: Option<Guard>,
}

/// How a request that did not complete ended.
#[derive(Debug, Clone, Copy)]
struct Partial {
    produced: u64,
    first_token_at: Option<DateTime<Utc>>,
    reason: FinishReason,
}

impl Run {
    fn chat_id(&self) -> String {
        format!("chatcmpl-{}", self.request_id.as_uuid().simple())
    }

    /// Non-streaming: waits for the completion, records it, and returns
    /// the response body (also stored under the idempotency key).
    pub async fn complete(mut self, generation: Generation) -> Result<Value, GatewayError> {
        let done = match generation.finish().await {
            Ok(done) => done,
            Err(e) => {
                let partial = Partial {
                    produced: 0,
                    first_token_at: None,
                    reason: FinishReason::Error,
                };
                self.record(self.partial_event(partial, false)).await?;
                return Err(GatewayError::Engine(e.to_string()));
            }
        };
        self.record(self.completed_event(&done, false)).await?;
        let body = json!({
            "id": self.chat_id(),
            "object": "chat.completion",
            "created": self.started_at.timestamp(),
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": done.text},
                "finish_reason": finish_reason(&done).as_str(),
            }],
            "usage": usage(&done),
        });
        if let Some(guard) = self.idempotency.take() {
            guard.complete(
                Stored {
                    content_type: "application/json",
                    request_id: self.request_id.to_string(),
                    body: Bytes::from(body.to_string()),
                },
                Instant::now(),
            );
        }
        Ok(body)
    }

    /// Streaming: forwards the generation to `tx` as SSE frames until it
    /// ends or the receiver (the response body) is dropped.
    pub async fn stream(
        mut self,
        mut generation: Generation,
        tx: mpsc::Sender<Bytes>,
        include_usage: bool,
    ) {
        let base = json!({
            "id": self.chat_id(),
            "object": "chat.completion.chunk",
            "created": self.started_at.timestamp(),
            "model": self.model,
        });
        let chunk = |choices: Value, usage_value: Option<Value>| {
            let mut c = base.clone();
            c["choices"] = choices;
            if include_usage {
                c["usage"] = usage_value.unwrap_or(Value::Null);
            }
            sse(&c.to_string())
        };
        // Everything sent, kept only to replay it under an Idempotency-Key.
        let mut transcript = self.idempotency.as_ref().map(|_| Vec::<u8>::new());
        let mut produced = 0u64;
        let mut first_token_at = None;
        let ended = loop {
            let piece = tokio::select! {
                biased;
                () = tx.closed() => break None,
                piece = generation.next() => piece,
            };
            match piece {
                Ok(Piece::Token(text)) => {
                    produced += 1;
                    let mut delta = json!({"content": text});
                    if first_token_at.is_none() {
                        first_token_at = Some(now_ms().max(self.started_at));
                        delta["role"] = json!("assistant");
                    }
                    let frame = chunk(
                        json!([{"index": 0, "delta": delta, "finish_reason": null}]),
                        None,
                    );
                    if let Some(t) = transcript.as_mut() {
                        t.extend_from_slice(&frame);
                    }
                    if tx.send(frame).await.is_err() {
                        break None;
                    }
                }
                Ok(Piece::Done(done)) => break Some(Ok(done)),
                Err(e) => break Some(Err(e)),
            }
        };
        let done = match ended {
            Some(Ok(done)) => done,
            None | Some(Err(_)) => {
                let reason = if ended.is_none() {
                    FinishReason::Cancelled
                } else {
                    FinishReason::Error
                };
                // Cancel at the engine first (frees its KV), then bill what it produced.
                drop(generation);
                let partial = Partial {
                    produced,
                    first_token_at,
                    reason,
                };
                let event = self.partial_event(partial, true);
                if let Some(Err(e)) = &ended {
                    tracing::error!(error = %e, "stream failed");
                }
                let recorded = self.record(event).await;
                if let Err(e) = recorded {
                    tracing::error!(error = %e, "usage of a stream that did not complete was not recorded");
                }
                if ended.is_some() {
                    let _ = tx.send(sse(&stream_error().to_string())).await;
                    let _ = tx.send(sse("[DONE]")).await;
                }
                return;
            }
        };
        // Durable before the client hears the stream is over.
        if let Err(e) = self.record(self.completed_event(&done, true)).await {
            tracing::error!(error = %e, "usage of a stream was not recorded");
            let _ = tx.send(sse(&stream_error().to_string())).await;
            let _ = tx.send(sse("[DONE]")).await;
            return;
        }
        let mut tail = vec![chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": finish_reason(&done).as_str()}]),
            None,
        )];
        if include_usage {
            tail.push(chunk(json!([]), Some(usage(&done))));
        }
        tail.push(sse("[DONE]"));
        for frame in tail {
            if let Some(t) = transcript.as_mut() {
                t.extend_from_slice(&frame);
            }
            if tx.send(frame).await.is_err() {
                break;
            }
        }
        if let (Some(guard), Some(t)) = (self.idempotency.take(), transcript) {
            guard.complete(
                Stored {
                    content_type: "text/event-stream",
                    request_id: self.request_id.to_string(),
                    body: Bytes::from(t),
                },
                Instant::now(),
            );
        }
    }

    /// Writes the event durably, then reconciles the token estimate.
    async fn record(&mut self, event: UsageEvent) -> Result<(), GatewayError> {
        let used = (event.prompt_tokens + event.completion_tokens).max(0) as u64;
        let result = self
            .state
            .outbox
            .append(self.caller.tenant_id.clone(), event.to_json())
            .await;
        self.permit.settle(used, Instant::now());
        result?;
        crate::telemetry::record_request(&self.caller.tenant_id, &self.model, &event);
        Ok(())
    }

    fn event(&self) -> UsageEvent {
        let finished_at = now_ms().max(self.started_at);
        UsageEvent {
            schema_version: SCHEMA_VERSION,
            request_id: self.request_id,
            tenant_id: self.caller.tenant_id.clone(),
            api_key_id: self.caller.api_key_id.clone(),
            model: self.model.clone(),
            model_version: self.profile.version.clone(),
            priority: self.caller.priority,
            started_at: self.started_at,
            first_token_at: None,
            finished_at,
            prompt_tokens: self.prompt_tokens as i64,
            cached_tokens: 0,
            completion_tokens: 0,
            gpu_seconds: Decimal::ZERO,
            preempted_gpu_seconds: Decimal::ZERO,
            finish_reason: FinishReason::Stop,
            ttft_ms: None,
            tpot_ms: None,
            replica_id: format!("{}-r0", self.model),
            gateway_id: self.state.gateway_id.clone(),
            stream: false,
        }
    }

    /// The event of a request the engine completed: its own figures.
    fn completed_event(&self, done: &Completion, stream: bool) -> UsageEvent {
        let mut e = self.event();
        let ttft_ms = done.ttft.as_millis() as i64;
        e.first_token_at = (done.completion_tokens > 0).then(|| {
            let real = ChronoDuration::milliseconds(ttft_ms / i64::from(self.state.speedup.max(1)));
            (self.started_at + real).min(e.finished_at)
        });
        e.tpot_ms = (done.completion_tokens > 1).then(|| {
            (done.total.as_millis() as i64 - ttft_ms) / (done.completion_tokens as i64 - 1)
        });
        e.ttft_ms = Some(ttft_ms);
        e.model_version = done.model_version.clone();
        e.replica_id = done.replica_id.clone();
        e.prompt_tokens = done.prompt_tokens as i64;
        e.cached_tokens = done.cached_tokens as i64;
        e.completion_tokens = done.completion_tokens as i64;
        e.gpu_seconds = done.gpu_seconds;
        e.preempted_gpu_seconds = done.preempted_gpu_seconds;
        e.finish_reason = finish_reason(done);
        e.stream = stream;
        e
    }

    /// The event of a request that was cancelled or failed: the tokens the
    /// gateway received from the engine. The engine does not hand back the
    /// figures of a request it cancelled, so GPU time is estimated from the
    /// model's roofline (see [`estimated_gpu_seconds`]) and cached tokens
    /// are reported as 0.
    fn partial_event(&self, p: Partial, stream: bool) -> UsageEvent {
        let mut e = self.event();
        e.completion_tokens = p.produced as i64;
        e.first_token_at = p.first_token_at.map(|t| t.min(e.finished_at));
        let speedup = i64::from(self.state.speedup.max(1));
        e.ttft_ms = e
            .first_token_at
            .map(|t| (t - self.started_at).num_milliseconds().max(0) * speedup);
        e.gpu_seconds = estimated_gpu_seconds(&self.profile, self.prompt_tokens, p.produced);
        e.finish_reason = p.reason;
        e.stream = stream;
        e
    }
}

/// GPU-seconds of a request cut short, from the profile's roofline: the
/// request's own compute and KV reads for its prefill and each decoded
/// token, times the replica's GPUs (its share of the shared weight reads is
/// left out, so batched neighbours are not billed to it).
pub fn estimated_gpu_seconds(profile: &ModelProfile, prompt: u64, produced: u64) -> Decimal {
    let c = profile.costs();
    let (p, n) = (u128::from(prompt), u128::from(produced));
    let (tok, kv) = (u128::from(c.token_ps), u128::from(c.kv_token_ps));
    let prefill = p * tok + p * kv;
    let decode = n * tok + kv * (n * p + n * n.saturating_sub(1) / 2);
    let micros = (prefill + decode).div_ceil(1_000_000) * u128::from(profile.gpus);
    engine::attribution::to_gpu_seconds(u64::try_from(micros).unwrap_or(u64::MAX))
}

fn finish_reason(done: &Completion) -> FinishReason {
    if done.length_capped {
        FinishReason::Length
    } else {
        FinishReason::Stop
    }
}

fn usage(done: &Completion) -> Value {
    json!({
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    })
}

fn stream_error() -> Value {
    json!({"error": {"message": "the server had an error while processing your request", "type": "server_error", "param": null, "code": null}})
}

/// One SSE frame.
fn sse(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// Now, truncated to the millisecond the contract carries.
pub fn now_ms() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    #[test]
    fn estimate_grows_with_tokens_and_is_positive() {
        let p = ModelProfile::reference().into_iter().next().unwrap();
        let a = estimated_gpu_seconds(&p, 100, 0);
        let b = estimated_gpu_seconds(&p, 100, 10);
        assert!(a > Decimal::ZERO);
        assert!(b > a);
        assert_eq!(b.scale(), 6);
    }
}
