//! gateway-lite: Meterline's OpenAI-compatible edge.
//!
//! Every admitted request becomes exactly one usage event, written durably
//! to a local outbox before the client is answered, and relayed to Kafka by
//! a background task that deletes only what the broker acknowledged.
//! Postgres is read at start-up and by the key refresher, never on the
//! request path. Prompts and completions pass through memory only.
//!
//! Layout:
//! - [`chat`]: the `/v1` handlers
//! - [`tenants`]: key hashes → callers, refreshed in the background
//! - [`seed`]: tenants, keys and limits from a YAML file
//! - [`outbox`]: the durable local queue (redb, group commit)
//! - [`relay`]: outbox → Kafka with the idempotent producer
//! - [`service`], [`config`], [`error`], [`telemetry`]: the process around it

pub mod chat;
pub mod config;
pub mod error;
pub mod outbox;
pub mod relay;
pub mod seed;
pub mod service;
pub mod telemetry;
pub mod tenants;

pub use config::GatewayConfig;
pub use error::GatewayError;
