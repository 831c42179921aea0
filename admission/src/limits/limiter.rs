//! The limiter: one admission checks and charges every limit a request
//! needs at once, locally or by leasing from Redis, or charges none; the
//! [`Permit`] it hands out releases what the request holds when dropped.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::bucket::{Bucket, Rate};
use super::demand::*;
use super::kinds::*;
use super::leases::*;
use super::shared;
use super::RequestRate;
use crate::caller::Caller;
use crate::cluster::{Cluster, Mode};

/// How many times an admission may lease before it gives up (other
/// requests of this gateway spent what it leased in between). With 4, a
/// starved machine (three busy loops beside the test on 2 cores) refused
/// one of `shared_limits`' concurrent admissions for global tokens its own
/// gateway held in 1 of 25 runs (60 rounds each); with 8, in none of 65.
pub(super) const LEASE_TRIES: usize = 8;
/// The longest an admission Redis found short waits for this gateway's
/// other leases in flight to land before it retries.
pub(super) const LEASE_WAIT: Duration = Duration::from_millis(250);
/// Leased units unused this long are given back.
pub(super) const GIVE_BACK_AFTER: Duration = Duration::from_secs(1);

/// The limiter; cheap to clone.
#[derive(Clone)]
pub struct Limiter {
    pub(super) state: Arc<Mutex<State>>,
    pub(super) global: Option<RequestRate>,
    pub(super) cluster: Cluster,
    pub(super) scripts: Arc<shared::Scripts>,
    /// Woken each time a lease call of this gateway lands.
    pub(super) leased: Arc<tokio::sync::Notify>,
    /// Each priority's share of its requests/s (the fairness layer).
    pub(super) ladder: Option<crate::ladder::Ladder>,
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

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is plain numbers, always consistent between statements.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Everything a request of `caller` takes, in the order they are checked.
    pub(super) fn demands(&self, caller: &Caller, ask: &Ask<'_>) -> Vec<Demand> {
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
                .map_or(100, |l| l.percent(ask.model, caller.priority));
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
    pub(super) async fn admit_at(
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
            .filter(|l| l.percent(ask.model, caller.priority) == 0);
        if degraded.is_some() {
            return Err(Rejected {
                limit: LimitKind::Degraded,
                wait: Duration::from_secs(1),
                message: format!(
                    "the {} pool is saturated: priority {} is refused on it until it recovers",
                    ask.model, caller.priority
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
                        st.admit_local(
                            &demands,
                            self.cluster.peers(),
                            self.cluster.closed_peers(),
                            now,
                        )?;
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
    pub(super) fn lease_and_land(
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

    pub(super) fn permit(
        &self,
        st: &mut State,
        caller: &Caller,
        demands: &[Demand],
        ask: Ask<'_>,
    ) -> Permit {
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
}

/// An admitted request's hold on its limits: releases its capacity (the
/// concurrency slot, its KV·seconds) when dropped; [`Permit::settle`]
/// reconciles the token estimate.
#[derive(Debug)]
pub struct Permit {
    pub(super) limiter: Limiter,
    pub(super) id: u64,
    pub(super) tenant: String,
    pub(super) tokens: Option<Resource>,
    pub(super) charged: u64,
    pub(super) held: Vec<(Resource, u64)>,
    pub(super) settled: bool,
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
