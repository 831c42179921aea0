//! Reserved floors on this gateway's model pools, simulated and HTTP. The tenants'
//! floors come from the tenant config (billing-api writes them, the
//! [`crate::caller::Registry`] reads them with the keys); each model pool's
//! router keeps a floor's unused part free of other tenants' work
//! (`fleet::pool`). Together the floors may hold at most
//! `GATEWAY_FLOOR_LIMIT` of a pool: floors that add up to more are scaled
//! down in proportion (logged), so the pool never promises more than it
//! was told it may. On `/metrics`: `gateway_reserved_floor_ratio{tenant}`
//! (each floor as applied) and `gateway_reserved_floors_ratio{of}` for the
//! sum `promised` by the config, the sum `applied`, and the `limit`.
//!
//! A simulated pool counts the floors in KV bytes (`fleet::pool`), a pool
//! of HTTP replicas (`GATEWAY_UPSTREAMS`) in KV tokens
//! ([`tokens`]). The policy itself — what a floor holds back from whom — is
//! `fleet::floors`; this module is its runtime on the gateway's pools.
//!
//! - [`applied`]: the promised floors scaled to the limit and set on every
//!   pool, simulated and HTTP, when they change
//! - [`tokens`]: a pool of HTTP replicas holding its floors in KV tokens

pub mod applied;
pub mod tokens;

pub use applied::{scaled, Floors, FloorsSetter};
pub use tokens::{FloorShare, HttpFloors, PoolFloors};
