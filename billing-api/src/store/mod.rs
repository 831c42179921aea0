//! The storage layer: the only place in billing-api with SQL. Every
//! function takes a `&mut PgConnection`, so an operation that must read
//! what it locks (finalize) runs every read on its own transaction, and a
//! handler that only reads passes a connection from the pool.
//!
//! Layout:
//! - [`tenants`]: tenants and API keys (read, and written by the seed and
//!   the administration, validated before they reach here)
//! - [`price_books`]: stored price books
//! - [`usage`]: usage_hourly (and the per-key rollup) as billing reads it
//! - [`invoices`]: finalized and voided invoices
//! - [`budgets`]: monthly budgets per tenant
//! - [`access`]: billing tokens, sessions and the audit log

pub mod access;
pub mod budgets;
pub mod invoices;
pub mod price_books;
pub mod tenants;
pub mod usage;

pub use sqlx::PgConnection as Conn;
