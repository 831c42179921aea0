//! Usage events shaped like the five reference tenants' traffic, for the
//! demo's backfill of a whole month, the benchmarks and the tests.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use chrono::{DateTime, Utc};
//! let from: DateTime<Utc> = "2026-11-01T00:00:00Z".parse()?;
//! let to: DateTime<Utc> = "2026-12-01T00:00:00Z".parse()?;
//! let mut events = workload::Generator::reference(1, from, to, 1_500_000)?;
//! for event in events.by_ref() {
//!     let _payload = event.to_json(); // produce it, keyed by event.tenant_id
//! }
//! let expected = events.summary(); // what billing should show, exactly
//! println!("{expected}");
//! # Ok(())
//! # }
//! ```
//!
//! Tenants share the events in proportion to their reference requests/s
//! (200/50/30/10/100); through the day each follows its own shape:
//! interactive tenants peak in the business hours of their zone, the batch
//! tenant fills the price book's off-peak window. Prompt and output lengths
//! follow the reference's p50/p95, GPU time the engine's roofline shared
//! among the requests batched on a replica (the calibration is in [`fleet`]:
//! 1.5M events in 30 days make ~3,500 GPU-hours). Generating runs at ~2.3M
//! events/s in release (1.5M in 0.66 s, 2 shared cores), far above the
//! ~40k/s ingest takes.
//!
//! Layout:
//! - [`tenants`]: the five reference tenants — keys, priorities, rates,
//!   model shares, zones, limits, cache and stream shares
//! - [`fleet`]: the model profiles and the per-model concurrency that
//!   calibrates GPU time
//! - [`diurnal`]: the shape of a day per tenant, the off-peak window
//! - `arrivals`: exactly N start times, split by rate and intensity, in order
//! - [`request`]: one request's tokens, finish reason, timings and GPU time
//! - [`generator`]: [`Config`] → [`Generator`], the iterator of events
//! - [`summary`]: per-tenant and per-model totals of what was generated
//! - [`error`]: the configurations refused
//!
//! Invariants:
//! - A generator yields exactly `events` events, each valid under
//!   `usage_contract` (for any `now` from a day before the range's end),
//!   with `started_at` in `[from, to)` and nondecreasing.
//! - The same [`Config`] gives the same events, ids included; ids are
//!   unique within a sample.
//! - Billed figures are integers: token counts, and GPU time in
//!   micro-GPU-seconds turned into a `Decimal` of scale 6; floats only
//!   draw samples. The [`Summary`] is the exact sum of what was yielded.
//! - Memory does not grow with the count: one slot of ~64 arrivals is held
//!   at a time.

mod arrivals;
pub mod diurnal;
pub mod error;
pub mod fleet;
pub mod generator;
pub mod request;
pub mod summary;
pub mod tenants;

pub use error::WorkloadError;
pub use fleet::{Fleet, FleetModel, DEFAULT_CONCURRENCY};
pub use generator::{Config, Generator, GATEWAY_ID};
pub use summary::{ModelTotals, Summary, TenantTotals, Totals};
pub use tenants::{Load, ModelShare, PrefixCache, Tenant};
