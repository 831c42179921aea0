//! The gateway's configuration, from flags or environment variables.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use crate::error::GatewayError;

#[derive(Debug, Clone, Args)]
pub struct GatewayConfig {
    /// Where the OpenAI-compatible API listens.
    #[arg(long, env = "GATEWAY_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Postgres URL (tenants and keys; never touched on the request path).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/meterline"
    )]
    pub database_url: String,
    /// Kafka bootstrap servers for the relay.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// The usage topic the relay publishes events to (ingest reads it as
    /// `INGEST_TOPIC`).
    #[arg(long, env = "GATEWAY_TOPIC", default_value = usage_contract::TOPIC)]
    pub topic: String,
    /// The durable outbox directory, created if missing: segment files
    /// `*.log` and `answers.redb`. One gateway per directory; a file in
    /// its place (the single-file outbox of a gateway before 2026-12) is
    /// refused: drain it with that version first.
    #[arg(long, env = "GATEWAY_OUTBOX", default_value = ".stack/gateway-outbox")]
    pub outbox: PathBuf,
    /// This gateway's id, stamped on every usage event.
    #[arg(long, env = "GATEWAY_ID", default_value = "gw-1")]
    pub gateway_id: String,
    /// The gateway only reads tenants, keys and limits; billing-api
    /// administers them: seed them with `BILLING_TENANTS_FILE` or `billing-api tenants apply FILE`.
    #[arg(long, env = "GATEWAY_TENANTS_FILE", hide = true, help_heading = serving::retired::HEADING)]
    pub tenants_file: Option<PathBuf>,
    /// Models served by OpenAI-compatible servers such as vLLM (YAML; see
    /// `admission::upstream`). Models not listed run on the built-in simulator.
    #[arg(long, env = "GATEWAY_UPSTREAMS")]
    pub upstreams_file: Option<PathBuf>,
    /// How often keys are reloaded from Postgres, in milliseconds: how soon
    /// a revoked key stops working.
    #[arg(long, env = "GATEWAY_KEY_REFRESH_MS", default_value_t = 2000)]
    pub key_refresh_ms: u64,
    /// Requests per second all gateways together admit, the bucket above
    /// every tenant's (0: no global limit).
    #[arg(long, env = "GATEWAY_GLOBAL_RPS", default_value_t = 400)]
    pub global_rps: u32,
    /// Burst above the global rate, for all gateways together.
    #[arg(long, env = "GATEWAY_GLOBAL_BURST", default_value_t = 60)]
    pub global_burst: u32,
    /// Longest a request may run, in seconds of wall time: after it the
    /// request is stopped at the engine, billed as `error` for what it used,
    /// and answered 504 (mid-stream: an error chunk, then `[DONE]`).
    #[arg(long, env = "GATEWAY_REQUEST_TIMEOUT_SECS", default_value_t = 600)]
    pub request_timeout_secs: u64,
    /// YAML or JSON file of the simulated models' profiles (`profiles:
    /// [...]`, the engine's format, each with its `replicas`); the
    /// reference profiles, one replica each, if unset.
    #[arg(long, env = "ENGINE_PROFILES")]
    pub engine_profiles: Option<PathBuf>,
    /// Replicas per simulated model over the profiles' own, e.g.
    /// `llama-3.1-70b=12,llama-3.1-8b=2`: each model is a pool, a request
    /// goes to one of two replicas drawn at random, the one with more KV
    /// headroom.
    #[arg(long, env = "ENGINE_REPLICAS")]
    pub engine_replicas: Option<String>,
    /// Replicas dedicated to tenants, e.g. `llama-3.1-70b:acme-corp=4`: the
    /// owner's requests go there first, and no other tenant's request
    /// starts there while the owner has work on them (they are lent while
    /// it has none).
    #[arg(long, env = "ENGINE_DEDICATED")]
    pub engine_dedicated: Option<String>,
    /// Simulated engine speed: 1 = real time, N = N times faster, 0 = no waiting.
    #[arg(long, env = "ENGINE_SPEEDUP", default_value_t = 1)]
    pub engine_speedup: u32,
    /// On SIGTERM, how long `/readyz` answers 503 while the gateway still
    /// accepts requests, before it stops accepting: set it to the time
    /// your load balancer takes to notice (health-check interval ×
    /// failures). Then it stops accepting, lets admitted requests finish
    /// and drains its outbox; `/healthz` stays 200 until it exits. 0 stops
    /// accepting at once.
    #[arg(long, env = "GATEWAY_DRAIN_DELAY_MS", default_value_t = 0)]
    pub drain_delay_ms: u64,
    /// The Redis every gateway shares for limits, in-flight leases,
    /// idempotency claims and the GPU-time ledger of HTTP replicas (nothing
    /// in it needs to survive a restart).
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// Prefix of every key this gateway writes in Redis: gateways with the
    /// same prefix act as one (limits, idempotency claims, ledgers).
    #[arg(long, env = "GATEWAY_REDIS_PREFIX", default_value = "meterline:")]
    pub redis_prefix: String,
    /// `shared`: limits shared by every gateway through Redis (each falls
    /// back to its share while Redis is unreachable); `local`: this
    /// gateway alone, in memory, Redis never used.
    #[arg(
        long,
        env = "GATEWAY_LIMITS",
        value_name = "GATEWAY_LIMITS",
        default_value = "shared"
    )]
    pub limits: LimitsMode,
    /// While Redis is unreachable, concurrency and KV·seconds caps are
    /// divided among at least this many gateways (1 to 1000; set it to the
    /// number you run): each enforces cap ÷ max(this, the most gateways it
    /// has seen alive), so together they never pass a cap. The most seen
    /// is kept in `peers-seen` in `GATEWAY_OUTBOX`, so a gateway restarted
    /// during an outage divides as before. Rates fail open to 1/(gateways
    /// last seen) instead.
    #[arg(long, env = "GATEWAY_EXPECTED_PEERS", default_value_t = 3)]
    pub expected_peers: u32,
    /// How long idempotency claims and answers stay in Redis, seconds (60
    /// to 86400): a retry on another gateway gets the stored answer within
    /// this; after it, it runs again under the same request id (billed
    /// once). Redis holds every idempotent answer this long, about
    /// idempotent requests/s × this × answer size; the outbox keeps answers
    /// 24 h whatever this is.
    #[arg(
        long,
        env = "GATEWAY_IDEMPOTENCY_SHARED_TTL_SECS",
        default_value_t = 86_400
    )]
    pub idempotency_shared_ttl_secs: u64,
    /// `on` (the fairness layer): a request a model (simulated or HTTP)
    /// cannot admit for its class, or that finds others waiting at its
    /// priority or above, waits in that model's fair queue (strict
    /// priority, then the GPU time really used shared by `wfq_weight`) up
    /// to its tenant's wait budget, then 429
    /// `queue_timeout`; with it the degradation ladder, capacity borrowing
    /// and preemption. `off`: admission by class only, 503 `no_capacity`
    /// at once.
    #[arg(
        long,
        env = "GATEWAY_QUEUE",
        value_name = "GATEWAY_QUEUE",
        default_value = "on"
    )]
    pub queue: Switch,
    /// Requests each priority level of a model's queue holds (1 to
    /// 100000); beyond it 429 `queue_full`.
    #[arg(long, env = "GATEWAY_QUEUE_DEPTH", default_value_t = 1_000)]
    pub queue_depth: usize,
    /// How often each simulated replica's busy and idle GPU time is
    /// reported for billing (1 to 3600 s; also at every UTC hour boundary
    /// and at shutdown). A gateway killed outright loses at most this much
    /// of its replicas' idle time.
    #[arg(long, env = "GATEWAY_REPLICA_REPORT_SECS", default_value_t = 60)]
    pub replica_report_secs: u64,
    /// The most of each model pool the tenants' reserved floors
    /// may hold together, as a share (`"0.50"`). Floors that add up to more
    /// are scaled down to it in proportion (logged and on `/metrics`); four
    /// decimals at most.
    #[arg(long, env = "GATEWAY_FLOOR_LIMIT", default_value = "0.50")]
    pub floor_limit: String,
    /// Slow-client bounds and the shutdown grace of the listener.
    #[command(flatten)]
    pub http: serving::HttpSettings,
}

/// An on/off setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    On,
    Off,
}

/// `GATEWAY_LIMITS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LimitsMode {
    Shared,
    Local,
}

impl GatewayConfig {
    /// [`drain_delay_ms`](Self::drain_delay_ms) as a duration.
    pub fn drain_delay(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.drain_delay_ms)
    }

    pub fn request_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.request_timeout_secs)
    }

    /// The gateway-wide request rate, if any.
    pub fn global_rate(&self) -> Option<admission::limits::RequestRate> {
        (self.global_rps > 0).then_some(admission::limits::RequestRate {
            per_second: self.global_rps,
            burst: self.global_burst,
        })
    }

    /// The simulated models: `ENGINE_PROFILES` (or the reference ones)
    /// with `ENGINE_REPLICAS` applied, validated.
    pub fn profiles(&self) -> Result<Vec<engine::ModelProfile>, GatewayError> {
        let mut profiles = match &self.engine_profiles {
            Some(path) => engine::ModelProfile::load(path)
                .map_err(|e| GatewayError::Config(format!("ENGINE_PROFILES {e}")))?,
            None => engine::ModelProfile::reference(),
        };
        if let Some(spec) = &self.engine_replicas {
            engine::ModelProfile::set_replicas(&mut profiles, spec)
                .map_err(|e| GatewayError::Config(format!("ENGINE_REPLICAS {e}")))?;
        }
        if let Some(spec) = &self.engine_dedicated {
            engine::ModelProfile::set_dedicated(&mut profiles, spec)
                .map_err(|e| GatewayError::Config(format!("ENGINE_DEDICATED {e}")))?;
        }
        Ok(profiles)
    }

    /// `GATEWAY_FLOOR_LIMIT` in basis points.
    pub fn floor_limit_bp(&self) -> Result<u32, GatewayError> {
        fleet::pool::share_bp(&self.floor_limit)
            .map_err(|e| GatewayError::Config(format!("GATEWAY_FLOOR_LIMIT {e}")))
    }

    /// How this gateway's capacity limits fail closed without Redis.
    pub fn fail_closed(&self) -> admission::cluster::FailClosed {
        admission::cluster::FailClosed {
            expected_peers: self.expected_peers,
            seen_file: Some(self.outbox.join("peers-seen")),
        }
    }

    pub fn validate(&self) -> Result<(), GatewayError> {
        self.profiles()?;
        if self.gateway_id.trim().is_empty() || self.gateway_id.len() > 200 {
            return Err(GatewayError::Config(
                "GATEWAY_ID must be 1 to 200 characters".into(),
            ));
        }
        if !(100..=600_000).contains(&self.key_refresh_ms) {
            return Err(GatewayError::Config(format!(
                "GATEWAY_KEY_REFRESH_MS must be between 100 and 600000, got {}",
                self.key_refresh_ms
            )));
        }
        if self.global_rps > 0 && self.global_burst == 0 {
            return Err(GatewayError::Config(
                "GATEWAY_GLOBAL_BURST must be at least 1 when GATEWAY_GLOBAL_RPS is set".into(),
            ));
        }
        if !(1..=86_400).contains(&self.request_timeout_secs) {
            return Err(GatewayError::Config(format!(
                "GATEWAY_REQUEST_TIMEOUT_SECS must be between 1 and 86400, got {}",
                self.request_timeout_secs
            )));
        }
        if self.drain_delay_ms > 600_000 {
            return Err(GatewayError::Config(format!(
                "GATEWAY_DRAIN_DELAY_MS must be at most 600000 (10 minutes), got {}",
                self.drain_delay_ms
            )));
        }
        if self.limits == LimitsMode::Shared {
            if !self.redis_url.starts_with("redis://") && !self.redis_url.starts_with("rediss://") {
                return Err(GatewayError::Config(format!(
                    "REDIS_URL must be a redis://host:port URL, got {:?}",
                    self.redis_url
                )));
            }
            if self.redis_prefix.len() > 100 || self.redis_prefix.contains(char::is_whitespace) {
                return Err(GatewayError::Config(format!(
                    "GATEWAY_REDIS_PREFIX must be at most 100 characters without spaces, got {:?}",
                    self.redis_prefix
                )));
            }
        }
        if !(1..=1_000).contains(&self.expected_peers) {
            return Err(GatewayError::Config(format!(
                "GATEWAY_EXPECTED_PEERS must be between 1 and 1000, got {}",
                self.expected_peers
            )));
        }
        if !(1..=100_000).contains(&self.queue_depth) {
            return Err(GatewayError::Config(format!(
                "GATEWAY_QUEUE_DEPTH must be between 1 and 100000, got {}",
                self.queue_depth
            )));
        }
        if !(1..=3_600).contains(&self.replica_report_secs) {
            return Err(GatewayError::Config(format!(
                "GATEWAY_REPLICA_REPORT_SECS must be between 1 and 3600, got {}",
                self.replica_report_secs
            )));
        }
        self.floor_limit_bp()?;
        if !(60..=86_400).contains(&self.idempotency_shared_ttl_secs) {
            return Err(GatewayError::Config(format!(
                "GATEWAY_IDEMPOTENCY_SHARED_TTL_SECS must be between 60 and 86400, got {}",
                self.idempotency_shared_ttl_secs
            )));
        }
        if self.kafka_brokers.trim().is_empty() {
            return Err(GatewayError::Config("KAFKA_BROKERS is empty".into()));
        }
        schema::parse_url(&self.database_url)?;
        if self.outbox.is_file() {
            return Err(GatewayError::Config(format!(
                "GATEWAY_OUTBOX {} is a file, but the outbox is a directory (a file there \
                 is the outbox of a gateway before 2026-12: start that version with Kafka \
                 up so it drains, or choose another path)",
                self.outbox.display()
            )));
        }
        std::fs::create_dir_all(&self.outbox).map_err(|e| {
            GatewayError::Config(format!("GATEWAY_OUTBOX {}: {e}", self.outbox.display()))
        })?;
        Ok(())
    }
}
