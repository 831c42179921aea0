//! The GPU engine, simulated.
//!
//! No GPU is available where Meterline is developed, so the engine is a
//! simulator with a physical cost model. It answers completions with
//! deterministic text and reports what a real engine would: token counts
//! from a real BPE tokenizer, time to first token, and the GPU-seconds the
//! request used, exact to the microsecond.
//!
//! Layout:
//! - [`profile`]: model profiles (GPUs per replica, prefill and decode rates)
//! - [`tokenizer`]: prompt token counting with a real BPE vocabulary
//! - [`simulator`]: the in-process engine the gateway calls
//!
//! This is the walking-skeleton engine: one request is costed as if it ran
//! alone on its replica. Continuous batching, paged KV, the prefix cache and
//! admission by KV occupancy are the next step (see the engine issue).

pub mod profile;
pub mod simulator;
pub mod tokenizer;

pub use profile::ModelProfile;
pub use simulator::{Completion, CompletionRequest, EngineError, Simulator};
