//! billing-api: what finance, team leads and support read.
//!
//! Layout:
//! - [`auth`]: bearer tokens (hashed) with roles, tenant scoping, the audit log
//! - [`usage`]: hourly usage per tenant
//! - [`service`], [`error`]: router, config and the one error → HTTP mapping
//!
//! Invariant: every read of a tenant's usage or money goes through
//! [`auth::Principal::may_read_tenant`]; a refusal is a 404, never a 403.
//! Price books, invoices and shadow bills are the billing issue's work.

pub mod auth;
pub mod error;
pub mod rating;
pub mod service;
pub mod usage;

pub use error::BillingError;
pub use service::{app, AppState, BillingConfig};
