//! The GPU engine, simulated.
//!
//! No GPU is available where Meterline is developed, so the engine is a
//! simulator with a physical cost model that behaves like vLLM from the
//! outside: continuous batching over paged KV blocks, chunked prefill,
//! preemption with recompute, a per-tenant prefix cache, admission by KV
//! occupancy and class, and an OpenAI-compatible HTTP API with vLLM's
//! metric names. Its purpose is honest GPU-seconds for chargeback.
//!
//! Layout:
//! - [`profile`]: model profiles as configuration, and the roofline cost model
//! - [`tokenizer`]: prompt tokens with a real BPE vocabulary, block hashes
//! - [`kv`]: paged KV block accounting and occupancy
//! - [`prefix_cache`]: cached prompt blocks keyed by tenant, version and hash
//! - [`scheduler`]: continuous batching, chunked prefill, preemption, admission classes
//! - [`attribution`]: exact split of each step's GPU time among its requests
//! - [`replica`]: one replica stepping on a virtual clock, emitting events
//! - [`clock`]: virtual runs for tests and benchmarks, wall-clock pacing for the demo
//! - [`completion`]: what a caller and an engine exchange (request, pieces, what was used)
//! - [`simulator`]: the in-process engine the gateway calls: each model a pool of
//!   replica tasks, requests routed by `fleet::pool`
//! - [`replica_pool`]: a model's replicas and where a request goes (routing,
//!   dedicated replicas, dead replicas leaving the pool)
//! - [`replica_task`]: one replica as a task: its commands, paced steps, deliveries
//! - [`histogram`]: the fixed-bucket latency histograms a replica keeps
//! - [`metrics`]: Prometheus exposition under vLLM's names
//! - [`server`]: the OpenAI-compatible HTTP API (`engine` binary, port 8081),
//!   with its replicas' GPU time so far for the gateway that reports them
//! - [`identity`]: the signed tenant identity a gateway forwards to an engine
//! - [`wire`]: a simulated completion as `openai_wire` types (the OpenAI
//!   wire format itself is the `openai-wire` crate)
//! - [`error`]: the crate's error enum and its HTTP status codes
//!
//! Invariants:
//! - Every busy microsecond of a replica, times its GPUs, is attributed to
//!   exactly one request, in integer micro-GPU-seconds: the attributed sum
//!   equals busy GPU-seconds exactly. Idle time is counted apart.
//! - A prefix-cache lookup only ever sees the caller's own tenant's entries.
//! - The `engine` server takes a tenant and class only from a verified
//!   [`identity`] token, never from a plain header.
//! - `cached_tokens < prompt_tokens` (at least one prompt token is computed).
//! - A replica is deterministic: the same timeline gives the same outcomes.

pub mod attribution;
pub mod cli;
pub mod clock;
pub mod completion;
pub mod error;
pub mod histogram;
pub mod identity;
pub mod kv;
pub mod metrics;
pub mod prefix_cache;
pub mod profile;
pub mod replica;
pub mod replica_pool;
pub mod replica_task;
pub mod scheduler;
pub mod server;
pub mod simulator;
pub mod tokenizer;
pub mod wire;

pub use error::EngineError;
pub use profile::ModelProfile;
pub use replica::{Outcome, Replica, SeqRequest};
pub use scheduler::ServiceClass;
pub use simulator::{
    BusyIdle, Completion, CompletionRequest, Generation, GpuTimeReadings, OwnerWaiting, Piece,
    ReplicaGpuTime, Simulator, GPU_TIME_PATH,
};
