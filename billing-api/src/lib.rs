//! billing-api: what finance, team leads and support read.
//!
//! Layout:
//! - [`auth`]: bearer tokens (hashed) with roles, tenant scoping, the audit log
//! - [`usage`]: hourly usage per tenant
//! - [`rating`]: price books, usage → lines (the rounding rule), overhead split
//! - [`period`]: months in a time zone as UTC instants
//! - [`drafts`]: draft invoices from usage_hourly, one tenant or all
//! - [`invoice`]: the invoice content and its hash
//! - [`lifecycle`]: finalize, void, adjustments for late usage
//! - [`shadow`]: shadow bills with breakdowns, projection, shift savings
//! - [`lookup`]: request lookup for support
//! - [`export`]: invoice CSV and the FOCUS dataset
//! - [`routes`]: handlers and the access rules
//! - [`extract`]: the extractors (rejections in the API's shape) and the NUL check
//! - [`params`]: parameter formats (tenant ids, months, request ids), one
//!   pattern each for validation and for the OpenAPI document
//! - [`openapi`]: the OpenAPI 3 document, generated from the handlers
//! - [`cost_metrics`]: `/metrics` for cost tools (GPU-seconds, cost, preemption waste)
//! - [`service`], [`error`]: router, config and the one error → HTTP mapping
//!
//! Invariants: every handler checks the caller with `routes::check` before
//! it reads anything; a team lead asking about another tenant gets a 404,
//! never a 403. Every read of money is written to `audit_log`. Every error,
//! rejected input and unknown paths included, is `{"error": {"code",
//! "message"}}`, and the OpenAPI document lists each status an operation
//! can answer (schemathesis checks it in `tests/tests/openapi_conformance.rs`).

pub mod auth;
pub mod cost_metrics;
pub mod drafts;
pub mod error;
pub mod export;
pub mod extract;
pub mod invoice;
pub mod lifecycle;
pub mod lookup;
pub mod openapi;
pub mod params;
pub mod period;
pub mod rating;
pub mod routes;
pub mod service;
pub mod shadow;
pub mod usage;

pub use error::BillingError;
pub use service::{app, AppState, BillingConfig};
