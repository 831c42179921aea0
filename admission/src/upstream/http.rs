//! An OpenAI-compatible server (vLLM, or Meterline's own `engine` binary)
//! as the upstream of a model.
//!
//! Every request goes upstream as a stream with `include_usage`, whatever
//! the client asked for: the chunks tell when tokens are produced (the
//! [`Ledger`] weights follow them, TTFT is measured) and the last chunk
//! carries the upstream's own token counts, which are authoritative.
//! Dropping or cancelling a generation closes the connection, which is how
//! vLLM learns to abort the request and free its KV.
//!
//! GPU time: Meterline's engine reports each request's attributed
//! GPU-seconds in a `meterline` extension of its usage chunk; with
//! `gpu_time: auto` that figure is used when present. Otherwise (vLLM
//! reports none) the request's share of the replica's busy time comes from
//! the [`Ledger`].
//!
//! Identity: with `identity_secret_env` the tenant and class go as one
//! signed `x-meterline-identity` header, signed per request; without it, as
//! plain `x-tenant-id` / `x-service-class` (vLLM ignores both). The body's
//! `cache_salt` is the tenant's own with `cache_salt: true`, and removed
//! otherwise; [`HttpUpstream::body`] builds what is sent.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use reqwest::StatusCode;
use rust_decimal::Decimal;
use serde_json::{json, Value};

use crate::floors::FloorShare;
use crate::occupancy::{self, Occupancy};
use crate::upstream::dedicated::{Dedicated, OwnerBusy};
use crate::upstream::ledger::{Ledger, Share, SharedLedger, SHARED_GROW_EVERY};
use crate::upstream::{GpuTime, RemoteModel};
use engine::attribution::to_gpu_seconds;
use engine::error::EngineError;
use engine::identity::{self, Secret, Signer};
use engine::scheduler::ServiceClass;
use engine::simulator::{Completion, CompletionRequest, GpuTimeReadings, Piece, GPU_TIME_PATH};
use engine::tokenizer;
use openai_wire::{ErrorBody, Meterline, Usage};

type Events = Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<reqwest::Error>>> + Send>>;

/// One upstream replica serving one model.
#[derive(Debug)]
pub struct HttpUpstream {
    pub config: RemoteModel,
    url: String,
    /// The configured URL without a trailing slash.
    base: String,
    api_key: Option<String>,
    /// Signs `x-meterline-identity` when `identity_secret_env` is set.
    signer: Option<Signer>,
    client: reqwest::Client,
    pub ledger: Arc<Ledger>,
    /// Set when several gateways front this replica (see [`SharedLedger`]).
    pub shared: Option<Arc<dyn SharedLedger>>,
    pub occupancy: Arc<Occupancy>,
    /// Until when (ms since the Unix epoch) the replica is out of its
    /// pool: it could not be reached.
    down_until_ms: std::sync::atomic::AtomicU64,
    /// Its owner, when it is dedicated (`dedicated_to`).
    pub dedicated: Option<Arc<Dedicated>>,
}

/// The name a gateway signs its reads of an engine's GPU time with (no
/// tenant: the signature is what the engine checks).
const REPORTER_IDENTITY: &str = "meterline-replica-reports";

/// How long a replica that could not be reached stays out of its pool.
pub const DOWN_FOR: Duration = Duration::from_secs(5);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl HttpUpstream {
    /// Whether the replica is out of its pool (it could not be reached in
    /// the last [`DOWN_FOR`]).
    pub fn is_down(&self) -> bool {
        self.down_until_ms
            .load(std::sync::atomic::Ordering::Acquire)
            > now_ms()
    }

    fn mark_down(&self) {
        self.down_until_ms.store(
            now_ms() + DOWN_FOR.as_millis() as u64,
            std::sync::atomic::Ordering::Release,
        );
    }

    /// The error for a request the upstream did not take: not reached, or
    /// answered with a status that is not a success. 429 and 503 are
    /// [`EngineError::UpstreamBusy`] (it did no work: the request may be
    /// sent again, here or to another replica).
    async fn refusal(&self, failed: Result<reqwest::Response, reqwest::Error>) -> EngineError {
        let model = &self.config.model;
        let upstream_error = |detail: String| EngineError::Upstream {
            model: model.clone(),
            detail,
        };
        let response = match failed {
            Ok(response) => response,
            Err(e) => {
                if e.is_connect() {
                    // Nothing reached it: out of the pool for a while, and
                    // the request may go to another replica.
                    self.mark_down();
                }
                return upstream_error(format!("{}: {e}", self.url));
            }
        };
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let body = serde_json::from_str::<ErrorBody>(&text).ok();
        let param = body.as_ref().and_then(|b| b.error.param.clone());
        let message = body.map_or_else(|| text.chars().take(300).collect(), |b| b.error.message);
        match status {
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                EngineError::UpstreamBusy {
                    model: model.clone(),
                    detail: message,
                }
            }
            StatusCode::NOT_FOUND => EngineError::UnknownModel(model.clone()),
            s if s.is_client_error() => match param {
                Some(param) => EngineError::InvalidParam { param, message },
                None => EngineError::BadRequest(message),
            },
            s => upstream_error(format!("{s}: {message}")),
        }
    }

    pub fn new(config: RemoteModel) -> Result<Self, EngineError> {
        let bad =
            |detail: String| EngineError::Config(format!("upstream {:?}: {detail}", config.model));
        let api_key = match &config.api_key_env {
            None => None,
            Some(var) => Some(
                std::env::var(var)
                    .map_err(|_| bad(format!("api_key_env names {var}, which is not set")))?,
            ),
        };
        let signer = match &config.identity_secret_env {
            None => None,
            Some(var) => {
                let value = std::env::var(var).map_err(|_| {
                    bad(format!("identity_secret_env names {var}, which is not set"))
                })?;
                let secret = Secret::new(value.into_bytes())
                    .map_err(|e| bad(format!("identity_secret_env {var} {e}")))?;
                Some(Signer::new(secret))
            }
        };
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .read_timeout(Duration::from_secs(config.idle_timeout_secs))
            .pool_max_idle_per_host(64)
            // Drop an idle connection before the server does (uvicorn, in
            // front of vLLM, closes after 5 s idle; Meterline's own servers
            // after HTTP_HEADER_READ_TIMEOUT_SECS), so a request never
            // races a server-side close on a reused connection.
            .pool_idle_timeout(Duration::from_secs(4))
            .build()
            .map_err(|e| bad(format!("HTTP client: {e}")))?;
        let base = config.url.trim_end_matches('/');
        let occupancy = Arc::new(Occupancy::default());
        if let Some(tokens) = config.kv_tokens {
            occupancy.set_kv_tokens(tokens);
        }
        if config.kv_poll_ms > 0 && tokio::runtime::Handle::try_current().is_ok() {
            occupancy::spawn_poller(
                client.clone(),
                format!("{base}/metrics"),
                config
                    .upstream_model
                    .clone()
                    .unwrap_or_else(|| config.model.clone()),
                Duration::from_millis(config.kv_poll_ms),
                occupancy.clone(),
                config.kv_tokens.is_some(),
            );
        }
        Ok(Self {
            url: format!("{base}/v1/chat/completions"),
            base: base.to_owned(),
            ledger: Arc::new(Ledger::new(config.gpus)),
            shared: None,
            occupancy,
            down_until_ms: std::sync::atomic::AtomicU64::new(0),
            dedicated: config
                .dedicated_to
                .clone()
                .map(|owner| Arc::new(Dedicated::new(owner))),
            api_key,
            signer,
            client,
            config,
        })
    }

    /// Every replica's GPU time so far, from the `engine` binary's
    /// [`GPU_TIME_PATH`] (a signed read; see [`RemoteModel::replica_reports`]).
    pub async fn gpu_time(&self) -> Result<GpuTimeReadings, EngineError> {
        let c = &self.config;
        let failed = |detail: String| EngineError::Upstream {
            model: c.model.clone(),
            detail: format!("{}{GPU_TIME_PATH}: {detail}", self.base),
        };
        let Some(signer) = &self.signer else {
            return Err(failed(
                "no identity_secret_env to sign the read with".into(),
            ));
        };
        let mut request = self
            .client
            .get(format!("{}{GPU_TIME_PATH}", self.base))
            .timeout(Duration::from_secs(10))
            .header(
                identity::HEADER,
                signer.sign(
                    REPORTER_IDENTITY,
                    ServiceClass::Standard,
                    identity::unix_now(),
                ),
            );
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(failed(format!("{status}: {text}")));
        }
        response
            .json::<GpuTimeReadings>()
            .await
            .map_err(|e| failed(e.to_string()))
    }

    /// The body sent upstream: the client's own request, so every field the
    /// upstream understands (roles, temperature, tools, …) reaches it; the
    /// gateway decides the model name, the output cap, the streaming mode
    /// and `cache_salt`.
    pub fn body(&self, req: &CompletionRequest) -> serde_json::Map<String, Value> {
        let c = &self.config;
        let mut body = match &req.body {
            Some(Value::Object(map)) => map.clone(),
            _ => {
                let mut map = serde_json::Map::new();
                map.insert(
                    "messages".into(),
                    json!([{"role": "user", "content": req.prompt}]),
                );
                map
            }
        };
        body.insert(
            "model".into(),
            json!(c.upstream_model.as_deref().unwrap_or(&c.model)),
        );
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
        body.remove("max_completion_tokens");
        match req.max_tokens {
            Some(n) => body.insert("max_tokens".into(), json!(n)),
            None => body.remove("max_tokens"),
        };
        // Never the client's: it could name another tenant's salt.
        body.remove("cache_salt");
        if c.cache_salt {
            let salt = match &self.signer {
                Some(signer) => signer.cache_salt(&req.tenant_id),
                None => identity::unkeyed_cache_salt(&req.tenant_id),
            };
            body.insert("cache_salt".into(), json!(salt));
        }
        body
    }

    /// Sends the request upstream and returns once its response started.
    pub async fn start(
        &self,
        req: &CompletionRequest,
        stream: bool,
    ) -> Result<HttpGeneration, EngineError> {
        self.start_counted(req, stream, tokenizer::count(&req.prompt))
            .await
    }

    /// [`HttpUpstream::start`] with its prompt's tokens already counted.
    pub(crate) async fn start_counted(
        &self,
        req: &CompletionRequest,
        stream: bool,
        prompt_tokens: u64,
    ) -> Result<HttpGeneration, EngineError> {
        let c = &self.config;
        let threshold = req.class.threshold_percent();
        if !self.occupancy.admits(threshold) {
            let bp = self.occupancy.basis_points().unwrap_or(0);
            return Err(EngineError::UpstreamBusy {
                model: c.model.clone(),
                detail: format!(
                    "KV cache {}.{:02}% full; {} requests are sent below {threshold}%",
                    bp / 100,
                    bp % 100,
                    req.class.as_str()
                ),
            });
        }
        // On a dedicated replica: the owner's request counts as running
        // there from now; another tenant's starts only if it is lent.
        let (owner_running, lent_from) = match &self.dedicated {
            Some(d) if d.owner == req.tenant_id => (Some(Dedicated::hold(vec![d.clone()])), None),
            Some(d) if !d.lends() => {
                return Err(EngineError::UpstreamBusy {
                    model: c.model.clone(),
                    detail: format!("the replica is dedicated to {}, which is using it", d.owner),
                });
            }
            Some(d) => (None, Some(d.clone())),
            None => (None, None),
        };
        let body = self.body(req);
        let mut request = self.client.post(&self.url).json(&Value::Object(body));
        request = match &self.signer {
            Some(signer) => request.header(
                identity::HEADER,
                signer.sign(&req.tenant_id, req.class, identity::unix_now()),
            ),
            None => request
                .header("x-tenant-id", &req.tenant_id)
                .header("x-service-class", req.class.as_str()),
        };
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let started = Instant::now();
        // In flight from the moment it is sent: queueing upstream holds KV too.
        let share = self.ledger.join(prompt_tokens);
        // The shared ledger's join and the request go out together: the
        // request never waits a Redis round trip to start.
        let join = async {
            match &self.shared {
                Some(ledger) => ledger
                    .join(c.replica(), c.gpus, prompt_tokens.max(1))
                    .await
                    .map(|id| SharedShare {
                        ledger: ledger.clone(),
                        replica: c.replica().to_owned(),
                        gpus: c.gpus,
                        id,
                        pending: 0,
                        growing: None,
                    }),
                None => None,
            }
        };
        let (shared, sent) = tokio::join!(join, request.send());
        let response = match sent {
            Ok(response) if response.status().is_success() => response,
            failed => {
                // Not run (refused, or not reached): out of the shared
                // ledger at once, or it would keep a share of the replica's
                // time that nobody is billed for.
                if let Some(shared) = shared {
                    shared.refused().await;
                }
                return Err(self.refusal(failed).await);
            }
        };
        Ok(HttpGeneration {
            events: Some(Box::pin(response.bytes_stream().eventsource())),
            share: Some(share),
            shared,
            gpu_time: c.gpu_time,
            stream,
            started,
            first_token: None,
            prompt_tokens,
            produced: 0,
            text: String::new(),
            finish_reason: None,
            usage: None,
            reported: None,
            model: c.model.clone(),
            owner_running,
            lent_from,
            floor_share: None,
            names: Names {
                version: c.model_version.clone(),
                replica: c.replica_id.clone(),
                default_version: c.version().to_owned(),
                default_replica: c.replica().to_owned(),
            },
        })
    }
}

/// A request running upstream. Dropping it closes the connection.
pub struct HttpGeneration {
    events: Option<Events>,
    share: Option<Share>,
    /// This request's place in the replica's shared ledger, if any.
    shared: Option<SharedShare>,
    gpu_time: GpuTime,
    stream: bool,
    started: Instant,
    first_token: Option<Instant>,
    /// Counted here; replaced by the upstream's count when it reports one.
    prompt_tokens: u64,
    /// Content chunks received (one token each in vLLM's streams).
    produced: u64,
    /// The answer, collected only for a non-streaming client.
    text: String,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    /// Meterline's engine's extension: its own exact GPU figures.
    reported: Option<Meterline>,
    model: String,
    /// The owner's request on its dedicated replica: running there.
    owner_running: Option<OwnerBusy>,
    /// Another tenant's request on a dedicated replica: what it lent.
    lent_from: Option<Arc<Dedicated>>,
    /// Its KV tokens in its pool's floors count, until it ends.
    floor_share: Option<FloorShare>,
    names: Names,
}

/// A request's place in a [`SharedLedger`]: tokens are counted here and
/// sent in batches of [`SHARED_GROW_EVERY`].
struct SharedShare {
    ledger: Arc<dyn SharedLedger>,
    replica: String,
    gpus: u32,
    id: u64,
    pending: u64,
    /// The last growth sent, still on its way: tokens are relayed without
    /// waiting for Redis, and the next growth or the leave waits for it,
    /// so the ledger sees them in order.
    growing: Option<tokio::task::JoinHandle<()>>,
}

impl SharedShare {
    /// Leaves the ledger without a usage event (the upstream refused it).
    async fn refused(mut self) {
        self.settled().await;
        let _ = self.ledger.refused(&self.replica, self.gpus, self.id).await;
    }

    /// Counts `tokens` more in flight; every [`SHARED_GROW_EVERY`] tokens
    /// one call goes to the ledger in the background.
    async fn grow(&mut self, tokens: u64) {
        self.pending += tokens;
        if self.pending >= SHARED_GROW_EVERY {
            self.settled().await;
            let n = std::mem::take(&mut self.pending);
            let (ledger, replica, gpus, id) = (
                self.ledger.clone(),
                self.replica.clone(),
                self.gpus,
                self.id,
            );
            self.growing = Some(tokio::spawn(async move {
                let _ = ledger.grow(&replica, gpus, id, n).await;
            }));
        }
    }

    /// Waits for the growth still on its way, if any.
    async fn settled(&mut self) {
        if let Some(growing) = self.growing.take() {
            let _ = growing.await;
        }
    }
}

/// What usage events call the model version and the replica: the
/// configured names, else what the upstream reports, else defaults.
#[derive(Debug)]
struct Names {
    version: Option<String>,
    replica: Option<String>,
    default_version: String,
    default_replica: String,
}

impl HttpGeneration {
    /// Counts its KV tokens in its pool's floors until it ends.
    pub(crate) fn hold(&mut self, share: FloorShare) {
        self.floor_share = Some(share);
    }

    fn error(&self, detail: impl Into<String>) -> EngineError {
        EngineError::Upstream {
            model: self.model.clone(),
            detail: detail.into(),
        }
    }

    /// The next token (streaming clients only) or the final completion.
    pub async fn next(&mut self) -> Result<Piece, EngineError> {
        loop {
            let Some(events) = self.events.as_mut() else {
                return Err(self.error("the stream already ended"));
            };
            let event = match events.next().await {
                Some(Ok(event)) => event,
                Some(Err(e)) => return Err(self.error(format!("reading the stream: {e}"))),
                None => return Err(self.error("the stream ended before [DONE]")),
            };
            if event.data.trim() == "[DONE]" {
                self.events = None;
                let shared = self.leave_shared().await;
                return Ok(Piece::Done(self.completion(shared)));
            }
            let chunk: Value = serde_json::from_str(&event.data)
                .map_err(|e| self.error(format!("a chunk is not JSON: {e}")))?;
            if let Some(message) = chunk.get("error") {
                let message = message["message"]
                    .as_str()
                    .unwrap_or("unknown error")
                    .to_owned();
                return Err(self.error(message));
            }
            if let Some(reported) = chunk.get("meterline") {
                self.reported = serde_json::from_value(reported.clone()).ok();
            }
            if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
                self.usage = serde_json::from_value(usage.clone()).ok();
            }
            let Some(choice) = chunk["choices"].get(0) else {
                continue;
            };
            if let Some(reason) = choice["finish_reason"].as_str() {
                self.finish_reason = Some(reason.to_owned());
            }
            let Some(content) = choice["delta"]["content"]
                .as_str()
                .filter(|c| !c.is_empty())
            else {
                continue;
            };
            self.produced += 1;
            if let Some(share) = &self.share {
                share.grow(1);
            }
            if let Some(shared) = self.shared.as_mut() {
                shared.grow(1).await;
            }
            self.first_token.get_or_insert_with(Instant::now);
            if self.stream {
                return Ok(Piece::Token(Cow::Owned(content.to_owned())));
            }
            self.text.push_str(content);
        }
    }

    /// Waits for the completion, skipping tokens.
    pub async fn finish(mut self) -> Result<Completion, EngineError> {
        loop {
            if let Piece::Done(c) = self.next().await? {
                return Ok(c);
            }
        }
    }

    /// Closes the connection (the upstream aborts the request) and returns
    /// what it used: the tokens received and its share of the replica's time.
    pub async fn cancel(mut self) -> Completion {
        self.events = None;
        self.reported = None;
        self.usage = None;
        self.finish_reason = None;
        let shared = self.leave_shared().await;
        self.completion(shared)
    }

    /// Leaves the shared ledger, if this request is in one: its share of
    /// the replica's time there (`None`: not in one, or it did not answer).
    async fn leave_shared(&mut self) -> Option<u64> {
        let mut shared = self.shared.take()?;
        shared.settled().await;
        let lent = self.lent_from.is_some();
        shared
            .ledger
            .leave(&shared.replica, shared.gpus, shared.id, lent)
            .await
    }

    /// The replica it runs on, as configured.
    pub fn replica_id(&self) -> &str {
        self.names
            .replica
            .as_deref()
            .unwrap_or(&self.names.default_replica)
    }

    /// The tenant owning the dedicated replica it runs on, if it does.
    pub fn dedicated_to(&self) -> Option<&str> {
        match (&self.lent_from, &self.owner_running) {
            (Some(d), _) => Some(&d.owner),
            (None, Some(running)) => running.owner(),
            (None, None) => None,
        }
    }

    /// The completion; `shared`: the micro-GPU-seconds the shared ledger
    /// gave, which take the place of this gateway's own ledger's.
    fn completion(&mut self, shared: Option<u64>) -> Completion {
        let local = self.share.take().map_or(0, Share::finish);
        if let Some(d) = &self.lent_from {
            d.lent(shared.unwrap_or(local));
        }
        let derived = to_gpu_seconds(shared.unwrap_or(local));
        let now = Instant::now();
        let (gpu_seconds, preempted, preemptions, dedicated_to) =
            match (&self.reported, self.gpu_time) {
                (Some(r), GpuTime::Auto) => (
                    r.gpu_seconds,
                    r.preempted_gpu_seconds,
                    r.preemptions,
                    r.dedicated_to.clone(),
                ),
                _ => (
                    derived,
                    Decimal::ZERO,
                    0,
                    self.dedicated_to().map(str::to_owned),
                ),
            };
        let reported = self.reported.take();
        let usage = self.usage.take();
        let n = &self.names;
        Completion {
            model_version: n
                .version
                .clone()
                .or_else(|| reported.as_ref().and_then(|r| r.model_version.clone()))
                .unwrap_or_else(|| n.default_version.clone()),
            replica_id: n
                .replica
                .clone()
                .or_else(|| reported.and_then(|r| r.replica_id))
                .unwrap_or_else(|| n.default_replica.clone()),
            text: std::mem::take(&mut self.text),
            prompt_tokens: usage
                .as_ref()
                .map_or(self.prompt_tokens, |u| u.prompt_tokens),
            cached_tokens: usage.as_ref().map_or(0, Usage::cached_tokens),
            completion_tokens: usage
                .as_ref()
                .map_or(self.produced, |u| u.completion_tokens),
            length_capped: self.finish_reason.as_deref() == Some("length"),
            ttft: self.first_token.unwrap_or(now) - self.started,
            total: now - self.started,
            gpu_seconds,
            preempted_gpu_seconds: preempted,
            preemptions,
            dedicated_to,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;
    use engine::scheduler::ServiceClass;

    /// Past a class's threshold the request is refused before anything is
    /// sent (the URL points nowhere, so a request that went out would be a
    /// 502-style `Upstream` error instead).
    #[tokio::test]
    async fn a_replica_past_the_class_threshold_is_busy_for_that_class_only() {
        let config: RemoteModel = serde_norway::from_str(
            "model: m\nurl: http://127.0.0.1:9\ngpus: 1\nmax_context: 4096\nkv_poll_ms: 0\n",
        )
        .unwrap();
        let upstream = HttpUpstream::new(config).unwrap();
        upstream.occupancy.set(7_000);
        let req = |class| CompletionRequest {
            model: "m".into(),
            prompt: "hi".into(),
            class,
            ..CompletionRequest::default()
        };
        let best_effort = upstream.start(&req(ServiceClass::BestEffort), false).await;
        assert!(matches!(best_effort, Err(EngineError::UpstreamBusy { .. })));
        let standard = upstream.start(&req(ServiceClass::Standard), false).await;
        assert!(matches!(standard, Err(EngineError::Upstream { .. })));
        assert_eq!(upstream.ledger.in_flight(), 0, "nothing left in the ledger");
    }

    fn upstream(extra: &str) -> HttpUpstream {
        let config: RemoteModel = serde_norway::from_str(&format!(
            "model: m\nurl: http://127.0.0.1:9\ngpus: 1\nmax_context: 4096\nkv_poll_ms: 0\n{extra}"
        ))
        .unwrap();
        HttpUpstream::new(config).unwrap()
    }

    fn salted(tenant: &str, client_salt: &str) -> CompletionRequest {
        CompletionRequest {
            model: "m".into(),
            prompt: "hi".into(),
            tenant_id: tenant.into(),
            body: Some(json!({
                "messages": [{"role": "user", "content": "hi"}],
                "cache_salt": client_salt,
            })),
            ..CompletionRequest::default()
        }
    }

    #[test]
    fn cache_salt_on_is_the_tenants_own_whatever_the_client_sent() {
        let upstream = upstream("cache_salt: true\n");
        let acme = upstream.body(&salted("acme", "globex-salt"));
        let globex = upstream.body(&salted("globex", "anything"));
        assert_eq!(acme["cache_salt"], identity::unkeyed_cache_salt("acme"));
        assert_eq!(globex["cache_salt"], identity::unkeyed_cache_salt("globex"));
        assert_ne!(acme["cache_salt"], globex["cache_salt"]);
        // Without a salt from the client, the tenant's is set all the same.
        let mut plain = salted("acme", "");
        plain.body = None;
        assert_eq!(upstream.body(&plain)["cache_salt"], acme["cache_salt"]);
    }

    #[test]
    fn cache_salt_is_keyed_by_the_identity_secret_when_there_is_one() {
        let var = "METERLINE_TEST_SALT_SECRET";
        // Only this test reads or writes this variable.
        std::env::set_var(var, "k".repeat(identity::MIN_SECRET_BYTES));
        let upstream = upstream(&format!("cache_salt: true\nidentity_secret_env: {var}\n"));
        let salt = Signer::new(Secret::new("k".repeat(identity::MIN_SECRET_BYTES)).unwrap())
            .cache_salt("acme");
        assert_eq!(upstream.body(&salted("acme", "x"))["cache_salt"], salt);
        assert_ne!(salt, identity::unkeyed_cache_salt("acme"));
    }

    #[test]
    fn cache_salt_off_removes_the_clients() {
        let body = upstream("").body(&salted("acme", "globex-salt"));
        assert!(!body.contains_key("cache_salt"), "{body:?}");
        assert_eq!(body["model"], "m");
        assert_eq!(body["stream"], true);
    }

    #[test]
    fn an_identity_secret_unset_or_short_is_a_config_error_naming_the_variable() {
        let config = |var: &str| -> RemoteModel {
            serde_norway::from_str(&format!(
                "model: m\nurl: http://127.0.0.1:9\ngpus: 1\nmax_context: 4096\nkv_poll_ms: 0\nidentity_secret_env: {var}\n"
            ))
            .unwrap()
        };
        let unset = HttpUpstream::new(config("METERLINE_TEST_UNSET_SECRET")).unwrap_err();
        assert!(
            matches!(&unset, EngineError::Config(m) if m.contains("\"m\"") && m.contains("METERLINE_TEST_UNSET_SECRET")),
            "{unset}"
        );
        std::env::set_var("METERLINE_TEST_SHORT_SECRET", "short");
        let short = HttpUpstream::new(config("METERLINE_TEST_SHORT_SECRET")).unwrap_err();
        assert!(
            matches!(&short, EngineError::Config(m) if m.contains("METERLINE_TEST_SHORT_SECRET") && m.contains("at least 32")),
            "{short}"
        );
    }
}
