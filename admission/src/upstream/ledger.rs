//! GPU time for an upstream that reports none (vLLM and other
//! OpenAI-compatible servers): each request's share of the replica's wall
//! time, weighted by its share of the replica's in-flight tokens (prompt
//! plus tokens produced so far, the KV it holds), times the replica's GPU
//! count.
//!
//! A replica is busy while at least one request is in flight. Over every
//! interval between two changes (a request joins, produces a token, or
//! leaves), the interval × GPUs is owed by the requests in flight in
//! proportion to their weights. Instead of splitting every interval among
//! every member (O(in-flight) per token), the ledger keeps one running
//! integral — GPU-µs per unit of weight, in fixed point — and a member
//! settles against it when its weight changes or it leaves, so each
//! operation is O(1).
//!
//! Exactness: shares are handed out in integer micro-GPU-seconds, each
//! rounded to the nearest micro with the rounding carried forward to the
//! next share (error diffusion), and the request that ends a busy period
//! takes whatever is left of it, so over every busy period the shares add
//! up to busy µs × GPUs exactly.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Fixed-point scale of the per-weight integral: 10^15 units per GPU-µs,
/// so the rounding of one interval is far below a micro-GPU-second even
/// with millions of tokens in flight.
const SCALE: u128 = 1_000_000_000_000_000;

/// The running attribution of one upstream replica.
#[derive(Debug)]
pub struct Ledger {
    gpus: u64,
    origin: Instant,
    inner: Mutex<Inner>,
    busy_gpu_micros: AtomicU64,
    attributed_gpu_micros: AtomicU64,
}

#[derive(Debug, Default)]
struct Inner {
    /// When the current interval began (µs since `origin`).
    last: u64,
    /// Sum of the members' weights.
    weight: u64,
    /// GPU-µs per unit of weight since the busy period began, × SCALE.
    per_weight: u128,
    members: HashMap<u64, Member>,
    next_id: u64,
    /// GPU-µs of the current busy period, and how much was handed out.
    period_total: u64,
    period_given: u64,
    /// What rounding handed out too much (< 0) or too little (> 0) so far
    /// in this busy period, × SCALE.
    carry: i128,
}

#[derive(Debug)]
struct Member {
    weight: u64,
    /// `per_weight` when this member last settled.
    snap: u128,
    /// What it owes so far, × SCALE.
    owed: u128,
}

impl Inner {
    /// Lets time run to `now`, charging the interval to whoever is in flight.
    fn advance(&mut self, now: u64, gpus: u64, busy: &AtomicU64) {
        if now <= self.last {
            return;
        }
        let gpu_micros = (now - self.last) * gpus;
        self.last = now;
        if self.weight == 0 {
            return;
        }
        self.per_weight += u128::from(gpu_micros) * SCALE / u128::from(self.weight);
        self.period_total += gpu_micros;
        busy.fetch_add(gpu_micros, Ordering::Relaxed);
    }

    fn settle(&mut self, id: u64) -> Option<&mut Member> {
        let per_weight = self.per_weight;
        let m = self.members.get_mut(&id)?;
        m.owed += u128::from(m.weight) * (per_weight - m.snap);
        m.snap = per_weight;
        Some(m)
    }
}

impl Ledger {
    pub fn new(gpus: u32) -> Self {
        Self {
            gpus: u64::from(gpus.max(1)),
            origin: Instant::now(),
            inner: Mutex::new(Inner::default()),
            busy_gpu_micros: AtomicU64::new(0),
            attributed_gpu_micros: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent integers behind.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Time run to now: (µs since the ledger began, busy µs × GPUs in
    /// them), for the replica's reports (idle = the rest of µs × GPUs).
    pub fn elapsed_and_busy(&self) -> (u64, u64) {
        let now = self.now();
        let mut inner = self.lock();
        inner.advance(now, self.gpus, &self.busy_gpu_micros);
        (now, self.busy_gpu_micros())
    }

    /// Busy µs × GPUs so far (every interval with a request in flight).
    pub fn busy_gpu_micros(&self) -> u64 {
        self.busy_gpu_micros.load(Ordering::Relaxed)
    }

    /// What has been handed to requests that left. Equals
    /// [`Ledger::busy_gpu_micros`] whenever nothing is in flight.
    pub fn attributed_gpu_micros(&self) -> u64 {
        self.attributed_gpu_micros.load(Ordering::Relaxed)
    }

    pub fn in_flight(&self) -> usize {
        self.lock().members.len()
    }

    /// A request starts holding `weight` tokens (at least 1) at `now` µs.
    pub fn join_at(&self, weight: u64, now: u64) -> u64 {
        let mut inner = self.lock();
        inner.advance(now, self.gpus, &self.busy_gpu_micros);
        let id = inner.next_id;
        inner.next_id += 1;
        let weight = weight.max(1);
        inner.weight += weight;
        let snap = inner.per_weight;
        inner.members.insert(
            id,
            Member {
                weight,
                snap,
                owed: 0,
            },
        );
        id
    }

    /// The request's in-flight tokens grew by `tokens` at `now` µs.
    pub fn grow_at(&self, id: u64, tokens: u64, now: u64) {
        let mut inner = self.lock();
        inner.advance(now, self.gpus, &self.busy_gpu_micros);
        if let Some(m) = inner.settle(id) {
            m.weight += tokens;
            inner.weight += tokens;
        }
    }

    /// The request leaves at `now` µs; returns its micro-GPU-seconds.
    pub fn leave_at(&self, id: u64, now: u64) -> u64 {
        let mut inner = self.lock();
        inner.advance(now, self.gpus, &self.busy_gpu_micros);
        let Some(owed) = inner.settle(id).map(|m| m.owed) else {
            return 0;
        };
        if let Some(m) = inner.members.remove(&id) {
            inner.weight -= m.weight;
        }
        // Rounded to the nearest micro, the rounding carried to the next one.
        let scale = SCALE as i128;
        let scaled = owed as i128 + inner.carry;
        let rounded = (scaled + scale / 2).div_euclid(scale).max(0);
        inner.carry = scaled - rounded * scale;
        let mut micros = u64::try_from(rounded).unwrap_or(u64::MAX);
        if inner.members.is_empty() {
            // The busy period is over: the last one out takes what the
            // roundings left, so the period adds up exactly.
            micros = inner.period_total - inner.period_given;
            inner.per_weight = 0;
            inner.period_total = 0;
            inner.period_given = 0;
            inner.carry = 0;
        } else {
            micros = micros.min(inner.period_total - inner.period_given);
            inner.period_given += micros;
        }
        self.attributed_gpu_micros
            .fetch_add(micros, Ordering::Relaxed);
        micros
    }

    /// Starts a request now; see [`Share`].
    pub fn join(self: &Arc<Self>, weight: u64) -> Share {
        let id = self.join_at(weight, self.now());
        Share {
            ledger: self.clone(),
            id: Some(id),
        }
    }
}

/// One request's place in a [`Ledger`]. Dropping it unfinished leaves the
/// ledger (its GPU time then goes to whoever ends the busy period, so the
/// replica still adds up).
#[derive(Debug)]
pub struct Share {
    ledger: Arc<Ledger>,
    id: Option<u64>,
}

impl Share {
    pub fn grow(&self, tokens: u64) {
        if let Some(id) = self.id {
            self.ledger.grow_at(id, tokens, self.ledger.now());
        }
    }

    /// Leaves the ledger; the request's micro-GPU-seconds.
    pub fn finish(mut self) -> u64 {
        self.id
            .take()
            .map_or(0, |id| self.ledger.leave_at(id, self.ledger.now()))
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.ledger.leave_at(id, self.ledger.now());
        }
    }
}

/// The same attribution kept for every gateway in front of a replica
/// (several gateways, one replica: each gateway's own [`Ledger`] would
/// charge the replica's whole busy time to its own requests). The gateway
/// implements it on its shared store; `None` from a call means the store
/// is unreachable, and the request falls back to this gateway's [`Ledger`].
///
/// Weights change in batches ([`SHARED_GROW_EVERY`] tokens), so the split
/// between requests is approximate by at most a batch; the sum over a busy
/// period is exact, as in [`Ledger`].
pub trait SharedLedger: Send + Sync + std::fmt::Debug {
    /// A request of `weight` tokens starts on `replica` (of `gpus` GPUs); its id there.
    fn join<'a>(
        &'a self,
        replica: &'a str,
        gpus: u32,
        weight: u64,
    ) -> futures_util::future::BoxFuture<'a, Option<u64>>;
    /// The request's in-flight tokens grew by `tokens`.
    fn grow<'a>(
        &'a self,
        replica: &'a str,
        gpus: u32,
        id: u64,
        tokens: u64,
    ) -> futures_util::future::BoxFuture<'a, Option<()>>;
    /// The request leaves; its micro-GPU-seconds. `lent`: it ran on a
    /// replica dedicated to another tenant (its share is counted as lent
    /// too, for the owner's reserved line).
    fn leave<'a>(
        &'a self,
        replica: &'a str,
        gpus: u32,
        id: u64,
        lent: bool,
    ) -> futures_util::future::BoxFuture<'a, Option<u64>>;
    /// The request leaves without a usage event (the upstream refused it):
    /// its share is kept apart from what was handed to billed requests.
    fn refused<'a>(
        &'a self,
        replica: &'a str,
        gpus: u32,
        id: u64,
    ) -> futures_util::future::BoxFuture<'a, Option<()>>;
}

/// Tokens a request's weight grows by locally before the shared ledger hears of it.
pub const SHARED_GROW_EVERY: u64 = 32;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn two_equal_requests_split_the_time_equally() {
        let l = Ledger::new(4);
        let a = l.join_at(100, 0);
        let b = l.join_at(100, 0);
        let sa = l.leave_at(a, 1_000);
        let sb = l.leave_at(b, 1_000);
        assert_eq!((sa, sb), (2_000, 2_000));
        assert_eq!(l.busy_gpu_micros(), 4_000);
    }

    #[test]
    fn weights_follow_in_flight_tokens() {
        let l = Ledger::new(1);
        let small = l.join_at(1_000, 0);
        let big = l.join_at(3_000, 0);
        // 0..1000 µs: 1:3; then `small` grows to 3,000 tokens: 1:1.
        l.grow_at(small, 2_000, 1_000);
        let s = l.leave_at(small, 2_000);
        let b = l.leave_at(big, 2_000);
        assert_eq!((s, b), (250 + 500, 750 + 500));
    }

    #[test]
    fn idle_time_is_nobodys() {
        let l = Ledger::new(2);
        let a = l.join_at(10, 100);
        assert_eq!(l.leave_at(a, 300), 400);
        let b = l.join_at(10, 10_000);
        assert_eq!(l.leave_at(b, 10_050), 100);
        assert_eq!(l.busy_gpu_micros(), 500);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Join(u64),
        Grow(usize, u64),
        Leave(usize),
    }

    fn op() -> impl Strategy<Value = (u64, Op)> {
        let step = 0u64..5_000;
        prop_oneof![
            (step.clone(), 1u64..200_000).prop_map(|(t, w)| (t, Op::Join(w))),
            (step.clone(), 0usize..64, 1u64..40).prop_map(|(t, i, n)| (t, Op::Grow(i, n))),
            (step, 0usize..64).prop_map(|(t, i)| (t, Op::Leave(i))),
        ]
    }

    proptest! {
        /// Whatever the arrivals, growth and departures, the shares handed
        /// out add up to the busy GPU time exactly once nothing is in flight.
        #[test]
        fn shares_add_up_to_busy_time(gpus in 1u32..9, ops in proptest::collection::vec(op(), 1..300)) {
            let l = Ledger::new(gpus);
            let mut now = 0u64;
            let mut live: Vec<u64> = Vec::new();
            let mut given = 0u64;
            for (dt, op) in ops {
                now += dt;
                match op {
                    Op::Join(w) => live.push(l.join_at(w, now)),
                    Op::Grow(i, n) if !live.is_empty() => l.grow_at(live[i % live.len()], n, now),
                    Op::Leave(i) if !live.is_empty() => {
                        let id = live.swap_remove(i % live.len());
                        given += l.leave_at(id, now);
                    }
                    _ => {}
                }
            }
            for id in live.drain(..) {
                now += 7;
                given += l.leave_at(id, now);
            }
            prop_assert_eq!(given, l.busy_gpu_micros());
            prop_assert_eq!(l.attributed_gpu_micros(), l.busy_gpu_micros());
        }
    }
}
