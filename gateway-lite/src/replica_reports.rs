//! Replica reports: the busy, idle and lent GPU time of the replicas behind
//! this gateway, written to the outbox as
//! [`ReplicaReport`](usage_contract::ReplicaReport)s and published beside
//! the usage events.
//!
//! Idle time is nobody's request, and a dedicated replica's hours are its
//! owner's whether used or not, so neither can come from usage events.
//! Each replica is reported once, never once per gateway in front of it:
//!
//! - a **simulated pool** lives inside its gateway, so each gateway reports
//!   its own replicas (this module's [`Reporter`]);
//! - an **HTTP upstream** is reported by one gateway at a time, elected in
//!   the shared Redis ([`remote`]). An `engine` binary (`replica_reports:
//!   true`) serves its replicas' GPU time so far; any other (vLLM serves
//!   no GPU time) is read from the gateways' shared GPU ledger
//!   ([`admission::gpu_ledger`]): the replica's busy time over every gateway
//!   in front of it, idle being the rest of wall time × GPUs.
//!
//! Every [`GATEWAY_REPLICA_REPORT_SECS`](crate::config::GatewayConfig) and
//! at each UTC hour boundary the reporter reads every replica's GPU time so
//! far and appends one report per replica and UTC hour with what changed
//! since the last report: busy (attributed to requests) and idle
//! GPU-seconds, and on a dedicated replica the part of busy that ran other
//! tenants' work (lent), in the engine's time, exact to the microsecond.
//! An interval that crosses an hour (a late tick, a takeover) is split at
//! the boundary in proportion to wall time ([`interval_reports`]), so the
//! hours can be off by the length of a tick, never the sum. The outbox
//! makes each report durable before it is published and the report id
//! makes a re-send harmless. A graceful stop reports the last interval; a
//! gateway killed outright loses at most one interval of the replicas it
//! reported (`gateway_replica_report_seconds` bounds it).
//!
//! - [`remote`]: the HTTP upstreams, reported by the elected gateway
//! - `reporter`: [`Reporter`], this gateway's reporting loop
//! - `interval`: [`Reading`]s to hourly reports ([`interval_reports`])

mod interval;
pub mod remote;
mod reporter;

pub use interval::{interval_reports, Reading};
pub use reporter::Reporter;
