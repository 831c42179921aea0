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
//! Whether, where and when a request runs — limits, the fair queue, the
//! ladder, preemption, floors, the HTTP upstreams — is the `admission`
//! crate's; the gateway asks it and meters what runs.
//!
//! Layout:
//! - [`chat`]: the `/v1` handlers (validation, idempotency, admission)
//! - [`metering`]: an admitted request until its one usage event (streaming too)
//! - [`idempotency`]: `Idempotency-Key` replays and conflicts, across gateways
//! - [`tenants`]: key hashes → callers and their limits, refreshed in the background
//! - [`outbox`]: the durable local queue (redb, group commit)
//! - [`relay`]: outbox → Kafka with the idempotent producer
//! - [`replica_reports`]: the busy and idle GPU time of this gateway's
//!   simulated replicas, and of an `engine` binary's when this gateway is
//!   its elected reporter, reported once per replica through the outbox
//! - [`state`]: what every handler shares
//! - [`service`], [`config`], [`error`], [`telemetry`]: the process around it

pub mod chat;
pub mod cli;
pub mod config;
pub mod error;
pub mod idempotency;
pub mod metering;
pub mod outbox;
pub mod readiness;
pub mod relay;
pub mod replica_reports;
pub mod service;
pub mod state;
pub mod telemetry;
pub mod tenants;

pub use config::GatewayConfig;
pub use error::GatewayError;
