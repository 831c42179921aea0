//! The queue of one model pool: strict priority levels, and within a level
//! weighted fair sharing by tenant weight of the GPU time really used.
//!
//! - **Strict priority.** A waiting request of a higher level is always
//!   dispatched before any of a lower one.
//! - **Weighted fair sharing within a level** (a virtual token counter,
//!   as in Sheng et al., *Fairness in Serving Large Language Models*,
//!   OSDI 2024, with GPU time as the service): each tenant of a level has
//!   a counter of the service it received divided by its weight. The next
//!   request is the first waiting one of the tenant with the smallest
//!   counter; dispatching it adds its estimated cost `c / w` (prompt +
//!   expected output through the model's profile, in GPU-µs), and when it
//!   completes [`Queue::correct`] replaces the estimate with what it
//!   really used, `(actual − c) / w`. Backlogged tenants so receive GPU
//!   time in proportion to their weights however wrong the estimates
//!   were, and a tenant's requests wait in arrival order.
//! - **No credit for idle time.** A tenant that starts waiting again has
//!   its counter lifted to the smallest counter of those already waiting
//!   (or, with nobody waiting, to the counter of the last one
//!   dispatched): it cannot jump the queue with what it did not use.
//! - **A place kept until dispatched.** A request stays in its queue until
//!   its caller reports it running ([`Queue::dispatch`]) or gone
//!   ([`Queue::cancel`]); [`Queue::front`] shows who is next without
//!   taking it out, so a request tried and found not to fit keeps its
//!   place, and it is charged once, when it runs. A cancelled request is
//!   never charged.
//! - **Bounded.** Each level holds at most its configured depth of waiting
//!   requests; a request beyond it is refused ([`Full`]) and the caller
//!   answers 429.
//!
//! Integer arithmetic only: counters are in GPU-µs × [`TAG_SCALE`] /
//! weight.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// Priority levels: 1 (lowest) to 5 (highest), as tenants' `priority`.
pub const LEVELS: usize = 5;
/// Counter units per GPU-µs of service at weight 1 (keeps the division by
/// a weight exact enough: weights are small integers).
pub const TAG_SCALE: u128 = 1_000_000;

/// Depth per level, lowest level first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    pub depth: [usize; LEVELS],
}

impl Default for QueueConfig {
    /// 1,000 waiting requests per level.
    fn default() -> Self {
        Self {
            depth: [1_000; LEVELS],
        }
    }
}

/// The level is at its depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the priority-{level} queue is full ({depth} waiting)")]
pub struct Full {
    pub level: u8,
    pub depth: usize,
}

const WAITING: u8 = 0;
const CANCELLED: u8 = 1;
const DISPATCHED: u8 = 2;

/// A handle on a queued request, to report it dispatched or cancelled.
#[derive(Debug, Clone)]
pub struct Ticket {
    state: Arc<AtomicU8>,
    level: usize,
    tenant: Arc<str>,
    /// What dispatching it adds to its tenant's counter: `c / w`.
    charge: u128,
}

struct Entry<T> {
    item: T,
    state: Arc<AtomicU8>,
    charge: u128,
}

impl<T> Entry<T> {
    fn waits(&self) -> bool {
        self.state.load(Ordering::Acquire) == WAITING
    }
}

struct TenantQueue<T> {
    /// Its requests in arrival order; dispatched and cancelled ones are
    /// dropped when they reach the front.
    entries: VecDeque<Entry<T>>,
    /// Of them, the ones waiting.
    live: usize,
    /// Service received / weight (see the module docs).
    counter: u128,
    /// Its place in the level's order while it has requests waiting.
    key: Option<(u128, u64)>,
}

struct Level<T> {
    tenants: HashMap<Arc<str>, TenantQueue<T>>,
    /// The tenants with requests waiting: (counter, since when, tenant),
    /// the smallest counter first, ties to the longest waiting.
    order: BTreeSet<(u128, u64, Arc<str>)>,
    /// The counter of the last tenant dispatched, before its charge.
    virtual_time: u128,
    /// Requests waiting.
    live: usize,
    /// Numbers the tenants' entries into `order` (ties go to the earlier).
    seq: u64,
}

impl<T> Default for Level<T> {
    fn default() -> Self {
        Self {
            tenants: HashMap::new(),
            order: BTreeSet::new(),
            virtual_time: 0,
            live: 0,
            seq: 0,
        }
    }
}

impl<T> Level<T> {
    /// Moves `tenant` to its counter's place in `order` (out of it when
    /// nothing of it waits).
    fn rekey(&mut self, tenant: &Arc<str>) {
        let Some(q) = self.tenants.get_mut(tenant) else {
            return;
        };
        if let Some((counter, seq)) = q.key.take() {
            self.order.remove(&(counter, seq, tenant.clone()));
        }
        if q.live > 0 {
            self.seq += 1;
            q.key = Some((q.counter, self.seq));
            self.order.insert((q.counter, self.seq, tenant.clone()));
        }
    }

    /// Keeps the key's counter in step with the tenant's (its `since`
    /// stays, so a tenant keeps its tie-break while it waits).
    fn recount(&mut self, tenant: &Arc<str>) {
        let Some(q) = self.tenants.get_mut(tenant) else {
            return;
        };
        if let Some((counter, seq)) = q.key {
            if counter != q.counter {
                self.order.remove(&(counter, seq, tenant.clone()));
                q.key = Some((q.counter, seq));
                self.order.insert((q.counter, seq, tenant.clone()));
            }
        }
    }

    /// The tenant whose request goes next, its dead entries dropped from
    /// the front.
    fn next(&mut self) -> Option<Arc<str>> {
        let (_, _, tenant) = self.order.first()?.clone();
        let q = self.tenants.get_mut(&tenant)?;
        while q.entries.front().is_some_and(|e| !e.waits()) {
            q.entries.pop_front();
        }
        Some(tenant)
    }

    /// Bookkeeping of a request of `tenant` leaving: dispatched (charged
    /// `charge`) or cancelled (`None`).
    fn left(&mut self, tenant: &Arc<str>, charge: Option<u128>) {
        self.live -= 1;
        let Some(q) = self.tenants.get_mut(tenant) else {
            return;
        };
        q.live -= 1;
        if let Some(charge) = charge {
            self.virtual_time = self.virtual_time.max(q.counter);
            q.counter += charge;
        }
        if q.live == 0 {
            self.rekey(tenant);
        } else {
            self.recount(tenant);
        }
    }
}

/// One pool's queue; `T` is what waits (the gateway's pending request).
pub struct Queue<T> {
    config: QueueConfig,
    levels: [Level<T>; LEVELS],
}

impl<T> std::fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("len", &self.lens())
            .finish_non_exhaustive()
    }
}

/// The level index of a priority (clamped to 1..=5).
fn index(priority: i16) -> usize {
    (priority.clamp(1, LEVELS as i16) - 1) as usize
}

/// `cost` GPU-µs at `weight`, in counter units.
fn charge(cost: u64, weight: u32) -> u128 {
    u128::from(cost) * TAG_SCALE / u128::from(weight.max(1))
}

impl<T> Queue<T> {
    pub fn new(config: QueueConfig) -> Self {
        Self {
            config,
            levels: Default::default(),
        }
    }

    /// Waiting requests per level, lowest first.
    pub fn lens(&self) -> [usize; LEVELS] {
        let mut out = [0; LEVELS];
        for (o, l) in out.iter_mut().zip(&self.levels) {
            *o = l.live;
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.levels.iter().all(|l| l.live == 0)
    }

    /// Whether a request of `priority` or above waits: an arrival of
    /// `priority` then queues behind it rather than go straight to a
    /// replica.
    pub fn waiting_at_or_above(&self, priority: i16) -> bool {
        self.levels[index(priority)..].iter().any(|l| l.live > 0)
    }

    /// Queues `item` of `tenant` at `priority`, with its estimated `cost`
    /// (GPU-µs) and the tenant's `weight` (at least 1), or refuses it when
    /// the level is at its depth.
    pub fn push(
        &mut self,
        tenant: &str,
        priority: i16,
        weight: u32,
        cost: u64,
        item: T,
    ) -> Result<Ticket, Full> {
        let i = index(priority);
        let depth = self.config.depth[i];
        let level = &mut self.levels[i];
        if level.live >= depth {
            return Err(Full {
                level: i as u8 + 1,
                depth,
            });
        }
        // No credit for idle time: lifted to the smallest waiting counter.
        let floor = level
            .order
            .first()
            .map_or(level.virtual_time, |(counter, _, _)| *counter);
        // One shared name per tenant, for its place in `order`.
        let tenant: Arc<str> = match level.tenants.get_key_value(tenant) {
            Some((k, _)) => k.clone(),
            None => Arc::from(tenant),
        };
        let q = level
            .tenants
            .entry(tenant.clone())
            .or_insert_with(|| TenantQueue {
                entries: VecDeque::new(),
                live: 0,
                counter: 0,
                key: None,
            });
        let was_idle = q.live == 0;
        if was_idle {
            q.counter = q.counter.max(floor);
        }
        let charge = charge(cost.max(1), weight);
        let state = Arc::new(AtomicU8::new(WAITING));
        q.entries.push_back(Entry {
            item,
            state: state.clone(),
            charge,
        });
        q.live += 1;
        level.live += 1;
        if was_idle {
            level.rekey(&tenant);
        }
        Ok(Ticket {
            state,
            level: i,
            tenant,
            charge,
        })
    }

    /// The next request to dispatch — the highest level's, of the tenant
    /// with the smallest counter — left in place.
    pub fn front(&mut self) -> Option<&T> {
        let i = (0..LEVELS).rev().find(|&i| self.levels[i].live > 0)?;
        let level = &mut self.levels[i];
        let tenant = level.next()?;
        level.tenants.get(&tenant)?.entries.front().map(|e| &e.item)
    }

    /// Its request runs: it leaves the queue and its tenant is charged its
    /// estimated cost. False if it had already left.
    pub fn dispatch(&mut self, ticket: &Ticket) -> bool {
        if !leave(ticket, DISPATCHED) {
            return false;
        }
        self.levels[ticket.level].left(&ticket.tenant, Some(ticket.charge));
        true
    }

    /// Its request will not run (its client left, its budget passed): it
    /// leaves the queue, charged nothing. False if it had already left.
    pub fn cancel(&mut self, ticket: &Ticket) -> bool {
        if !leave(ticket, CANCELLED) {
            return false;
        }
        self.levels[ticket.level].left(&ticket.tenant, None);
        true
    }

    /// A request of `tenant` at `priority` completed having used `actual`
    /// GPU-µs where `estimated` were charged: its tenant's counter moves by
    /// the difference at its `weight` (see the module docs).
    pub fn correct(
        &mut self,
        tenant: &str,
        priority: i16,
        weight: u32,
        estimated: u64,
        actual: u64,
    ) {
        let level = &mut self.levels[index(priority)];
        let Some(name) = level.tenants.get_key_value(tenant).map(|(k, _)| k.clone()) else {
            return;
        };
        let Some(q) = level.tenants.get_mut(&name) else {
            return;
        };
        if actual >= estimated {
            q.counter += charge(actual - estimated, weight);
        } else {
            q.counter = q.counter.saturating_sub(charge(estimated - actual, weight));
        }
        level.recount(&name);
    }

    /// Takes the next request out at once ([`Queue::front`] then
    /// [`Queue::dispatch`]): the queue as a plain data structure.
    pub fn pop(&mut self) -> Option<T> {
        let i = (0..LEVELS).rev().find(|&i| self.levels[i].live > 0)?;
        let level = &mut self.levels[i];
        let tenant = level.next()?;
        let entry = level.tenants.get_mut(&tenant)?.entries.pop_front()?;
        entry.state.store(DISPATCHED, Ordering::Release);
        level.left(&tenant, Some(entry.charge));
        Some(entry.item)
    }
}

/// Marks the ticket's entry `to` if it still waits.
fn leave(ticket: &Ticket, to: u8) -> bool {
    ticket
        .state
        .compare_exchange(WAITING, to, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;
    use proptest::prelude::*;

    const TENANTS: [(&str, u32); 5] = [
        ("acme", 8),
        ("medai", 4),
        ("finserv", 2),
        ("research", 1),
        ("codegen", 1),
    ];

    #[test]
    fn backlogged_tenants_share_by_weight_within_five_percent() {
        let mut q = Queue::new(QueueConfig {
            depth: [100_000; LEVELS],
        });
        for n in 0..4_000 {
            for (t, w) in TENANTS {
                q.push(t, 3, w, 1_000, (t, n)).unwrap();
            }
        }
        // Everyone is still backlogged after 8,000 pops (acme, the
        // fastest, has used half of its 4,000).
        let mut served: HashMap<&str, u32> = HashMap::new();
        for _ in 0..8_000 {
            let (t, _) = q.pop().unwrap();
            *served.entry(t).or_default() += 1;
        }
        let total_weight: u32 = TENANTS.iter().map(|(_, w)| w).sum();
        for (t, w) in TENANTS {
            let share = f64::from(served[t]) / 8_000.0;
            let want = f64::from(w) / f64::from(total_weight);
            assert!(
                (share - want).abs() <= want * 0.05,
                "{t}: {share:.4} of the service, its weight says {want:.4}"
            );
        }
    }

    #[test]
    fn a_tenant_back_from_idle_gets_no_burst_ahead() {
        let mut q = Queue::new(QueueConfig::default());
        // a is served alone for a long time; b was idle all along.
        for n in 0..600 {
            q.push("a", 3, 1, 1_000, ("a", n)).unwrap();
        }
        for _ in 0..500 {
            q.pop().unwrap();
        }
        for n in 0..100 {
            q.push("b", 3, 1, 1_000, ("b", n)).unwrap();
        }
        // Equal weights: from here they alternate; b never gets a run of
        // its idle time's worth.
        let order: Vec<&str> = (0..100).map(|_| q.pop().unwrap().0).collect();
        let longest_b_run = order.split(|t| *t == "a").map(<[&str]>::len).max().unwrap();
        assert!(
            longest_b_run <= 2,
            "b ran {longest_b_run} in a row: {order:?}"
        );
        let b = order.iter().filter(|t| **t == "b").count();
        assert!((45..=55).contains(&b), "b got {b} of 100");
    }

    #[test]
    fn strict_priority_and_bounded_levels() {
        let mut q = Queue::new(QueueConfig {
            depth: [2, 2, 2, 2, 2],
        });
        q.push("low", 4, 1, 10, "p4-a").unwrap();
        q.push("low", 4, 1, 10, "p4-b").unwrap();
        assert_eq!(
            q.push("low", 4, 1, 10, "p4-c").unwrap_err(),
            Full { level: 4, depth: 2 }
        );
        q.push("top", 5, 1, 1_000_000, "p5").unwrap();
        q.push("bottom", 1, 100, 1, "p1").unwrap();
        assert_eq!(
            q.pop(),
            Some("p5"),
            "a level-5 request first, however costly"
        );
        assert_eq!(q.pop(), Some("p4-a"));
        assert_eq!(q.pop(), Some("p4-b"));
        assert_eq!(q.pop(), Some("p1"));
        assert!(q.is_empty());
    }

    #[test]
    fn arrivals_see_who_waits_at_their_level_or_above() {
        let mut q = Queue::new(QueueConfig::default());
        q.push("standard", 3, 1, 10, "p3").unwrap();
        assert!(q.waiting_at_or_above(1));
        assert!(q.waiting_at_or_above(3));
        assert!(!q.waiting_at_or_above(4), "nobody waits at 4 or 5");
        q.pop();
        assert!(!q.waiting_at_or_above(1));
    }

    #[test]
    fn the_front_keeps_its_place_and_is_charged_once_when_dispatched() {
        let mut q = Queue::new(QueueConfig::default());
        let a1 = q.push("a", 3, 1, 1_000, "a1").unwrap();
        q.push("a", 3, 1, 1_000, "a2").unwrap();
        q.push("b", 3, 1, 1_000, "b1").unwrap();
        q.push("b", 3, 1, 1_000, "b2").unwrap();
        // Tried and found not to fit, many times: still first, never
        // charged for it.
        for _ in 0..10 {
            assert_eq!(q.front(), Some(&"a1"));
        }
        assert!(q.dispatch(&a1));
        assert!(!q.dispatch(&a1), "once only");
        // a was charged once: b, then a and b in turn.
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, ["b1", "a2", "b2"]);
    }

    #[test]
    fn cancelled_requests_free_their_place_and_are_never_charged() {
        let mut q = Queue::new(QueueConfig { depth: [2; LEVELS] });
        let a = q.push("a", 3, 1, 1_000_000, "a-big").unwrap();
        q.push("a", 3, 1, 10, "a-small").unwrap();
        assert!(q.cancel(&a));
        assert!(!q.cancel(&a), "once only");
        assert_eq!(q.lens()[2], 1, "the cancelled one no longer takes room");
        q.push("b", 3, 1, 10, "b").unwrap();
        // Had a's big request been charged, b would go first.
        assert_eq!(q.pop(), Some("a-small"));
        assert_eq!(q.pop(), Some("b"));
        assert_eq!(q.pop(), None);
        assert!(q.is_empty());
    }

    #[test]
    fn a_tenant_is_charged_what_its_requests_really_used() {
        // Two tenants of equal weight each estimate 1,000 GPU-µs a request;
        // "under" really uses 3,000. Corrected as they complete, "under"
        // gets a quarter of the requests, a half of the GPU time.
        let mut q = Queue::new(QueueConfig {
            depth: [100_000; LEVELS],
        });
        let mut used: HashMap<&str, u64> = HashMap::new();
        let mut waiting: HashMap<&str, usize> = HashMap::new();
        for t in ["under", "exact"] {
            for _ in 0..4 {
                q.push(t, 3, 1, 1_000, t).unwrap();
            }
            waiting.insert(t, 4);
        }
        for _ in 0..4_000 {
            let t = q.pop().unwrap();
            let actual = if t == "under" { 3_000 } else { 1_000 };
            q.correct(t, 3, 1, 1_000, actual);
            *used.entry(t).or_default() += actual;
            // Each keeps four waiting: backlogged.
            q.push(t, 3, 1, 1_000, t).unwrap();
        }
        let share = used["under"] as f64 / (used["under"] + used["exact"]) as f64;
        assert!((share - 0.5).abs() <= 0.5 * 0.05, "under used {share:.3}");
    }

    proptest! {
        /// Whatever the arrivals, each request leaves exactly once, a
        /// higher level's before a lower one's, and a tenant's in the
        /// order they came.
        #[test]
        fn every_request_leaves_once_in_order(
            arrivals in proptest::collection::vec((0usize..5, 1i16..=5, 1u64..10_000), 1..300)
        ) {
            let mut q = Queue::new(QueueConfig { depth: [10_000; LEVELS] });
            for (n, (t, priority, cost)) in arrivals.iter().enumerate() {
                let (name, w) = TENANTS[*t];
                q.push(name, *priority, w, *cost, n).unwrap();
            }
            let mut seen = std::collections::HashSet::new();
            let mut last_priority = i16::MAX;
            let mut last_of: HashMap<(usize, i16), usize> = HashMap::new();
            while let Some(n) = q.pop() {
                prop_assert!(seen.insert(n), "{} twice", n);
                let (t, priority, _) = arrivals[n];
                prop_assert!(priority <= last_priority, "a lower level went first");
                last_priority = priority;
                if let Some(before) = last_of.insert((t, priority), n) {
                    prop_assert!(before < n, "{} went before {}", n, before);
                }
            }
            prop_assert_eq!(seen.len(), arrivals.len());
        }
    }
}
