//! Admission: may this request run, where, and when. The gateway asks; this
//! crate decides, with `fleet`'s pure policies below it and the engines
//! (the simulator in process, or OpenAI-compatible servers over HTTP)
//! beside it. A newcomer asking "why did this request get 429, 503 or
//! `queue_timeout`" reads here.
//!
//! The gateway asks through one call, [`place::place`]: a request comes back
//! running ([`place::Placed`]) or refused with its reason
//! ([`place::Refused`]), from which the gateway's one error mapping derives
//! the OpenAI error, its status and `Retry-After`.
//!
//! Layout:
//! - [`place`]: the one face — limits, engine, fair queue, preemption, in order
//! - [`caller`]: the caller as admission sees it (tenant, key, priority,
//!   weight, caps, rates, objectives, per-model limits)
//! - [`limits`]: requests/min and tokens/min per key and model, requests/s,
//!   concurrency and KV·seconds per tenant, a global bucket — leased from
//!   Redis and spent locally, shared by every gateway ([`limits::shared`]),
//!   token buckets in [`limits::bucket`]
//! - [`cluster`]: the Redis the gateways share, their liveness, the limits' mode
//! - [`admission_queue`]: requests wait for a model's capacity in its fair
//!   queue (`fleet::queue`: strict priority, then GPU time shared by tenant weight)
//! - [`ladder`]: each priority's share of its rate under saturation and SLO
//!   pressure, and capacity borrowing (`fleet::ladder`)
//! - [`preemption`]: a waiting priority-5 request preempts the lowest
//!   non-streaming request in flight, which re-queues (delay, not failure)
//! - [`floors`]: the tenants' reserved floors on the model pools, simulated
//!   and HTTP, scaled to `GATEWAY_FLOOR_LIMIT` (`fleet::floors`)
//! - [`occupancy`]: an HTTP replica's KV reading (polled from its
//!   `/metrics`), for admission by class and the floors
//! - [`retry_budget`]: retries shed first when they exceed 20% of the minute
//! - [`tpot`]: recent time per output token, for the KV·seconds estimate
//! - [`gpu_ledger`]: one GPU-time ledger per HTTP replica for every gateway
//! - [`upstream`]: which engine serves a model — the simulator in process or
//!   an OpenAI-compatible server such as vLLM over HTTP ([`upstream::http`]),
//!   routed by `fleet::pool`, with GPU time derived from wall time when the
//!   server reports none
//! - [`telemetry`]: the metrics it records
//!
//! Invariants:
//! - A request is charged against every limit it needs at once, or against
//!   none (one Lua call per lease; a refused request takes nothing).
//! - A request's in-flight permits (concurrency, KV·seconds) are released
//!   when it ends, however it ends.
//! - Within a priority level, a contended pool is shared by tenant weight.
//! - A reserved floor's unused part is never handed to another tenant's
//!   new work, and the floors together never exceed the pool's limit.

pub mod admission_queue;
pub mod caller;
pub mod cluster;
pub mod floors;
pub mod gpu_ledger;
pub mod ladder;
pub mod limits;
pub mod occupancy;
pub mod place;
pub mod preemption;
pub mod retry_budget;
pub mod telemetry;
pub mod tpot;
pub mod upstream;

pub use caller::{Caller, ModelLimits, RequestRate};
pub use place::{place, Admission, Placed, Refused};
