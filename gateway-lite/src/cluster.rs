//! The gateways as one: the Redis connection they share, this gateway's
//! liveness in it, how many gateways are alive, and the mode the limits
//! run in.
//!
//! Every gateway writes a liveness key (`{prefix}gw:{id}`, 15 s expiry)
//! and its entry in the `{prefix}gateways` set every 5 s; whatever a
//! gateway holds in Redis (capacity slots, idempotency claims) is only
//! counted while that key lives, so a SIGKILLed gateway's holdings return
//! within 15 s and a live gateway's never expire.
//!
//! [`Mode::Shared`]: limits are leased from Redis. [`Mode::Local`]: Redis
//! did not answer (or `GATEWAY_LIMITS=local`); each gateway enforces its
//! share of every limit — the limit divided by the number of gateways it
//! last saw — in memory, and the heartbeat brings it back to shared mode
//! by itself once Redis answers. The mode is on `/metrics`
//! (`gateway_limits_mode`) and every change is logged.
//!
//! Redis keeps nothing on disk: when a heartbeat finds its own liveness key
//! gone although it renewed it in time, Redis lost its state, and the
//! limiter registers what this gateway holds again.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// How often a gateway renews what it holds.
pub const RENEW_EVERY: Duration = Duration::from_secs(5);
/// What a gateway holds is reclaimed after this long without renewal.
pub const RECLAIM_AFTER: Duration = Duration::from_secs(15);
/// While Redis is down, how often it is tried again.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);
/// The longest a Redis call may take before the gateway counts Redis as
/// unreachable (on the request path this is the worst added latency).
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(250);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Where the limits are enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Leased from Redis: every gateway together stays within each limit.
    Shared,
    /// In memory, this gateway's share of each limit.
    Local,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::Local => "local",
        }
    }
}

/// The shared Redis and this gateway's place among its peers; cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None`: `GATEWAY_LIMITS=local`, never shared.
    conn: Option<ConnectionManager>,
    gateway_id: String,
    prefix: String,
    shared: AtomicBool,
    peers: AtomicU32,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("gateway_id", &self.inner.gateway_id)
            .field("mode", &self.mode())
            .field("peers", &self.peers())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// A cluster on the Redis at `url` (connected lazily: a gateway starts,
    /// in local mode, while Redis is down), keys under `prefix`.
    pub fn connect(url: &str, prefix: &str, gateway_id: &str) -> Result<Self, redis::RedisError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(Self::build(Some(conn), prefix, gateway_id))
    }

    /// A gateway on its own: limits in memory, never shared.
    pub fn local(gateway_id: &str) -> Self {
        Self::build(None, "", gateway_id)
    }

    fn build(conn: Option<ConnectionManager>, prefix: &str, gateway_id: &str) -> Self {
        // Until the first heartbeat says otherwise, local: nothing on the
        // request path waits for a Redis that may not be there.
        crate::telemetry::limits_mode(Mode::Local.as_str());
        Self {
            inner: Arc::new(Inner {
                conn,
                gateway_id: gateway_id.to_owned(),
                prefix: prefix.to_owned(),
                shared: AtomicBool::new(false),
                peers: AtomicU32::new(1),
            }),
        }
    }

    pub fn gateway_id(&self) -> &str {
        &self.inner.gateway_id
    }

    pub fn mode(&self) -> Mode {
        if self.inner.shared.load(Ordering::Acquire) {
            Mode::Shared
        } else {
            Mode::Local
        }
    }

    /// Gateways alive at the last heartbeat (at least 1: this one).
    pub fn peers(&self) -> u32 {
        self.inner.peers.load(Ordering::Relaxed).max(1)
    }

    /// A Redis key under this cluster's prefix.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.inner.prefix)
    }

    /// The liveness key of gateway `id`.
    pub fn alive_key(&self, id: &str) -> String {
        self.key(&format!("gw:{id}"))
    }

    /// Whether the gateways share a Redis at all (not `GATEWAY_LIMITS=local`),
    /// reachable or not.
    pub fn has_redis(&self) -> bool {
        self.inner.conn.is_some()
    }

    /// The connection, in shared mode only.
    pub fn conn(&self) -> Option<ConnectionManager> {
        match self.mode() {
            Mode::Shared => self.inner.conn.clone(),
            Mode::Local => None,
        }
    }

    /// The connection whatever the mode (for the heartbeat that ends local mode).
    fn any_conn(&self) -> Option<ConnectionManager> {
        self.inner.conn.clone()
    }

    /// A Redis call failed: local mode until a heartbeat succeeds.
    pub fn failed(&self, error: &redis::RedisError) {
        if self.inner.shared.swap(false, Ordering::AcqRel) {
            tracing::warn!(
                %error,
                peers = self.peers(),
                "Redis unreachable: limits now local, each at 1/{} of the shared limit",
                self.peers()
            );
            crate::telemetry::limits_mode(Mode::Local.as_str());
        }
    }

    /// Leaves the cluster on shutdown: its liveness key and its entry in
    /// the set go, so whatever it still held is reclaimed at once.
    pub async fn leave(&self) {
        let Some(mut conn) = self.conn() else {
            return;
        };
        let id = &self.inner.gateway_id;
        let result: Result<(), _> = redis::pipe()
            .cmd("DEL")
            .arg(self.alive_key(id))
            .ignore()
            .cmd("ZREM")
            .arg(self.key("gateways"))
            .arg(id)
            .ignore()
            .query_async(&mut conn)
            .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, "could not leave the cluster in Redis");
        }
    }

    /// One heartbeat: renews this gateway's liveness and counts the live
    /// gateways. Returns whether Redis had lost this gateway's liveness
    /// key (Redis restarted empty, or this gateway is new), in which case
    /// whatever it holds must be registered again.
    pub async fn heartbeat(&self) -> Result<bool, redis::RedisError> {
        let Some(mut conn) = self.any_conn() else {
            return Ok(false);
        };
        crate::telemetry::redis_call("heartbeat");
        let id = &self.inner.gateway_id;
        let members = self.key("gateways");
        // The set's scores are Redis's own clock, so gateways' clocks never matter.
        let (time, previous): ((u64, u64), Option<String>) = redis::pipe()
            .cmd("TIME")
            .cmd("GET")
            .arg(self.alive_key(id))
            .query_async(&mut conn)
            .await?;
        let now_ms = time.0 * 1000 + time.1 / 1000;
        let stale = now_ms.saturating_sub(RECLAIM_AFTER.as_millis() as u64);
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(self.alive_key(id))
            .arg(1)
            .arg("EX")
            .arg(RECLAIM_AFTER.as_secs())
            .ignore()
            .cmd("ZADD")
            .arg(&members)
            .arg(now_ms)
            .arg(id)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(&members)
            .arg("-inf")
            .arg(format!("({stale}"))
            .ignore()
            .cmd("ZCARD")
            .arg(&members);
        let (peers,): (u32,) = pipe.query_async(&mut conn).await?;
        self.inner.peers.store(peers.max(1), Ordering::Relaxed);
        crate::telemetry::peers(peers.max(1));
        if !self.inner.shared.swap(true, Ordering::AcqRel) {
            tracing::info!(peers, "Redis reachable: limits shared with every gateway");
            crate::telemetry::limits_mode(Mode::Shared.as_str());
        }
        Ok(previous.is_none())
    }
}
