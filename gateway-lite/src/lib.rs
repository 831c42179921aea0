//! gateway-lite: Meterline's OpenAI-compatible edge.
//!
//! Every admitted request becomes exactly one usage event, written durably
//! to a local outbox before the client is answered, and relayed to Kafka by
//! a background task that deletes only what the broker acknowledged.
//! Postgres is read at start-up and by the key refresher, never on the
//! request path. Prompts and completions pass through memory only.
//!
//! Invariants:
//! - An admitted request (past the limits and the engine's admission)
//!   produces exactly one usage event, whether it completes, is cut by
//!   `max_tokens`, fails, or its client disconnects mid-stream; a rejected
//!   one (4xx, 429, 503) produces none.
//! - The event is durable in the outbox before the client gets the answer
//!   (for a stream: before the last chunk and `data: [DONE]`).
//! - Tokens charged against a per-minute limit at admission are reconciled
//!   with the actual count when the request ends.
//!
//! Layout:
//! - [`chat`]: the `/v1` handlers (validation, idempotency, admission)
//! - [`metering`]: an admitted request until its one usage event (streaming too)
//! - [`admission_queue`]: requests wait for a simulated model's capacity in
//!   its fair queue (`GATEWAY_QUEUE=on`)
//! - [`ladder`]: each priority's share of its rate under saturation and SLO
//!   pressure (`GATEWAY_QUEUE=on`)
//! - [`preemption`]: a waiting priority-5 request preempts the lowest
//!   non-streaming request in flight, which re-queues (delay, not failure)
//! - [`limits`]: requests/min and tokens/min per key and model, requests/s,
//!   concurrency and KV·seconds per tenant — shared by every gateway
//! - [`cluster`]: the Redis the gateways share, their liveness, the limits' mode
//! - [`retry_budget`]: retries shed first when they exceed 20% of the minute
//! - [`gpu_ledger`]: one GPU-time ledger per HTTP replica for every gateway
//! - [`tpot`]: recent time per output token, for the KV·seconds estimate
//! - [`idempotency`]: `Idempotency-Key` replays and conflicts, across gateways
//! - [`tenants`]: key hashes → callers and their limits, refreshed in the background
//! - [`floors`]: the tenants' reserved floors on its model pools (simulated and HTTP)
//! - [`outbox`]: the durable local queue (redb, group commit)
//! - [`relay`]: outbox → Kafka with the idempotent producer
//! - [`replica_reports`]: the busy and idle GPU time of this gateway's
//!   simulated replicas, and of an `engine` binary's when this gateway is
//!   its elected reporter, reported once per replica through the outbox
//! - [`state`]: what every handler shares
//! - [`service`], [`config`], [`error`], [`telemetry`]: the process around it

pub mod admission_queue;
pub mod chat;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod error;
pub mod floors;
pub mod gpu_ledger;
pub mod idempotency;
pub mod ladder;
pub mod limits;
pub mod metering;
pub mod outbox;
pub mod preemption;
pub mod readiness;
pub mod relay;
pub mod replica_reports;
pub mod retry_budget;
pub mod service;
pub mod state;
pub mod telemetry;
pub mod tenants;
pub mod tpot;

pub use config::GatewayConfig;
pub use error::GatewayError;
