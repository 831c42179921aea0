//! fleet: the layer between the gateway's limits and the engines that
//! decides *where and when* a request runs. It never prices anything.
//!
//! Built so far:
//! - [`queue`]: per model pool, strict priority levels and, within a
//!   level, weighted fair queuing by tenant weight on virtual time, with a
//!   bounded depth per level;
//! - [`pool`]: the replicas of a model and power-of-two-choices routing on
//!   KV headroom (the router's own in-flight accounting on top of the last
//!   report), class thresholds, dedicated replicas and lending;
//! - [`slo`]: a tenant's typed objectives and the sliding 60 s window of
//!   its TTFT and end-to-end latency (percentiles, compliance ratios).
//!
//! Not yet: the queue and the pool on the gateway's request path (the
//! simulator still runs one replica per model), reserved floors,
//! preemption, capacity borrowing and the degradation
//! ladder (issue #16); the gateway reports the SLO windows but does not
//! use the queue on its request path yet.

pub mod pool;
pub mod queue;
pub mod slo;

pub use queue::{Enqueued, Full, Queue, QueueConfig, Ticket};
