//! The usage-event contract shared by every Meterline service.
//!
//! One [`UsageEvent`] is produced per admitted request by `gateway-lite`,
//! carried on topic [`TOPIC`] keyed by `tenant_id`, and stored by `ingest`.
//! Anything that breaks the contract is rejected with a [`Violation`] whose
//! [`Violation::code`] is stable (it is what the dead-letter table stores).
//!
//! Layout:
//! - [`request_id`]: `req_` + UUIDv7 ids, time-ordered, and the day they fall in
//! - [`event`]: the event (v2, and v1 still read), its serde form and its content hash
//! - [`validate`]: the rules an event must keep, each named
//! - [`replica_report`]: a replica's busy and idle GPU time over an interval,
//!   the topic's second record kind (idle and dedicated capacity for billing)
//! - [`decode`]: bytes → validated record, or the violation that says why not
//! - [`hourly`]: an hour's usage totals and the hour a request is counted in
//! - [`stored`]: a `request_log` row, and the one conversion from it back to
//!   the event it was stored from (with feature `sqlx`, read by name)
//!
//! Invariants: counts are integers, GPU time is an exact decimal with at most
//! microsecond precision, timestamps are UTC. No floating point anywhere.

pub mod decode;
pub mod event;
pub mod hourly;
pub mod replica_report;
pub mod request_id;
pub mod stored;
pub mod validate;

pub use decode::{decode, decode_record, Record};
pub use event::{
    FinishReason, Placement, UsageEvent, GPU_SECONDS_SCALE, SCHEMA_V1, SCHEMA_VERSION,
};
pub use replica_report::ReplicaReport;
pub use request_id::RequestId;
pub use stored::{StoredRequest, StoredRequestError};
pub use validate::Violation;

/// The default topic carrying contract v1 (every service reads its topic
/// from its settings: `GATEWAY_TOPIC`, `INGEST_TOPIC`; the archiver follows
/// Postgres, not the topic).
pub const TOPIC: &str = "usage.events.v1";
