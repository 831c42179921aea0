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
//! - [`preempt`]: whom a priority-5 request may preempt (lower priority,
//!   not streamed, off a replica's 5 s cooldown, chains of depth 2 at most);
//! - [`ladder`]: each priority's share of its rate under saturation (the
//!   degradation ladder) and SLO pressure (capacity borrowing);
//! - [`slo`]: a tenant's typed objectives and the sliding 60 s window of
//!   its TTFT and end-to-end latency (percentiles, compliance ratios).
//!
//! On the request path so far: the queue (`GATEWAY_QUEUE=on`), the ladder
//! and the SLO windows in the gateway, and the pool's routing in the
//! engine's simulator (each model a pool of replicas). Not yet: dedicated
//! replicas and reserved floors on the request path, and acting on
//! preemption plans (issue #16).

pub mod ladder;
pub mod pool;
pub mod preempt;
pub mod queue;
pub mod slo;

pub use queue::{Enqueued, Full, Queue, QueueConfig, Ticket};
