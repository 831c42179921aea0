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
//! The liveness key holds this process's *incarnation* (random at each
//! start), and capacity units are held under [`Cluster::holder`]
//! (`{id}#{incarnation}`): a gateway restarted with the same `GATEWAY_ID`
//! replaces the incarnation at its first heartbeat, and what its previous
//! life held stops counting at once (it holds nothing yet).
//!
//! [`Mode::Shared`]: limits are leased from Redis. [`Mode::Local`]: Redis
//! did not answer (or `GATEWAY_LIMITS=local`); each gateway enforces its
//! share of every limit — the limit divided by the number of gateways it
//! last saw — in memory, and the heartbeat brings it back to shared mode
//! by itself once Redis answers. Rates fail open, divided by the gateways
//! it last saw; concurrency and KV·seconds fail closed, divided by
//! [`Cluster::closed_peers`]: the most gateways this one has ever seen
//! (kept in a file across restarts) or the expected count
//! (`GATEWAY_EXPECTED_PEERS`), whichever is larger — never 1 because a
//! gateway started while Redis was down has seen nobody. The mode is on `/metrics`
//! (`gateway_limits_mode`) and every change is logged. The first call
//! between two heartbeats that finds its connection dropped (Redis
//! restarted) does not count: the next call, on a new connection, tells.
//!
//! Redis keeps nothing on disk. `{prefix}epoch` is written by the first
//! heartbeat and never expires, so its absence means Redis lost
//! everything (restarted empty, or `FLUSHALL`). Whoever notices first — a
//! heartbeat of a gateway that had one before, or a lease — starts
//! `{prefix}settling` ([`SETTLE`]): no capacity is leased until it ends,
//! and by then every live gateway's heartbeat (every [`RENEW_EVERY`]) has
//! found its liveness key gone and registered again what it holds. Rates
//! are not held back: every bucket starts full again (see docs/operations.md, "Several gateways,
//! one fleet").
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

/// How often a gateway renews what it holds.
pub const RENEW_EVERY: Duration = Duration::from_secs(5);
/// What a gateway holds is reclaimed after this long without renewal.
pub const RECLAIM_AFTER: Duration = Duration::from_secs(15);
/// While Redis is down, how often it is tried again.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);
/// After Redis lost everything, how long no capacity is leased: a
/// heartbeat interval for every live gateway to register what it holds,
/// and two renewal ticks of slack.
pub const SETTLE: Duration = Duration::from_secs(RENEW_EVERY.as_secs() + 2);
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

/// How many gateways the capacity limits (concurrency, KV·seconds) are
/// divided among while Redis is unreachable.
#[derive(Debug, Clone)]
pub struct FailClosed {
    /// At least this many (`GATEWAY_EXPECTED_PEERS`).
    pub expected_peers: u32,
    /// Where the most gateways ever seen alive is kept, so a gateway
    /// restarted during an outage divides as before it; none: not kept.
    pub seen_file: Option<PathBuf>,
}

impl FailClosed {
    /// At least `expected_peers`, the most seen not kept.
    pub fn expect(expected_peers: u32) -> Self {
        Self {
            expected_peers,
            seen_file: None,
        }
    }

    /// A gateway alone by configuration (`GATEWAY_LIMITS=local`).
    pub fn alone() -> Self {
        Self::expect(1)
    }

    /// The count kept in `seen_file` (0 without one, or unreadable: a
    /// damaged file is logged and the expected count holds).
    fn seen(&self) -> u32 {
        let Some(path) = &self.seen_file else {
            return 0;
        };
        match std::fs::read_to_string(path) {
            Ok(text) => text.trim().parse().unwrap_or_else(|_| {
                tracing::warn!(path = %path.display(), "peers seen: not a count, ignored");
                0
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "peers seen: unreadable, ignored");
                0
            }
        }
    }

    /// Keeps `n` in `seen_file` (written beside it, then renamed over it).
    fn keep(&self, n: u32) {
        let Some(path) = &self.seen_file else { return };
        let tmp = path.with_extension("tmp");
        let written =
            std::fs::write(&tmp, format!("{n}\n")).and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "could not keep the peers seen");
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
    /// Random at each start: the value of this gateway's liveness key.
    incarnation: String,
    /// `{id}#{incarnation}`: the field of what this process holds.
    holder: String,
    prefix: String,
    shared: AtomicBool,
    peers: AtomicU32,
    /// What capacity limits are divided among in local mode: the most
    /// gateways seen or expected.
    closed_peers: AtomicU32,
    fail_closed: FailClosed,
    /// A heartbeat of this process succeeded once: an epoch missing later
    /// means Redis lost everything, not that the cluster is new.
    known: AtomicBool,
    /// A dropped connection was let pass since the last heartbeat.
    dropped: AtomicBool,
    heartbeat: Script,
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
    pub fn connect(
        url: &str,
        prefix: &str,
        gateway_id: &str,
        fail_closed: FailClosed,
    ) -> Result<Self, redis::RedisError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(Self::build(Some(conn), prefix, gateway_id, fail_closed))
    }

    /// A gateway on its own: limits in memory, never shared.
    pub fn local(gateway_id: &str) -> Self {
        Self::build(None, "", gateway_id, FailClosed::alone())
    }

    fn build(
        conn: Option<ConnectionManager>,
        prefix: &str,
        gateway_id: &str,
        fail_closed: FailClosed,
    ) -> Self {
        // Until the first heartbeat says otherwise, local: nothing on the
        // request path waits for a Redis that may not be there.
        crate::telemetry::limits_mode(Mode::Local.as_str());
        let incarnation = format!("{:016x}", rand::random::<u64>());
        let closed_peers = fail_closed.expected_peers.max(fail_closed.seen()).max(1);
        crate::telemetry::closed_peers(closed_peers);
        Self {
            inner: Arc::new(Inner {
                conn,
                gateway_id: gateway_id.to_owned(),
                holder: format!("{gateway_id}#{incarnation}"),
                incarnation,
                prefix: prefix.to_owned(),
                shared: AtomicBool::new(false),
                peers: AtomicU32::new(1),
                closed_peers: AtomicU32::new(closed_peers),
                fail_closed,
                known: AtomicBool::new(false),
                dropped: AtomicBool::new(false),
                heartbeat: Script::new(HEARTBEAT),
            }),
        }
    }

    pub fn gateway_id(&self) -> &str {
        &self.inner.gateway_id
    }

    /// The field this process holds capacity under: its id and
    /// incarnation, so nothing a previous life of the same id held counts.
    pub fn holder(&self) -> &str {
        &self.inner.holder
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

    /// What concurrency and KV·seconds are divided among while Redis is
    /// unreachable: the most gateways this one has seen alive, or the
    /// expected count, whichever is larger (at least [`Self::peers`]).
    pub fn closed_peers(&self) -> u32 {
        self.inner
            .closed_peers
            .load(Ordering::Relaxed)
            .max(self.peers())
    }

    /// A Redis key under this cluster's prefix.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.inner.prefix)
    }

    /// The liveness key of gateway `id`.
    pub fn alive_key(&self, id: &str) -> String {
        self.key(&format!("gw:{id}"))
    }

    /// Written by the first heartbeat, never expiring: gone means Redis
    /// lost everything.
    pub fn epoch_key(&self) -> String {
        self.key("epoch")
    }

    /// Lives [`SETTLE`] after Redis lost everything: no capacity leased.
    pub fn settling_key(&self) -> String {
        self.key("settling")
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

    /// A Redis call failed: local mode until a heartbeat succeeds. The
    /// first connection Redis dropped since the last heartbeat is let
    /// pass (Redis restarted: the next call is made on a new connection);
    /// a second one is an outage.
    pub fn failed(&self, error: &redis::RedisError) {
        if error.is_connection_dropped() && !self.inner.dropped.swap(true, Ordering::AcqRel) {
            tracing::info!(%error, "Redis dropped the connection: the next call makes a new one");
            return;
        }
        self.unreachable(error);
    }

    /// Redis did not answer even on a new connection (the heartbeat tries
    /// one itself): local mode until a heartbeat succeeds.
    pub fn unreachable(&self, error: &redis::RedisError) {
        if self.inner.shared.swap(false, Ordering::AcqRel) {
            tracing::warn!(
                %error,
                peers = self.peers(),
                closed_peers = self.closed_peers(),
                "Redis unreachable: limits now local, rates at 1/{} of the shared limit, concurrency and KV·seconds at 1/{}",
                self.peers(),
                self.closed_peers()
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
    /// gateways (one Lua call, on Redis's clock). Returns whether Redis
    /// did not hold this process's liveness (Redis lost its state, this
    /// gateway was silent 15 s, or it is new), in which case whatever it
    /// holds must be registered again.
    pub async fn heartbeat(&self) -> Result<bool, redis::RedisError> {
        let Some(mut conn) = self.any_conn() else {
            return Ok(false);
        };
        let id = &self.inner.gateway_id;
        let known = self.inner.known.load(Ordering::Acquire);
        let mut call = self.inner.heartbeat.prepare_invoke();
        call.key(self.alive_key(id))
            .key(self.key("gateways"))
            .key(self.epoch_key())
            .key(self.settling_key())
            .arg(id)
            .arg(&self.inner.incarnation)
            .arg(RECLAIM_AFTER.as_millis() as u64)
            .arg(if known { "1" } else { "0" })
            .arg(SETTLE.as_millis() as u64);
        crate::telemetry::redis_call("heartbeat");
        let reply: Result<(u32, String, i64), _> = match call.invoke_async(&mut conn).await {
            Err(e) if e.is_connection_dropped() => {
                // Redis restarted: the manager reconnects for this try.
                crate::telemetry::redis_call("heartbeat");
                call.invoke_async(&mut conn).await
            }
            other => other,
        };
        let (peers, previous, reset) = reply?;
        let lost = previous != self.inner.incarnation;
        if known && lost && !previous.is_empty() {
            tracing::error!(
                gateway_id = %id,
                "another process holds this GATEWAY_ID's liveness: every gateway needs an id of its own"
            );
        }
        if reset == 1 {
            tracing::warn!(
                settle_ms = SETTLE.as_millis() as u64,
                "Redis lost its state: capacity is leased again once every gateway registered what it holds"
            );
        }
        self.inner.known.store(true, Ordering::Release);
        self.inner.dropped.store(false, Ordering::Release);
        self.inner.peers.store(peers.max(1), Ordering::Relaxed);
        crate::telemetry::peers(peers.max(1));
        if self.inner.closed_peers.fetch_max(peers, Ordering::Relaxed) < peers {
            self.inner.fail_closed.keep(peers);
            crate::telemetry::closed_peers(peers);
        }
        if !self.inner.shared.swap(true, Ordering::AcqRel) {
            tracing::info!(peers, "Redis reachable: limits shared with every gateway");
            crate::telemetry::limits_mode(Mode::Shared.as_str());
        }
        Ok(lost)
    }
}

/// The heartbeat. KEYS: this gateway's liveness, the gateways' set, the
/// epoch, the settling key. ARGV: id, incarnation, liveness ms, whether
/// this process had a heartbeat before (`1`), settle ms. Returns `{live
/// gateways, the liveness key's previous value ('' if none), 1 if this
/// call found Redis emptied}`.
const HEARTBEAT: &str = r"
local alive, members, epoch, settling = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, inc, reclaim, known, settle = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local previous = redis.call('GET', alive) or ''
local reset = 0
if redis.call('EXISTS', epoch) == 0 then
  redis.call('SET', epoch, now)
  if known == '1' then
    redis.call('SET', settling, now, 'PX', settle, 'NX')
    reset = 1
  end
end
redis.call('SET', alive, inc, 'PX', reclaim)
redis.call('ZADD', members, now, id)
redis.call('ZREMRANGEBYSCORE', members, '-inf', string.format('(%d', now - reclaim))
return {redis.call('ZCARD', members), previous, reset}
";
