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
//!
//! A non-streaming request of a queued model may be **preempted**
//! ([`admission::preemption`]): its generation is cancelled at the engine, the
//! GPU time it used is kept as thrown away (`preempted_gpu_seconds`, also
//! part of `gpu_seconds`), and it runs again after waiting in its queue
//! at its own priority; its client only waits longer. The one event it
//! ends with carries every attempt's GPU time and how often it was
//! preempted.
//!
//! A request still running after GATEWAY_REQUEST_TIMEOUT_SECS is stopped the
//! same way (cancelled at the engine) and billed as an `error` with what it
//! used; the client gets a 504, or, mid-stream, an error chunk and
//! `data: [DONE]`.

use std::time::Instant;

use admission::upstream::{Generation, ModelInfo};
use axum::body::Bytes;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use engine::{Completion, CompletionRequest, EngineError, Piece};
use openai_wire::ChunkStream;
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;
use tokio::sync::{mpsc, oneshot};
use usage_contract::{FinishReason, Placement, RequestId, UsageEvent, SCHEMA_VERSION};

use crate::error::GatewayError;
use crate::idempotency::{Guard, Stored};
use crate::state::AppState;
use crate::tenants::Caller;
use admission::limits::Permit;

/// One admitted request; see the module docs.
pub struct Run {
    pub state: AppState,
    pub caller: Caller,
    pub request_id: RequestId,
    pub model: String,
    pub info: ModelInfo,
    pub started_at: DateTime<Utc>,
    /// How long it waited in the model's fair queue before the engine took it.
    pub queued: std::time::Duration,
    pub prompt_tokens: u64,
    /// Its estimated GPU time (GPU-µs): what the fair queue charged it
    /// before it ran, corrected by what it used when it completes.
    pub cost_gpu_micros: u64,
    pub permit: Permit,
    pub idempotency: Option<Guard>,
    /// What to ask the engine again if the request is preempted: set for
    /// non-streaming requests of a model with a priority queue.
    pub requeue: Option<Requeue>,
    /// What preemptions threw away so far.
    pub lost: Lost,
}

/// A request as it is sent again after a preemption.
#[derive(Debug, Clone)]
pub struct Requeue {
    pub request: CompletionRequest,
}

/// The attempts a request lost to preemption.
#[derive(Debug, Clone, Default)]
pub struct Lost {
    /// Their GPU time, every bit of it thrown away.
    pub gpu_seconds: Decimal,
    pub preemptions: u32,
    /// The preemption chain's depth this request is at.
    pub depth: u8,
    /// Wall time from the request's first start to its last restart.
    pub waited: std::time::Duration,
}

/// How waiting on a generation ended.
enum Ended {
    Done(Completion),
    Failed(EngineError),
    /// The client went away.
    ClientGone,
    /// GATEWAY_REQUEST_TIMEOUT_SECS passed.
    TimedOut,
}

/// How a request that did not complete ended.
#[derive(Debug, Clone)]
struct Partial {
    produced: u64,
    first_token_at: Option<DateTime<Utc>>,
    reason: FinishReason,
    /// The engine's own account of the request, when it could give one.
    used: Option<Completion>,
}

impl Run {
    fn chat_id(&self) -> String {
        format!("chatcmpl-{}", self.request_id.as_uuid().simple())
    }

    /// Non-streaming: waits for the completion, records it, and sends the
    /// response body (also stored under the idempotency key) to `reply`.
    /// If the client goes away first (`reply` closed), the generation is
    /// cancelled at the engine and what it produced until then is billed.
    pub async fn complete(
        mut self,
        mut generation: Generation,
        mut reply: oneshot::Sender<Result<Bytes, GatewayError>>,
    ) {
        let deadline = tokio::time::sleep(self.state.request_timeout);
        tokio::pin!(deadline);
        let mut registration = self.register(&generation);
        let mut attempt_started = Instant::now();
        let ended = loop {
            let step = tokio::select! {
                biased;
                () = reply.closed() => break Ended::ClientGone,
                () = &mut deadline => break Ended::TimedOut,
                p = preempted(&mut registration) => Err(p),
                piece = generation.next() => Ok(piece),
            };
            let piece = match step {
                Ok(piece) => piece,
                Err(p) => match self.run_again(generation, p).await {
                    Ok(again) => {
                        generation = again;
                        self.lost.waited += attempt_started.elapsed();
                        attempt_started = Instant::now();
                        registration = self.register(&generation);
                        continue;
                    }
                    Err(e) => return self.abandon(e, reply).await,
                },
            };
            match piece {
                Ok(Piece::Done(done)) => break Ended::Done(done),
                Ok(Piece::Token(_)) => {}
                Err(e) => break Ended::Failed(e),
            }
        };
        let done = match ended {
            Ended::Done(done) => done,
            Ended::Failed(e) => {
                // What the engine says the request used (a replica that
                // died reports it), else the roofline's estimate.
                let used = e.used().cloned();
                let partial = Partial {
                    produced: used.as_ref().map_or(0, |u| u.completion_tokens),
                    first_token_at: None,
                    reason: FinishReason::Error,
                    used,
                };
                let answer = match self.record(self.partial_event(partial, false)).await {
                    Ok(()) => Err(GatewayError::from(e)),
                    Err(recorded) => Err(recorded),
                };
                let _ = reply.send(answer);
                return;
            }
            Ended::ClientGone => {
                let recorded = self
                    .stop(generation, FinishReason::Cancelled, None, None)
                    .await;
                if let Err(e) = recorded {
                    tracing::error!(error = %e, "usage of a cancelled request was not recorded");
                }
                return;
            }
            Ended::TimedOut => {
                let recorded = self.stop(generation, FinishReason::Error, None, None).await;
                let timeout = GatewayError::Timeout(self.state.request_timeout);
                let _ = reply.send(Err(recorded.err().unwrap_or(timeout)));
                return;
            }
        };
        let body = engine::wire::chat_completion(
            self.chat_id(),
            self.started_at.timestamp(),
            self.model.clone(),
            &done,
        );
        let answer = Stored {
            content_type: "application/json",
            request_id: self.request_id.to_string(),
            body: Bytes::from(serde_json::to_vec(&body).unwrap_or_default()),
        };
        let event = self.completed_event(&done, false);
        if let Err(e) = self.record_answered(event, Some(&answer)).await {
            let _ = reply.send(Err(e));
            return;
        }
        let _ = reply.send(Ok(answer.body));
    }

    /// A preempted request that could not run again: it is billed what
    /// its attempts used, all of it thrown away, and its client gets `e`.
    async fn abandon(
        mut self,
        e: GatewayError,
        reply: oneshot::Sender<Result<Bytes, GatewayError>>,
    ) {
        let mut event = self.event();
        event.finish_reason = FinishReason::Error;
        event.gpu_seconds = self.lost.gpu_seconds;
        event.preempted_gpu_seconds = self.lost.gpu_seconds;
        let answer = match self.record(event).await {
            Ok(()) => Err(e),
            Err(recorded) => Err(recorded),
        };
        let _ = reply.send(answer);
    }

    /// Registers a running attempt as preemptible, if this request can be
    /// preempted at all.
    fn register(&self, generation: &Generation) -> Option<admission::preemption::Registration> {
        self.requeue.as_ref()?;
        let preemptions = self.state.queues.as_ref()?.preemptions(&self.model)?;
        Some(preemptions.register(admission::preemption::Run {
            model: &self.model,
            replica: generation.replica_id()?,
            owner: generation.dedicated_to(),
            tenant: &self.caller.tenant_id,
            priority: self.caller.priority,
        }))
    }

    /// After a preemption: cancels the attempt (its KV freed, its GPU time
    /// kept as lost), then waits in the model's queue at the request's own
    /// priority until a replica takes it again. A re-queued request that
    /// cannot start may preempt a lower one in turn (one level deeper).
    async fn run_again(
        &mut self,
        generation: Generation,
        p: admission::preemption::Preempted,
    ) -> Result<Generation, GatewayError> {
        match generation.cancel().await {
            Ok(used) => self.lost.gpu_seconds += used.gpu_seconds,
            Err(e) => tracing::warn!(error = %e, "a preempted attempt did not report its GPU time"),
        }
        self.lost.preemptions += 1;
        self.lost.depth = p.depth;
        tracing::info!(
            request_id = %self.request_id,
            tenant = %self.caller.tenant_id,
            by = %p.by_tenant,
            lost_gpu_seconds = %self.lost.gpu_seconds,
            "preempted; queued again"
        );
        let (Some(requeue), Some(queues)) = (self.requeue.as_ref(), self.state.queues.as_ref())
        else {
            return Err(GatewayError::Engine(
                "a preempted request could not be queued again".into(),
            ));
        };
        // Its room is free now: the next in line (the preemptor) may start.
        queues.wake(&self.model);
        admission::place::again(
            self.state.admission(),
            &self.caller,
            &requeue.request,
            self.cost_gpu_micros,
            self.lost.depth,
        )
        .await
        .map_err(GatewayError::from)
    }

    /// Streaming: forwards the generation to `tx` as SSE frames until it
    /// ends or the receiver (the response body) is dropped.
    pub async fn stream(
        mut self,
        mut generation: Generation,
        tx: mpsc::Sender<Bytes>,
        include_usage: bool,
    ) {
        let chunks = ChunkStream {
            id: self.chat_id(),
            created: self.started_at.timestamp(),
            model: self.model.clone(),
            include_usage,
        };
        // Everything sent, kept only to replay it under an Idempotency-Key.
        let mut transcript = self.idempotency.as_ref().map(|_| Vec::<u8>::new());
        let mut produced = 0u64;
        let mut first_token_at = None;
        let deadline = tokio::time::sleep(self.state.request_timeout);
        tokio::pin!(deadline);
        let ended = loop {
            let piece = tokio::select! {
                biased;
                () = tx.closed() => break Ended::ClientGone,
                () = &mut deadline => break Ended::TimedOut,
                piece = generation.next() => piece,
            };
            match piece {
                Ok(Piece::Token(text)) => {
                    produced += 1;
                    let first = first_token_at.is_none();
                    if first {
                        first_token_at = Some(now_ms().max(self.started_at));
                    }
                    let frame = sse(&chunks.token(&text, first).to_json());
                    if let Some(t) = transcript.as_mut() {
                        t.extend_from_slice(&frame);
                    }
                    if tx.send(frame).await.is_err() {
                        break Ended::ClientGone;
                    }
                }
                Ok(Piece::Done(done)) => break Ended::Done(done),
                Err(e) => break Ended::Failed(e),
            }
        };
        let (reason, told, used) = match ended {
            Ended::Done(done) => return self.finish_stream(done, &chunks, transcript, tx).await,
            Ended::ClientGone => (FinishReason::Cancelled, None, None),
            Ended::TimedOut => (
                FinishReason::Error,
                Some(GatewayError::Timeout(self.state.request_timeout)),
                None,
            ),
            Ended::Failed(e) => {
                tracing::error!(error = %e, "stream failed");
                let used = e.used().cloned();
                (FinishReason::Error, Some(GatewayError::from(e)), used)
            }
        };
        // The client is billed the tokens it was sent.
        let streamed = Some((produced, first_token_at));
        if let Err(e) = self.stop(generation, reason, streamed, used).await {
            tracing::error!(error = %e, "usage of a stream that did not complete was not recorded");
        }
        if let Some(told) = told {
            let _ = tx.send(sse(&told.openai_body().to_json())).await;
            let _ = tx.send(sse("[DONE]")).await;
        }
    }

    /// Stops a generation that did not complete at the engine (freeing its
    /// KV) and records what it used: the engine's own figures, with the
    /// tokens the client was sent for a stream (`streamed`: how many, and
    /// when the first went out).
    async fn stop(
        &mut self,
        generation: Generation,
        reason: FinishReason,
        streamed: Option<(u64, Option<DateTime<Utc>>)>,
        known: Option<Completion>,
    ) -> Result<(), GatewayError> {
        let used = match known {
            Some(used) => Some(used),
            None => generation.cancel().await.ok(),
        };
        let (produced, first_token_at) =
            streamed.unwrap_or_else(|| (used.as_ref().map_or(0, |c| c.completion_tokens), None));
        let partial = Partial {
            produced,
            first_token_at,
            reason,
            used,
        };
        self.record(self.partial_event(partial, streamed.is_some()))
            .await
    }

    /// The end of a completed stream: the event durable (with the answer to
    /// replay) before the last chunks and `data: [DONE]` are sent.
    async fn finish_stream(
        mut self,
        done: Completion,
        chunks: &ChunkStream,
        transcript: Option<Vec<u8>>,
        tx: mpsc::Sender<Bytes>,
    ) {
        let mut tail = vec![sse(&chunks
            .finish(engine::wire::finish_reason(&done))
            .to_json())];
        if chunks.include_usage {
            tail.push(sse(&chunks.usage(engine::wire::usage(&done)).to_json()));
        }
        tail.push(sse("[DONE]"));
        let answer = transcript.map(|mut t| {
            tail.iter().for_each(|f| t.extend_from_slice(f));
            Stored {
                content_type: "text/event-stream",
                request_id: self.request_id.to_string(),
                body: Bytes::from(t),
            }
        });
        let event = self.completed_event(&done, true);
        if let Err(e) = self.record_answered(event, answer.as_ref()).await {
            tracing::error!(error = %e, "usage of a stream was not recorded");
            let _ = tx.send(sse(&e.openai_body().to_json())).await;
            let _ = tx.send(sse("[DONE]")).await;
            return;
        }
        for frame in tail {
            if tx.send(frame).await.is_err() {
                break;
            }
        }
    }

    /// Writes the event durably, then reconciles the token estimate.
    async fn record(&mut self, event: UsageEvent) -> Result<(), GatewayError> {
        self.record_answered(event, None).await
    }

    /// [`Run::record`], storing `answer` under the request's
    /// `Idempotency-Key` (if it has one) in the same commit.
    async fn record_answered(
        &mut self,
        event: UsageEvent,
        answer: Option<&Stored>,
    ) -> Result<(), GatewayError> {
        let used = (event.prompt_tokens + event.completion_tokens).max(0) as u64;
        let answer_for_peers = answer.filter(|_| self.idempotency.is_some());
        let answer = match (&self.idempotency, answer) {
            (Some(guard), Some(a)) => Some(guard.answer(a, now_ms().timestamp_millis())),
            _ => None,
        };
        let result = self
            .state
            .outbox
            .append_with_answer(self.caller.tenant_id.clone(), event.to_json(), answer)
            .await;
        self.permit.settle(used, Instant::now());
        result?;
        if let Some(guard) = self.idempotency.as_mut() {
            guard.billed();
        }
        if let (Some(guard), Some(a)) = (self.idempotency.as_mut(), answer_for_peers) {
            guard.publish(a).await;
        }
        crate::telemetry::record_request(&self.caller.tenant_id, &self.model, &event);
        let speedup = i64::from(self.state.speedup.max(1));
        // What the client saw: the queue wait, then the engine's time
        // (the simulator may run faster than real time).
        let queued = (self.queued + self.lost.waited).as_millis() as u64 * speedup as u64;
        self.state.slo.record(
            &self.caller.tenant_id,
            self.caller.slo,
            self.caller.priority,
            event.ttft_ms.map(|ms| ms.max(0) as u64 + queued),
            ((event.finished_at - event.started_at)
                .num_milliseconds()
                .max(0)
                * speedup) as u64
                + queued,
            event.finish_reason == FinishReason::Error,
            Instant::now(),
        );
        if let Some(queues) = &self.state.queues {
            // Its tenant is charged what it used; its KV is free, so the
            // next in line may fit now.
            let used = (event.gpu_seconds * Decimal::from(1_000_000))
                .to_u64()
                .unwrap_or(u64::MAX);
            // Each attempt was charged the estimate when it left the queue;
            // the GPU time includes what preempted attempts used.
            let charged = self.cost_gpu_micros * (1 + u64::from(self.lost.preemptions));
            queues.completed(&self.model, &self.caller, charged, used);
        }
        if let Some(ms) = event.tpot_ms.filter(|ms| *ms > 0) {
            let tpot = std::time::Duration::from_millis(ms as u64);
            self.state.tpot.record(&self.model, tpot, Instant::now());
        }
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
            model_version: self.info.version.clone(),
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
            replica_id: self.info.replica_id.clone(),
            gateway_id: self.state.gateway_id.clone(),
            stream: false,
            placement: Some(Placement {
                pool: self.model.clone(),
                dedicated_to: None,
                // In the engine's time, as ttft_ms (the queue wait is real
                // time; the simulator may run faster).
                queue_wait_ms: (self.queued + self.lost.waited).as_millis() as i64
                    * i64::from(self.state.speedup.max(1)),
                preemptions: i64::from(self.lost.preemptions),
            }),
        }
    }

    /// What the engine said of where it ran the request, and what earlier
    /// attempts lost to preemption.
    fn placed(&self, e: &mut UsageEvent, used: &Completion) {
        if let Some(p) = e.placement.as_mut() {
            p.dedicated_to = used.dedicated_to.clone();
            p.preemptions += i64::from(used.preemptions);
        }
        e.gpu_seconds += self.lost.gpu_seconds;
        e.preempted_gpu_seconds += self.lost.gpu_seconds;
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
        self.placed(&mut e, done);
        e.finish_reason = finish_reason(done);
        e.stream = stream;
        e
    }

    /// The event of a request that was cancelled or failed: the tokens the
    /// client was sent, and the GPU time and cached tokens the engine
    /// reported when it stopped the request (a replica that died reports
    /// them too). When the engine could not say (an HTTP upstream failed),
    /// GPU time is the model's roofline estimate.
    fn partial_event(&self, p: Partial, stream: bool) -> UsageEvent {
        let mut e = self.event();
        e.completion_tokens = p.produced as i64;
        e.first_token_at = p.first_token_at.map(|t| t.min(e.finished_at));
        let speedup = i64::from(self.state.speedup.max(1));
        e.ttft_ms = e
            .first_token_at
            .map(|t| (t - self.started_at).num_milliseconds().max(0) * speedup);
        match &p.used {
            Some(used) => {
                e.prompt_tokens = used.prompt_tokens as i64;
                e.cached_tokens = used.cached_tokens as i64;
                e.gpu_seconds = used.gpu_seconds;
                e.preempted_gpu_seconds = used.preempted_gpu_seconds;
                e.model_version = used.model_version.clone();
                e.replica_id = used.replica_id.clone();
                self.placed(&mut e, used);
            }
            None => {
                e.gpu_seconds = self.state.engine.estimated_gpu_seconds(
                    &self.model,
                    self.prompt_tokens,
                    p.produced,
                ) + self.lost.gpu_seconds;
                e.preempted_gpu_seconds = self.lost.gpu_seconds;
            }
        }
        e.finish_reason = p.reason;
        e.stream = stream;
        e
    }
}

/// Resolves when the registered attempt is preempted; never without one.
async fn preempted(
    registration: &mut Option<admission::preemption::Registration>,
) -> admission::preemption::Preempted {
    match registration {
        Some(r) => r.preempted().await,
        None => std::future::pending().await,
    }
}

fn finish_reason(done: &Completion) -> FinishReason {
    if done.length_capped {
        FinishReason::Length
    } else {
        FinishReason::Stop
    }
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
