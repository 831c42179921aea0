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
pub mod shared;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::caller::Caller;
use crate::cluster::{Cluster, Mode};
use bucket::{Bucket, Rate};

/// Which limit turned a request away; also the OpenAI error `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitKind {
    Requests,
    Tokens,
    Concurrency,
    KvSeconds,
    /// The tenant's priority is refused while the pool is saturated.
    Degraded,
    TenantRequests,
    GlobalRequests,
}

impl LimitKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::Tokens => "tokens",
            Self::Concurrency => "concurrency",
            Self::KvSeconds => "kv_seconds",
            Self::Degraded => "degraded",
            Self::TenantRequests => "tenant_requests",
            Self::GlobalRequests => "global_requests",
        }
    }
}

/// A request turned away, and how long until it could pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub limit: LimitKind,
    /// The least time until the limit would let this request through.
    pub wait: Duration,
    pub message: String,
}

/// One limit's figures for the `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub limit: u64,
    pub remaining: u64,
    /// Until the bucket is full again.
    pub reset: Duration,
}

/// The figures behind the `x-ratelimit-*` headers for one key and model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RateStatus {
    pub requests: Option<Window>,
    pub tokens: Option<Window>,
}

pub use crate::caller::RequestRate;

/// What a limit is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Resource {
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
    fn limit(&self) -> LimitKind {
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
    fn redis_name(&self) -> String {
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
enum Shape {
    Rate(Rate),
    Capacity(u64),
}

impl Shape {
    fn redis(self) -> shared::Kind {
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
    fn block(self, peers: u32) -> u64 {
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
    fn cap(self) -> f64 {
        match self {
            Self::Rate(r) => r.capacity,
            Self::Capacity(c) => c as f64,
        }
    }
}

/// One thing a request takes: `need` is checked, `take` is charged (the
/// token estimate may exceed a whole bucket and leave it in debt).
#[derive(Debug, Clone)]
struct Demand {
    res: Resource,
    shape: Shape,
    take: f64,
    message: String,
}

impl Demand {
    fn need(&self) -> f64 {
        self.take.min(self.shape.cap())
    }

    fn rejected(&self, wait: Duration) -> Rejected {
        Rejected {
            limit: self.res.limit(),
            wait,
            message: self.message.clone(),
        }
    }

    /// Refused by Redis for `why`, not by this demand's own limit unless
    /// `why` is [`shared::Short::Limit`].
    fn refused(&self, why: shared::Short, wait: Duration) -> Rejected {
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

/// What this gateway holds of a shared resource: unspent leased tokens of
/// a rate, or the units of a capacity it leased (some of them in use).
#[derive(Debug, Clone, Copy)]
struct Holding {
    units: f64,
    shape: Shape,
    touched: Instant,
}

/// One admitted request, for the lease records in Redis.
#[derive(Debug, Clone)]
struct InFlight {
    tenant: String,
    request_id: String,
    kv_mib_seconds: u64,
    started_unix_ms: i64,
}

#[derive(Default)]
struct State {
    /// The mode the state below was built for.
    mode: Option<Mode>,
    /// Local mode: this gateway's share of every rate.
    buckets: HashMap<Resource, Bucket>,
    /// Shared mode: what is leased from Redis.
    holdings: HashMap<Resource, Holding>,
    /// Capacity units used by this gateway's requests (both modes).
    in_use: HashMap<Resource, u64>,
    /// The shape of each capacity in `in_use` (to hold it again in Redis
    /// after a mode change).
    capacity_shapes: HashMap<Resource, Shape>,
    /// Shared mode: what each rate had left in Redis at its last lease.
    left: HashMap<Resource, u64>,
    in_flight: HashMap<u64, InFlight>,
    /// Requests in flight per tenant (the count of `in_flight`'s entries).
    tenant_in_flight: HashMap<String, u32>,
    /// Lease calls of this gateway out at Redis right now.
    leasing: u32,
    next_id: u64,
    /// Redis lost what this gateway holds: register it at the next renewal.
    register: bool,
}

impl State {
    /// Adapts the state to `mode`: entering shared mode, the capacity in
    /// use is what this gateway holds (registered at the next renewal) and
    /// the local buckets go; entering local mode, leases are forgotten.
    fn sync(&mut self, mode: Mode, now: Instant) {
        if self.mode == Some(mode) {
            return;
        }
        self.mode = Some(mode);
        self.buckets.clear();
        self.holdings.clear();
        self.left.clear();
        if mode == Mode::Shared {
            for (res, used) in &self.in_use {
                if let Some(&shape) = self.capacity_shapes.get(res) {
                    self.holdings.insert(
                        res.clone(),
                        Holding {
                            units: *used as f64,
                            shape,
                            touched: now,
                        },
                    );
                }
            }
            self.register = true;
        }
    }

    fn used(&self, res: &Resource) -> u64 {
        self.in_use.get(res).copied().unwrap_or(0)
    }

    /// Local mode: every demand against this gateway's share, then all charged.
    fn admit_local(
        &mut self,
        demands: &[Demand],
        peers: u32,
        now: Instant,
    ) -> Result<(), Rejected> {
        for d in demands {
            match d.shape {
                Shape::Rate(rate) => {
                    let rate = rate.share(peers);
                    let b = self
                        .buckets
                        .entry(d.res.clone())
                        .or_insert_with(|| Bucket::full(rate, now));
                    b.refill(rate, now);
                    let need = d.take.min(rate.capacity);
                    if b.level < need {
                        return Err(d.rejected(b.wait_for(need, rate)));
                    }
                }
                Shape::Capacity(cap) => {
                    let share = (cap / u64::from(peers.max(1))).max(1);
                    let used = self.used(&d.res);
                    if used > 0 && used as f64 + d.take > share as f64 {
                        return Err(d.rejected(Duration::from_secs(1)));
                    }
                }
            }
        }
        for d in demands {
            match d.shape {
                Shape::Rate(_) => {
                    if let Some(b) = self.buckets.get_mut(&d.res) {
                        b.level -= d.take;
                    }
                }
                Shape::Capacity(_) => {
                    *self.in_use.entry(d.res.clone()).or_default() += d.take as u64;
                    self.capacity_shapes.insert(d.res.clone(), d.shape);
                }
            }
        }
        Ok(())
    }

    /// Shared mode: admits from what is leased, or says what to lease
    /// (the demand's index and the ask). A capacity is leased with a block
    /// only when no other lease of this gateway is out: concurrent
    /// admissions would each take one, and a gateway would hold the whole
    /// cap for a handful of requests.
    fn admit_shared(
        &mut self,
        demands: &[Demand],
        cluster: &Cluster,
        now: Instant,
    ) -> Result<(), Vec<(usize, shared::Ask)>> {
        let peers = cluster.peers();
        let mut asks = Vec::new();
        for (i, d) in demands.iter().enumerate() {
            let free = self.free(d);
            let need = d.need();
            if free < need {
                let short = (need - free).ceil().max(1.0) as u64;
                let block = match d.shape {
                    Shape::Capacity(_) if self.leasing > 0 => 0,
                    shape => shape.block(peers),
                };
                asks.push((
                    i,
                    shared::Ask {
                        key: cluster.key(&d.res.redis_name()),
                        kind: d.shape.redis(),
                        need: short,
                        want: short + block,
                    },
                ));
            }
        }
        if !asks.is_empty() {
            return Err(asks);
        }
        for d in demands {
            match d.shape {
                Shape::Rate(_) => {
                    if let Some(h) = self.holdings.get_mut(&d.res) {
                        h.units -= d.take;
                        h.touched = now;
                    }
                }
                Shape::Capacity(_) => {
                    *self.in_use.entry(d.res.clone()).or_default() += d.take as u64;
                    self.capacity_shapes.insert(d.res.clone(), d.shape);
                    if let Some(h) = self.holdings.get_mut(&d.res) {
                        h.touched = now;
                    }
                }
            }
        }
        Ok(())
    }

    /// What this gateway holds of `d`'s resource and may spend: unspent
    /// leased tokens of a rate, held units of a capacity not in use.
    fn free(&self, d: &Demand) -> f64 {
        let held = self.holdings.get(&d.res).map_or(0.0, |h| h.units);
        match d.shape {
            Shape::Rate(_) => held,
            Shape::Capacity(_) => held - self.used(&d.res) as f64,
        }
    }

    /// Whether what this gateway holds of `d`'s resource covers it.
    fn covers(&self, d: &Demand) -> bool {
        self.free(d) >= d.need()
    }

    fn add_lease(&mut self, d: &Demand, granted: u64, left: u64, now: Instant) {
        let h = self.holdings.entry(d.res.clone()).or_insert(Holding {
            units: 0.0,
            shape: d.shape,
            touched: now,
        });
        h.units += granted as f64;
        h.shape = d.shape;
        h.touched = now;
        if matches!(d.shape, Shape::Rate(_)) {
            self.left.insert(d.res.clone(), left);
        }
    }
}

/// How many times an admission may lease before it gives up (other
/// requests of this gateway spent what it leased in between). With 4, a
/// starved machine (three busy loops beside the test on 2 cores) refused
/// one of `shared_limits`' concurrent admissions for global tokens its own
/// gateway held in 1 of 25 runs (60 rounds each); with 8, in none of 65.
const LEASE_TRIES: usize = 8;
/// The longest an admission Redis found short waits for this gateway's
/// other leases in flight to land before it retries.
const LEASE_WAIT: Duration = Duration::from_millis(250);
/// Leased units unused this long are given back.
const GIVE_BACK_AFTER: Duration = Duration::from_secs(1);

/// The limiter; cheap to clone.
#[derive(Clone)]
pub struct Limiter {
    state: Arc<Mutex<State>>,
    global: Option<RequestRate>,
    cluster: Cluster,
    scripts: Arc<shared::Scripts>,
    /// Woken each time a lease call of this gateway lands.
    leased: Arc<tokio::sync::Notify>,
    /// Each priority's share of its requests/s (the fairness layer).
    ladder: Option<crate::ladder::Ladder>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter").finish_non_exhaustive()
    }
}

impl Default for Limiter {
    fn default() -> Self {
        Self::new(None, Cluster::local("gw"))
    }
}

/// What an admission asks for besides the caller and model.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    pub model: &'a str,
    /// Prompt + the output it may produce, in tokens.
    pub estimate: u64,
    /// Its estimated KV·seconds, in MiB·s (see [`kv_mib_seconds`]).
    pub kv_mib_seconds: u64,
    pub request_id: String,
}

impl Limiter {
    /// A limiter with a requests/s bucket for all gateways together
    /// (`None`: no global limit), shared through `cluster`.
    pub fn new(global: Option<RequestRate>, cluster: Cluster) -> Self {
        Self {
            state: Arc::default(),
            global,
            cluster,
            scripts: Arc::default(),
            leased: Arc::default(),
            ladder: None,
        }
    }

    /// Tenants' requests/s scaled by `ladder`'s share for their priority.
    pub fn with_ladder(mut self, ladder: crate::ladder::Ladder) -> Self {
        self.ladder = Some(ladder);
        self
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is plain numbers, always consistent between statements.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Everything a request of `caller` takes, in the order they are checked.
    fn demands(&self, caller: &Caller, ask: &Ask<'_>) -> Vec<Demand> {
        let model = ask.model;
        let limits = caller.limits_for(model);
        let key = || (caller.api_key_id.clone(), model.to_owned());
        let mut d = Vec::with_capacity(6);
        if let Some(rpm) = limits.rpm {
            d.push(Demand {
                res: Resource::Requests(key().0, key().1),
                shape: Shape::Rate(Rate::per_minute(f64::from(rpm))),
                take: 1.0,
                message: format!(
                    "rate limit reached for requests on {model}: {rpm} per minute for this key"
                ),
            });
        }
        if let Some(tpm) = limits.tpm {
            d.push(Demand {
                res: Resource::Tokens(key().0, key().1),
                shape: Shape::Rate(Rate::per_minute(tpm as f64)),
                take: ask.estimate as f64,
                message: format!(
                    "rate limit reached for tokens on {model}: {tpm} per minute for this key, \
                     this request needs about {}",
                    ask.estimate
                ),
            });
        }
        if let Some(r) = caller.rate {
            let share = self
                .ladder
                .as_ref()
                .map_or(100, |l| l.percent(caller.priority));
            let scaled = RequestRate {
                per_second: (u64::from(r.per_second) * u64::from(share) / 100).max(1) as u32,
                burst: (u64::from(r.burst) * u64::from(share) / 100).max(1) as u32,
            };
            d.push(Demand {
                res: Resource::TenantRequests(caller.tenant_id.clone()),
                shape: Shape::Rate(Rate::requests(scaled)),
                take: 1.0,
                message: format!(
                    "rate limit reached for this tenant: {} requests per second, burst {}",
                    r.per_second, r.burst
                ),
            });
        }
        if let Some(cap) = caller.max_concurrency {
            d.push(Demand {
                res: Resource::Concurrency(caller.tenant_id.clone()),
                shape: Shape::Capacity(u64::from(cap)),
                take: 1.0,
                message: format!(
                    "too many concurrent requests: this tenant may have {cap} in flight"
                ),
            });
        }
        if let Some(cap) = caller.max_kv_mib_seconds.filter(|_| ask.kv_mib_seconds > 0) {
            d.push(Demand {
                res: Resource::KvSeconds(caller.tenant_id.clone()),
                shape: Shape::Capacity(cap),
                take: ask.kv_mib_seconds as f64,
                message: format!(
                    "too much KV cache in flight: this tenant may hold {} GiB·s at once, \
                     this request is estimated at {} MiB·s",
                    cap / 1024,
                    ask.kv_mib_seconds
                ),
            });
        }
        if let Some(r) = self.global {
            d.push(Demand {
                res: Resource::Global,
                shape: Shape::Rate(Rate::requests(r)),
                take: 1.0,
                message: format!(
                    "the gateways are at their limit of {} requests per second, burst {}",
                    r.per_second, r.burst
                ),
            });
        }
        d
    }

    /// Admits one request for `caller`, or says which limit it is over.
    /// Nothing is charged when it is rejected. In shared mode this calls
    /// Redis only when what this gateway leased does not cover it.
    pub async fn admit(&self, caller: &Caller, ask: Ask<'_>) -> Result<Permit, Rejected> {
        self.admit_at(caller, ask, None).await
    }

    /// [`Limiter::admit`] at a virtual `now` (tests), else the real one.
    async fn admit_at(
        &self,
        caller: &Caller,
        ask: Ask<'_>,
        at: Option<Instant>,
    ) -> Result<Permit, Rejected> {
        // A level at 0% (priority 1 while the pool is saturated) is refused
        // outright, rate limit or not: the other levels' shares scale a
        // tenant's requests/s, which a tenant without one does not have.
        let degraded = self
            .ladder
            .as_ref()
            .filter(|l| l.percent(caller.priority) == 0);
        if degraded.is_some() {
            return Err(Rejected {
                limit: LimitKind::Degraded,
                wait: Duration::from_secs(1),
                message: format!(
                    "the pool is saturated: priority {} is refused until it recovers",
                    caller.priority
                ),
            });
        }
        let demands = self.demands(caller, &ask);
        let mut short = None;
        for _ in 0..LEASE_TRIES {
            let now = at.unwrap_or_else(Instant::now);
            let mode = self.cluster.mode();
            let asks = {
                let mut st = self.lock();
                st.sync(mode, now);
                let admitted = match mode {
                    Mode::Local => {
                        st.admit_local(&demands, self.cluster.peers(), now)?;
                        Ok(())
                    }
                    Mode::Shared => st.admit_shared(&demands, &self.cluster, now),
                };
                match admitted {
                    Ok(()) => return Ok(self.permit(&mut st, caller, &demands, ask)),
                    Err(asks) => {
                        // Counted before the lock goes, so a concurrent
                        // admission sizes its ask knowing this one is out.
                        st.leasing += 1;
                        asks
                    }
                }
            };
            let Some(conn) = self.cluster.conn() else {
                self.lock().leasing -= 1;
                continue;
            };
            // The task ends only by landing (or with the runtime).
            let Ok(leased) = self.lease_and_land(conn, &asks, &demands).await else {
                continue;
            };
            let landed = self.leased.notified();
            tokio::pin!(landed);
            let mut settled = None;
            let (refused, others) = {
                let mut st = self.lock();
                let refused = match leased {
                    // Landed in the holdings: admitted from them next try.
                    Ok(shared::Leased::Granted(_)) => None,
                    Ok(shared::Leased::Short {
                        index,
                        wait_ms,
                        why,
                    }) => {
                        // Concurrent admissions of this gateway lease at
                        // the same time: Redis may be short because this
                        // gateway holds (or is receiving) the blocks. Try
                        // again from what it holds before refusing.
                        let shared = st.mode == Some(Mode::Shared);
                        let d = asks
                            .get(index)
                            .and_then(|(i, _)| demands.get(*i))
                            .unwrap_or(&demands[0]);
                        let wait = Duration::from_millis(wait_ms);
                        if shared && st.admit_shared(&demands, &self.cluster, now).is_ok() {
                            Some(Ok(self.permit(&mut st, caller, &demands, ask.clone())))
                        } else if why != shared::Short::Limit {
                            // Nothing another lease of this gateway brings
                            // changes this: refused now.
                            settled = Some(d.refused(why, wait));
                            None
                        } else if shared && st.covers(d) {
                            // What Redis is short of, this gateway holds;
                            // the rest (another tenant's bucket, say) was
                            // not granted with it: lease that again.
                            None
                        } else {
                            Some(Err(d.rejected(wait)))
                        }
                    }
                    // Local mode from the next try, unless this was the
                    // connection a restarted Redis dropped (tried again).
                    Err(e) => {
                        self.cluster.failed(&e);
                        None
                    }
                };
                // Other admissions of this gateway still leasing: their
                // blocks may be what Redis is short of. Listen for the
                // next one to land before the lock is let go, so its
                // wake-up cannot be missed.
                landed.as_mut().enable();
                (refused, st.leasing > 0)
            };
            if let Some(refused) = settled {
                return Err(refused);
            }
            match refused {
                Some(Ok(permit)) => return Ok(permit),
                Some(Err(refused)) if !others => return Err(refused),
                Some(Err(refused)) => {
                    // Retry from the holdings once a lease lands (bounded:
                    // a missed wake-up costs a retry, never a hang).
                    short = Some(refused);
                    let _ = tokio::time::timeout(LEASE_WAIT, landed).await;
                }
                None => {}
            }
        }
        // Leased several times and others of this gateway spent it first:
        // refused by the limit Redis last said was short.
        Err(short.unwrap_or_else(|| demands[0].rejected(Duration::from_millis(100))))
    }

    /// One lease call for `asks` (counted in `leasing` by the caller), in
    /// a task of its own that lands the grants in the holdings and stops
    /// counting the call in one critical section — so an admission that
    /// Redis found short and sees no lease out can trust that the holdings
    /// it retries from are complete — then wakes the admissions waiting
    /// for a landing. An admission dropped mid-call (its client went away)
    /// neither leaves the call counted out nor loses what Redis granted
    /// (the renewal gives it back once unused).
    fn lease_and_land(
        &self,
        mut conn: redis::aio::ConnectionManager,
        asks: &[(usize, shared::Ask)],
        demands: &[Demand],
    ) -> tokio::task::JoinHandle<Result<shared::Leased, redis::RedisError>> {
        let only: Vec<shared::Ask> = asks.iter().map(|(_, a)| a.clone()).collect();
        let targets: Vec<Demand> = asks.iter().map(|(i, _)| demands[*i].clone()).collect();
        let limiter = self.clone();
        tokio::spawn(async move {
            crate::telemetry::redis_call("lease");
            let leased = limiter
                .scripts
                .lease(&mut conn, &limiter.cluster, &only)
                .await;
            {
                let mut st = limiter.lock();
                st.leasing -= 1;
                if let Ok(reply) = &leased {
                    if reply.register {
                        // Redis does not hold this gateway's liveness: the
                        // next renewal tick registers what it holds.
                        st.register = true;
                    }
                    if let (shared::Leased::Granted(grants), Some(Mode::Shared)) =
                        (&reply.leased, st.mode)
                    {
                        let now = Instant::now();
                        for (d, &(granted, left)) in targets.iter().zip(grants) {
                            st.add_lease(d, granted, left, now);
                        }
                    }
                }
            }
            limiter.leased.notify_waiters();
            leased.map(|reply| reply.leased)
        })
    }

    fn permit(&self, st: &mut State, caller: &Caller, demands: &[Demand], ask: Ask<'_>) -> Permit {
        let id = st.next_id;
        st.next_id += 1;
        st.in_flight.insert(
            id,
            InFlight {
                tenant: caller.tenant_id.clone(),
                request_id: ask.request_id,
                kv_mib_seconds: ask.kv_mib_seconds,
                started_unix_ms: chrono::Utc::now().timestamp_millis(),
            },
        );
        let n = st
            .tenant_in_flight
            .entry(caller.tenant_id.clone())
            .or_default();
        *n += 1;
        crate::telemetry::active_requests(&caller.tenant_id, *n);
        let tokens = demands
            .iter()
            .find(|d| matches!(d.res, Resource::Tokens(..)));
        Permit {
            limiter: self.clone(),
            id,
            tokens: tokens.map(|d| d.res.clone()),
            charged: tokens.map_or(0, |d| d.take as u64),
            held: demands
                .iter()
                .filter(|d| matches!(d.shape, Shape::Capacity(_)))
                .map(|d| (d.res.clone(), d.take as u64))
                .collect(),
            tenant: caller.tenant_id.clone(),
            settled: false,
        }
    }

    /// The current figures for `caller` on `model` (buckets not yet used are full).
    pub fn status(&self, caller: &Caller, model: &str, now: Instant) -> RateStatus {
        let limits = caller.limits_for(model);
        let mut st = self.lock();
        let peers = self.cluster.peers();
        let shared = st.mode == Some(Mode::Shared);
        let mut window = |rate: Option<Rate>, res: Resource| {
            let rate = rate?;
            if shared {
                let held = st.holdings.get(&res).map_or(0.0, |h| h.units).max(0.0);
                let left = st.left.get(&res).map_or(rate.capacity, |l| *l as f64);
                let remaining = (held + left).min(rate.capacity);
                let mut b = Bucket::full(rate, now);
                b.level = remaining;
                return Some(b.window(rate));
            }
            let rate = rate.share(peers);
            let b = st.buckets.get_mut(&res).map_or_else(
                || Bucket::full(rate, now),
                |b| {
                    b.refill(rate, now);
                    *b
                },
            );
            Some(b.window(rate))
        };
        let requests = window(
            limits.rpm.map(|r| Rate::per_minute(f64::from(r))),
            Resource::Requests(caller.api_key_id.clone(), model.to_owned()),
        );
        let tokens = window(
            limits.tpm.map(|t| Rate::per_minute(t as f64)),
            Resource::Tokens(caller.api_key_id.clone(), model.to_owned()),
        );
        RateStatus { requests, tokens }
    }

    /// Requests in flight for `tenant` on this gateway.
    pub fn in_flight(&self, tenant: &str) -> u32 {
        self.lock()
            .tenant_in_flight
            .get(tenant)
            .copied()
            .unwrap_or(0)
    }

    /// Keeps what this gateway holds in Redis current, forever: every
    /// second it gives back leased units unused for a second; every 5 s
    /// (every second while Redis is unreachable) the heartbeat, the
    /// renewal of its capacity units and its lease records.
    pub fn spawn_renewal(&self) -> tokio::task::JoinHandle<()> {
        let limiter = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::cluster::RETRY_EVERY);
            let per_renewal = (crate::cluster::RENEW_EVERY.as_secs()
                / crate::cluster::RETRY_EVERY.as_secs())
            .max(1);
            let mut n: u64 = 0;
            loop {
                tick.tick().await;
                limiter.renew(n % per_renewal == 0).await;
                n += 1;
            }
        })
    }

    /// One round of [`Limiter::spawn_renewal`]; `full` also renews. A
    /// registration pending (a lease found this gateway's liveness gone)
    /// runs with the heartbeat that makes it count.
    pub async fn renew(&self, full: bool) {
        let cluster = &self.cluster;
        let pending = self.lock().register;
        if cluster.mode() == Mode::Local || full || pending {
            match cluster.heartbeat().await {
                Ok(lost) => {
                    if lost {
                        self.lock().register = true;
                    }
                }
                Err(e) => {
                    cluster.unreachable(&e);
                    return;
                }
            }
        }
        let Some(mut conn) = cluster.conn() else {
            return;
        };
        let now = Instant::now();
        let peers = cluster.peers();
        let (returns, capacities, register, leases) = {
            let mut st = self.lock();
            st.sync(Mode::Shared, now);
            let mut returns = Vec::new();
            let used: HashMap<Resource, u64> = st.in_use.clone();
            for (res, h) in st.holdings.iter_mut() {
                let idle = now.saturating_duration_since(h.touched) >= GIVE_BACK_AFTER;
                // Of a rate, what is unspent after a second; of a capacity,
                // down to one block beyond what its requests use once it
                // holds two blocks more (all of it after a second unused):
                // a busy gateway never sits on the cap, nor calls Redis for
                // every request that ends.
                let keep = match h.shape {
                    Shape::Rate(_) if !idle => continue,
                    Shape::Rate(_) => 0.0,
                    Shape::Capacity(_) => {
                        let in_use = used.get(res).copied().unwrap_or(0);
                        let block = h.shape.block(peers);
                        if idle {
                            in_use as f64
                        } else if h.units > (in_use + 2 * block) as f64 {
                            (in_use + block) as f64
                        } else {
                            continue;
                        }
                    }
                };
                let spare = (h.units - keep).floor();
                if spare >= 1.0 {
                    h.units -= spare;
                    returns.push((
                        cluster.key(&res.redis_name()),
                        h.shape.redis(),
                        spare as u64,
                    ));
                }
            }
            let register = std::mem::take(&mut st.register);
            let capacities: Vec<(String, u64)> = if full || register {
                st.holdings
                    .iter()
                    .filter(|(_, h)| matches!(h.shape, Shape::Capacity(_)))
                    .map(|(r, h)| (cluster.key(&r.redis_name()), h.units.max(0.0) as u64))
                    .collect()
            } else {
                Vec::new()
            };
            let leases = if full || register {
                lease_records(&st, cluster)
            } else {
                Vec::new()
            };
            (returns, capacities, register, leases)
        };
        if !returns.is_empty() {
            crate::telemetry::redis_call("give_back");
            if let Err(e) = self
                .scripts
                .give_back(&mut conn, cluster.holder(), &returns)
                .await
            {
                // Redis may not have taken them back: what this gateway
                // holds is set again at the next renewal.
                self.lock().register = true;
                cluster.failed(&e);
                return;
            }
        }
        if !capacities.is_empty() || !leases.is_empty() {
            crate::telemetry::redis_call("renew");
            let pipe = shared::renewal(cluster.holder(), &capacities, register, &leases);
            if let Err(e) = pipe.query_async::<()>(&mut conn).await {
                if register {
                    self.lock().register = true;
                }
                cluster.failed(&e);
            }
        }
    }
}

impl Limiter {
    /// On shutdown, after the last request: gives back everything this
    /// gateway holds and leaves the cluster, so the others have it at once
    /// rather than after 15 s.
    pub async fn release(&self) {
        let Some(mut conn) = self.cluster.conn() else {
            return;
        };
        let returns: Vec<(String, shared::Kind, u64)> = {
            let mut st = self.lock();
            let used = st.in_use.clone();
            st.holdings
                .drain()
                .filter_map(|(res, h)| {
                    let keep = used.get(&res).copied().unwrap_or(0) as f64;
                    let spare = (h.units - keep).floor();
                    (spare >= 1.0).then(|| {
                        (
                            self.cluster.key(&res.redis_name()),
                            h.shape.redis(),
                            spare as u64,
                        )
                    })
                })
                .collect()
        };
        crate::telemetry::redis_call("give_back");
        if let Err(e) = self
            .scripts
            .give_back(&mut conn, self.cluster.holder(), &returns)
            .await
        {
            tracing::warn!(error = %e, "could not give back leased limits on shutdown");
        }
        self.cluster.leave().await;
    }
}

/// Per tenant, this gateway's lease records: request id → estimated
/// KV·s, start and gateway.
fn lease_records(st: &State, cluster: &Cluster) -> Vec<(String, Vec<(String, String)>)> {
    let mut by_tenant: HashMap<&str, Vec<(String, String)>> = HashMap::new();
    for f in st.in_flight.values() {
        let value = serde_json::json!({
            "kv_mib_seconds": f.kv_mib_seconds,
            "started_unix_ms": f.started_unix_ms,
            "gateway": cluster.gateway_id(),
        });
        by_tenant
            .entry(f.tenant.as_str())
            .or_default()
            .push((f.request_id.clone(), value.to_string()));
    }
    // Tenants whose requests all ended get an empty list (deleted).
    for res in st.in_use.keys() {
        if let Resource::Concurrency(t) = res {
            by_tenant.entry(t.as_str()).or_default();
        }
    }
    by_tenant
        .into_iter()
        .map(|(t, entries)| {
            (
                cluster.key(&format!("leases:{t}:{}", cluster.gateway_id())),
                entries,
            )
        })
        .collect()
}

/// An admitted request's hold on its limits: releases its capacity (the
/// concurrency slot, its KV·seconds) when dropped; [`Permit::settle`]
/// reconciles the token estimate.
#[derive(Debug)]
pub struct Permit {
    limiter: Limiter,
    id: u64,
    tenant: String,
    tokens: Option<Resource>,
    charged: u64,
    held: Vec<(Resource, u64)>,
    settled: bool,
}

impl Permit {
    /// Replaces the estimate charged at admission with the tokens actually
    /// used (prompt + completion): the difference is refunded at once (or,
    /// if it used more, charged) to what this gateway holds. Only the
    /// first call counts.
    pub fn settle(&mut self, actual: u64, now: Instant) {
        if self.settled {
            return;
        }
        self.settled = true;
        let Some(res) = &self.tokens else { return };
        let diff = self.charged as f64 - actual as f64;
        let mut st = self.limiter.lock();
        match st.mode {
            Some(Mode::Shared) => {
                if let Some(h) = st.holdings.get_mut(res) {
                    h.units += diff;
                    h.touched = now;
                }
            }
            _ => {
                if let Some(b) = st.buckets.get_mut(res) {
                    b.level += diff;
                }
            }
        }
    }

    /// The tokens charged at admission.
    pub fn charged(&self) -> u64 {
        self.charged
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut st = self.limiter.lock();
        for (res, units) in &self.held {
            if let Some(n) = st.in_use.get_mut(res) {
                *n = n.saturating_sub(*units);
                if *n == 0 {
                    st.in_use.remove(res);
                    st.capacity_shapes.remove(res);
                }
            }
        }
        st.in_flight.remove(&self.id);
        let n = match st.tenant_in_flight.get_mut(&self.tenant) {
            Some(n) => {
                *n = n.saturating_sub(1);
                *n
            }
            None => 0,
        };
        if n == 0 {
            st.tenant_in_flight.remove(&self.tenant);
        }
        crate::telemetry::active_requests(&self.tenant, n);
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

/// A duration as OpenAI writes it in `x-ratelimit-reset-*`: `20ms`, `1s`,
/// `6m0s`, `1h2m3s` (seconds rounded up).
pub fn format_reset(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        let ms = d.as_millis() + u128::from(d.subsec_nanos() % 1_000_000 != 0);
        return if ms >= 1000 {
            "1s".to_owned()
        } else {
            format!("{ms}ms")
        };
    }
    let secs = d.as_secs() + u64::from(d.subsec_nanos() != 0);
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// Sets the `x-ratelimit-*` headers a limit applies to.
pub fn apply_headers(headers: &mut HeaderMap, status: &RateStatus) {
    for (suffix, window) in [("requests", status.requests), ("tokens", status.tokens)] {
        let Some(w) = window else { continue };
        for (name, value) in [
            (format!("x-ratelimit-limit-{suffix}"), w.limit.to_string()),
            (
                format!("x-ratelimit-remaining-{suffix}"),
                w.remaining.to_string(),
            ),
            (format!("x-ratelimit-reset-{suffix}"), format_reset(w.reset)),
        ] {
            if let (Ok(n), Ok(v)) = (
                HeaderName::try_from(name),
                HeaderValue::try_from(value.as_str()),
            ) {
                headers.insert(n, v);
            }
        }
    }
}

/// How long a refused client is told to wait before retrying, to the
/// millisecond: sent as `retry-after-ms` (exact; the OpenAI SDK reads it)
/// and as `Retry-After` in whole seconds rounded up (RFC 9110). Jittered, so
/// refused clients do not come back in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryAfter {
    pub millis: u64,
}

/// A 503 for capacity waits 5 s plus up to 5 s more.
const NO_CAPACITY_WAIT_MS: u64 = 5_000;
const NO_CAPACITY_JITTER_MS: u64 = 5_000;
/// A 429 waits for its limit, plus up to 2 s more.
const RATE_LIMITED_JITTER_MS: u64 = 2_000;

impl RetryAfter {
    /// After a 503 for capacity: uniform in [5 s, 10 s].
    pub fn no_capacity() -> Self {
        Self {
            millis: NO_CAPACITY_WAIT_MS + rand::random_range(0..=NO_CAPACITY_JITTER_MS),
        }
    }

    /// After a 429: the limit's own `wait` (rounded up to the millisecond)
    /// plus uniform jitter in [0, 2 s].
    pub fn rate_limited(wait: Duration) -> Self {
        let wait_ms = u64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        Self {
            millis: wait_ms.saturating_add(rand::random_range(0..=RATE_LIMITED_JITTER_MS)),
        }
    }

    /// `Retry-After`: whole seconds, rounded up, at least 1.
    pub fn secs(self) -> u64 {
        self.millis.div_ceil(1_000).max(1)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;
    use crate::caller::ModelLimits;

    async fn admit(
        l: &Limiter,
        c: &Caller,
        model: &str,
        estimate: u64,
        now: Instant,
    ) -> Result<Permit, Rejected> {
        let ask = Ask {
            model,
            estimate,
            kv_mib_seconds: 0,
            request_id: "req".into(),
        };
        l.admit_at(c, ask, Some(now)).await
    }

    fn caller(rpm: Option<u32>, tpm: Option<u64>, conc: Option<u32>) -> Caller {
        let limits = ModelLimits {
            rpm,
            tpm,
            max_context: None,
            max_output: None,
        };
        Caller {
            tenant_id: "t".into(),
            api_key_id: "k".into(),
            priority: 3,
            weight: 1,
            max_concurrency: conc,
            max_kv_mib_seconds: None,
            slo: Default::default(),
            rate: None,
            limits: Arc::new(HashMap::from([("*".to_owned(), limits)])),
        }
    }

    #[tokio::test]
    async fn a_saturated_pool_refuses_priority_1_with_or_without_a_rate_limit() {
        let ladder = crate::ladder::Ladder::new();
        let l = Limiter::default().with_ladder(ladder.clone());
        let low = |rate: Option<RequestRate>| Caller {
            priority: 1,
            rate,
            ..caller(None, None, None)
        };
        let limited = low(Some(RequestRate {
            per_second: 100,
            burst: 10,
        }));
        let t0 = Instant::now();
        drop(admit(&l, &low(None), "m", 10, t0).await.unwrap());
        // Requests waiting at one look: not yet (a moment's wait is not
        // saturation); still as many at the next: saturated.
        let windows = fleet::slo::Windows::default();
        ladder.evaluate(&[("m".into(), 3)], &windows, t0);
        assert_eq!(ladder.percent(1), 100, "one look is not enough");
        ladder.evaluate(&[("m".into(), 3)], &windows, t0);
        assert_eq!(ladder.percent(1), 0);
        for c in [low(None), limited] {
            let r = admit(&l, &c, "m", 10, t0).await.unwrap_err();
            assert_eq!(r.limit, LimitKind::Degraded, "{:?}", c.rate);
        }
        // Priority 3 without a rate limit is not slowed (nothing to scale).
        assert!(admit(&l, &caller(None, None, None), "m", 10, t0)
            .await
            .is_ok());
        // The queue empties: priority 1 is back.
        ladder.evaluate(&[("m".into(), 0)], &windows, t0);
        drop(admit(&l, &low(None), "m", 10, t0).await.unwrap());
    }

    #[tokio::test]
    async fn requests_per_minute_trip_and_refill() {
        let l = Limiter::default();
        let c = caller(Some(3), None, None);
        let t0 = Instant::now();
        for _ in 0..3 {
            drop(admit(&l, &c, "m", 10, t0).await.unwrap());
        }
        let r = admit(&l, &c, "m", 10, t0).await.unwrap_err();
        assert_eq!(r.limit, LimitKind::Requests);
        assert_eq!(r.wait, Duration::from_secs(20));
        // 20 s later one request token is back.
        assert!(admit(&l, &c, "m", 10, t0 + Duration::from_secs(20))
            .await
            .is_ok());
        // Another model has its own bucket.
        assert!(admit(&l, &c, "other", 10, t0).await.is_ok());
    }

    #[tokio::test]
    async fn tokens_are_refunded_at_settle() {
        let l = Limiter::default();
        let c = caller(None, Some(1000), None);
        let t0 = Instant::now();
        let mut p = admit(&l, &c, "m", 800, t0).await.unwrap();
        assert_eq!(l.status(&c, "m", t0).tokens.unwrap().remaining, 200);
        let r = admit(&l, &c, "m", 300, t0).await.unwrap_err();
        assert_eq!(r.limit, LimitKind::Tokens);
        p.settle(100, t0);
        p.settle(0, t0);
        assert_eq!(l.status(&c, "m", t0).tokens.unwrap().remaining, 900);
        assert!(admit(&l, &c, "m", 300, t0).await.is_ok());
    }

    #[tokio::test]
    async fn an_estimate_above_a_minute_waits_for_a_full_bucket() {
        let l = Limiter::default();
        let c = caller(None, Some(100), None);
        let t0 = Instant::now();
        let mut p = admit(&l, &c, "m", 250, t0).await.unwrap();
        p.settle(250, t0);
        let r = admit(&l, &c, "m", 250, t0).await.unwrap_err();
        // From -150 back to a full 100 takes 250/100 of a minute.
        assert_eq!(r.wait, Duration::from_secs(150));
        assert!(admit(&l, &c, "m", 250, t0 + Duration::from_secs(150))
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn concurrency_slot_is_released_on_drop() {
        let l = Limiter::default();
        let c = caller(None, None, Some(2));
        let t0 = Instant::now();
        let a = admit(&l, &c, "m", 1, t0).await.unwrap();
        let _b = admit(&l, &c, "x", 1, t0).await.unwrap();
        assert_eq!(
            admit(&l, &c, "m", 1, t0).await.unwrap_err().limit,
            LimitKind::Concurrency
        );
        drop(a);
        assert_eq!(l.in_flight("t"), 1);
        assert!(admit(&l, &c, "m", 1, t0).await.is_ok());
    }

    #[tokio::test]
    async fn rejection_charges_nothing() {
        let l = Limiter::default();
        let c = caller(Some(10), Some(100), Some(1));
        let t0 = Instant::now();
        let _held = admit(&l, &c, "m", 10, t0).await.unwrap();
        assert!(admit(&l, &c, "m", 10, t0).await.is_err());
        let s = l.status(&c, "m", t0);
        assert_eq!(s.requests.unwrap().remaining, 9);
        assert_eq!(s.tokens.unwrap().remaining, 90);
    }

    #[test]
    fn reset_durations_read_like_openai() {
        assert_eq!(format_reset(Duration::from_millis(20)), "20ms");
        assert_eq!(format_reset(Duration::from_secs(1)), "1s");
        assert_eq!(format_reset(Duration::from_millis(1500)), "2s");
        assert_eq!(format_reset(Duration::from_secs(360)), "6m0s");
        assert_eq!(format_reset(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(format_reset(Duration::ZERO), "0ms");
    }

    #[test]
    fn retry_after_is_jittered_and_at_least_the_wait() {
        let limited: Vec<RetryAfter> = (0..500)
            .map(|_| RetryAfter::rate_limited(Duration::from_micros(1_500_100)))
            .collect();
        // The limit's own wait, rounded up to the millisecond, plus [0, 2 s].
        assert!(
            limited.iter().all(|r| (1_501..=3_501).contains(&r.millis)),
            "{limited:?}"
        );
        assert!(limited.iter().all(|r| r.secs() == r.millis.div_ceil(1_000)));
        let capacity: Vec<RetryAfter> = (0..500).map(|_| RetryAfter::no_capacity()).collect();
        assert!(
            capacity
                .iter()
                .all(|r| (5_000..=10_000).contains(&r.millis)),
            "{capacity:?}"
        );
        let distinct: std::collections::HashSet<u64> = capacity.iter().map(|r| r.millis).collect();
        assert!(
            distinct.len() > 100,
            "jittered, not a constant: {}",
            distinct.len()
        );
        // Spread over the whole window, not bunched at one end.
        assert!(
            capacity.iter().any(|r| r.millis < 6_000) && capacity.iter().any(|r| r.millis > 9_000)
        );
        assert_eq!(RetryAfter { millis: 0 }.secs(), 1, "never Retry-After: 0");
    }

    #[tokio::test]
    async fn tenant_rate_and_global_rate_are_buckets_with_bursts() {
        let now = Instant::now();
        let mut a = caller(None, None, None);
        a.rate = Some(RequestRate {
            per_second: 2,
            burst: 2,
        });
        let l = Limiter::default();
        let _p1 = admit(&l, &a, "m", 1, now).await.unwrap();
        let _p2 = admit(&l, &a, "m", 1, now).await.unwrap();
        let r = admit(&l, &a, "m", 1, now).await.unwrap_err();
        assert_eq!(r.limit, LimitKind::TenantRequests);
        assert_eq!(r.wait, Duration::from_millis(500));
        assert!(admit(&l, &a, "m", 1, now + Duration::from_millis(500))
            .await
            .is_ok());

        // The global bucket sits above every tenant; a request it turns
        // away is not charged to its tenant's bucket.
        let g = Limiter::new(
            Some(RequestRate {
                per_second: 2,
                burst: 1,
            }),
            Cluster::local("gw"),
        );
        let mut b = caller(None, None, None);
        b.tenant_id = "other".into();
        b.rate = Some(RequestRate {
            per_second: 1,
            burst: 1,
        });
        let _first = admit(&g, &a, "m", 1, now).await.unwrap();
        let r = admit(&g, &b, "m", 1, now).await.unwrap_err();
        assert_eq!(r.limit, LimitKind::GlobalRequests);
        assert_eq!(r.wait, Duration::from_millis(500));
        // Had the rejection taken b's one request, b's bucket (1/s) would
        // hold only half a request now.
        assert!(admit(&g, &b, "m", 1, now + Duration::from_millis(500))
            .await
            .is_ok());
    }
}
