//! Request limits, checked together at admission (nothing is charged when
//! any of them says no):
//!
//! - per (API key, model): requests/min and tokens/min;
//! - per tenant: requests/s with a burst (the reference config's
//!   `rateLimit`), and a cap on concurrent in-flight requests;
//! - for the whole gateway: requests/s with a burst (400/s, burst 60 in the
//!   reference fleet), above every tenant's bucket.
//!
//! Both per-minute limits are token buckets that hold at most one minute's
//! allowance and refill continuously (`limit / 60` per second). A request
//! takes one request token and, at admission, its token *estimate*
//! (prompt + min(max_tokens, max_output)); when it ends, [`Permit::settle`]
//! puts back the difference between the estimate and what it actually used,
//! at once. A request whose estimate is larger than a whole minute's
//! allowance is admitted when the bucket is full and leaves it in debt, so
//! it is slow, never impossible.
//!
//! Every gateway behind a load balancer enforces the same limits together
//! (the [`crate::cluster`] decides the mode):
//!
//! - **shared** (Redis reachable): a gateway leases blocks of each limit
//!   from Redis and spends them locally ([`shared`] has the arithmetic), so
//!   the gateways together stay within every limit and Redis sees one call
//!   per block, not per request;
//! - **local** (Redis unreachable, or `GATEWAY_LIMITS=local`): each gateway
//!   enforces its share in memory — every limit divided by the number of
//!   gateways it last saw ([`bucket`]). Rates fail *open* that way (each
//!   gateway keeps admitting its share; billing is exact anyway);
//!   concurrency and KV·seconds fail *closed* to the same share.
//!
//! Besides the request count, a tenant may cap its KV·seconds in flight
//! (`max_kv_gib_seconds`): each request is estimated by [`kv_mib_seconds`],
//! and one larger than the whole cap passes alone, like the token estimate.

pub mod bucket;
mod demand;
mod headers;
mod kinds;
mod leases;
mod limiter;
mod renewal;
pub mod shared;
#[cfg(test)]
mod tests;

pub use crate::caller::RequestRate;
pub use demand::kv_mib_seconds;
pub use headers::{apply_headers, format_reset, RetryAfter};
pub use kinds::{LimitKind, RateStatus, Rejected, Window};
pub use limiter::{Ask, Limiter, Permit};
