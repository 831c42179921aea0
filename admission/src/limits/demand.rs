//! What a request asks of each limit: the resource ([`Resource`]), how it
//! refills or how much may be held ([`Shape`]), one demand ([`Demand`]),
//! and the KV·seconds estimate ([`kv_mib_seconds`]).

use std::time::Duration;

use super::bucket::Rate;
use super::headers::*;
use super::kinds::*;
use super::shared;

/// What a limit is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Resource {
    /// Requests/min of one API key on one model.
    Requests(String, String),
    /// Tokens/min of one API key on one model.
    Tokens(String, String),
    TenantRequests(String),
    Global,
    /// Requests in flight for a tenant.
    Concurrency(String),
    /// KV·seconds in flight for a tenant, in MiB·s.
    KvSeconds(String),
}

impl Resource {
    pub(super) fn limit(&self) -> LimitKind {
        match self {
            Self::Requests(..) => LimitKind::Requests,
            Self::Tokens(..) => LimitKind::Tokens,
            Self::TenantRequests(_) => LimitKind::TenantRequests,
            Self::Global => LimitKind::GlobalRequests,
            Self::Concurrency(_) => LimitKind::Concurrency,
            Self::KvSeconds(_) => LimitKind::KvSeconds,
        }
    }

    /// Its key in Redis, under the cluster's prefix.
    pub(super) fn redis_name(&self) -> String {
        match self {
            Self::Requests(key, model) => format!("rpm:{key}:{model}"),
            Self::Tokens(key, model) => format!("tpm:{key}:{model}"),
            Self::TenantRequests(t) => format!("rps:{t}"),
            Self::Global => "rps-global".to_owned(),
            Self::Concurrency(t) => format!("inflight:{t}"),
            Self::KvSeconds(t) => format!("kv:{t}"),
        }
    }
}

/// How a resource refills, or how much of it may be held at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Shape {
    Rate(Rate),
    Capacity(u64),
}

impl Shape {
    pub(super) fn redis(self) -> shared::Kind {
        match self {
            Self::Rate(r) => shared::Kind::Rate {
                capacity: r.capacity,
                per_ms: r.per_sec / 1000.0,
            },
            Self::Capacity(c) => shared::Kind::Capacity { capacity: c },
        }
    }

    /// How much more than it needs a gateway leases at once: of a rate, a
    /// tenth of its share of the capacity or 50 ms of its share of the
    /// refill, whichever is more (at least 1); of a capacity, a tenth of
    /// its share (0 below 10 per gateway: units held and unused are units
    /// the other gateways cannot have), and also the most it keeps unused.
    pub(super) fn block(self, peers: u32) -> u64 {
        let n = f64::from(peers.max(1));
        match self {
            Self::Rate(r) => (r.capacity / (10.0 * n))
                .max(r.per_sec * 0.05 / n)
                .floor()
                .max(1.0) as u64,
            Self::Capacity(c) => (c as f64 / (10.0 * n)).floor() as u64,
        }
    }

    /// The most one request may need: a request larger than the whole
    /// limit passes when nothing else holds it (slow, never impossible).
    pub(super) fn cap(self) -> f64 {
        match self {
            Self::Rate(r) => r.capacity,
            Self::Capacity(c) => c as f64,
        }
    }
}

/// One thing a request takes: `need` is checked, `take` is charged (the
/// token estimate may exceed a whole bucket and leave it in debt).
#[derive(Debug, Clone)]
pub(super) struct Demand {
    pub(super) res: Resource,
    pub(super) shape: Shape,
    pub(super) take: f64,
    pub(super) message: String,
}

impl Demand {
    pub(super) fn need(&self) -> f64 {
        self.take.min(self.shape.cap())
    }

    pub(super) fn rejected(&self, wait: Duration) -> Rejected {
        Rejected {
            limit: self.res.limit(),
            wait,
            message: self.message.clone(),
        }
    }

    /// Refused by Redis for `why`, not by this demand's own limit unless
    /// `why` is [`shared::Short::Limit`].
    pub(super) fn refused(&self, why: shared::Short, wait: Duration) -> Rejected {
        let message = match why {
            shared::Short::Limit => return self.rejected(wait),
            shared::Short::Settling => format!(
                "the gateways are registering their requests in flight again (the shared \
                 Redis lost its state): this tenant's in-flight limits admit again in {}",
                format_reset(wait)
            ),
            shared::Short::Unregistered => {
                "this gateway is registering with the others: retry in a second".to_owned()
            }
        };
        Rejected {
            limit: self.res.limit(),
            wait,
            message,
        }
    }
}

/// A request's estimated KV·seconds in MiB·s, rounded up:
/// `(prompt + out/2) × KV bytes per token × out × TPOT` — the KV it holds
/// on average while it decodes `out` tokens, times how long that takes.
pub fn kv_mib_seconds(prompt: u64, out: u64, kv_bytes_per_token: u64, tpot: Duration) -> u64 {
    let avg_tokens = u128::from(prompt) * 2 + u128::from(out);
    // bytes·µs × 2 (the halves of out/2 kept exact).
    let byte_micros =
        avg_tokens * u128::from(kv_bytes_per_token) * u128::from(out) * tpot.as_micros();
    let per_mib_second = 2 * 1_048_576 * 1_000_000u128;
    u64::try_from(byte_micros.div_ceil(per_mib_second)).unwrap_or(u64::MAX)
}
