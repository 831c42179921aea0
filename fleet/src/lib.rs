//! fleet: the layer between the gateway's limits and the engines that
//! decides *where and when* a request runs. It never prices anything.
//!
//! - [`queue`]: per model pool, strict priority levels and, within a
//!   level, weighted fair queuing by tenant weight on virtual time, with a
//!   bounded depth per level;
//! - [`pool`]: the replicas of a model and power-of-two-choices routing on
//!   KV headroom (the router's own in-flight accounting on top of the last
//!   report), class thresholds, dedicated replicas and lending;
//! - [`floors`]: reserved floors, a share of a pool's KV kept free for a
//!   tenant until it uses it (the same arithmetic for simulated pools and
//!   pools of HTTP replicas);
//! - [`preempt`]: whom a priority-5 request may preempt (lower priority,
//!   not streamed, off a replica's 5 s cooldown, chains of depth 2 at most);
//! - [`ladder`]: each priority's share of its rate under saturation (the
//!   degradation ladder) and SLO pressure (capacity borrowing);
//! - [`slo`]: a tenant's typed objectives and the sliding 60 s window of
//!   its TTFT and end-to-end latency (percentiles, compliance ratios).
//!
//! This crate is policy only. The gateway applies the queue, the ladder,
//! the SLO windows and preemption plans; the engine crate applies the
//! pool's routing and the floors (its simulator routes each model's pool
//! of replicas with [`pool`]; its HTTP upstreams route with their own
//! scoring and hold the floors with [`floors`]).

pub mod floors;
pub mod ladder;
pub mod pool;
pub mod preempt;
pub mod queue;
pub mod slo;

pub use queue::{Full, Queue, QueueConfig, Ticket};
