//! billing-api: what finance, team leads and support read.
//!
//! Layout:
//! - [`state`]: the state handlers share
//! - [`access`]: the role rules every handler asks (and the audit call)
//! - [`auth`]: who is calling — bearer tokens (hashed) for the API
//! - [`store`]: the storage layer, the only place with SQL
//! - [`tenant`]: what billing knows about a tenant
//! - [`tenant_admin`]: the tenants seed and its validation (billing-api owns tenants and keys)
//! - [`usage`]: hourly usage per tenant
//! - [`budget`]: monthly budgets and their 80%/100% warnings
//! - [`grace`]: the grace period (charges above the budget shown, not invoiced)
//! - [`rating`]: price books, usage → lines (the rounding rule), overhead split
//! - [`period`]: months in a time zone as UTC instants
//! - [`rated`]: stored usage as rating groups and lines
//! - [`drafts`]: draft invoices, one tenant or all
//! - [`adjustments`]: late usage for finalized months as lines on later invoices
//! - [`invoice`]: the invoice content and its hash
//! - [`lifecycle`]: finalize, void, close a month
//! - [`shadow`]: shadow bills with breakdowns, projection, shift savings
//! - [`lookup`]: request lookup for support
//! - [`export`]: invoice CSV and the FOCUS dataset
//! - [`tokens`]: token administration (API, pages, CLI)
//! - [`routes`], [`admin`]: the JSON API's handlers (invoices and reads; closing
//!   a month and tokens)
//! - [`pages`]: the server-rendered pages (sessions, CSRF, templates, charts)
//! - [`extract`]: the extractors (rejections in the API's shape) and the NUL check
//! - [`params`]: parameter formats (tenant ids, months, request ids), one
//!   pattern each for validation and for the OpenAPI document
//! - [`openapi`]: the OpenAPI 3 document, generated from the handlers
//! - [`cost_metrics`]: `/metrics` for cost tools, behind a bearer token
//! - [`service`], [`error`]: router, config and the one error → HTTP mapping
//!
//! Invariants: every handler asks [`access::check`] before it reads
//! anything; a team lead asking about another tenant gets a 404, never a
//! 403. Every read of money is written to `audit_log`. SQL lives only in
//! [`store`]. Every error, rejected input and unknown paths included, is
//! `{"error": {"code", "message"}}` on the API (the pages answer HTML), and
//! the OpenAPI document lists each status an operation can answer
//! (schemathesis checks it in `tests/tests/openapi_conformance.rs`).

pub mod access;
pub mod adjustments;
pub mod admin;
pub mod auth;
pub mod budget;
pub mod cli;
pub mod cost_metrics;
pub mod drafts;
pub mod error;
pub mod export;
pub mod extract;
pub mod grace;
pub mod invoice;
pub mod lifecycle;
pub mod lookup;
pub mod openapi;
pub mod pages;
pub mod params;
pub mod period;
pub mod rated;
pub mod rating;
pub mod routes;
pub mod service;
pub mod shadow;
pub mod state;
pub mod store;
pub mod tenant;
pub mod tenant_admin;
pub mod tokens;
pub mod usage;

pub use error::BillingError;
pub use service::{app, BillingConfig};
pub use state::AppState;
