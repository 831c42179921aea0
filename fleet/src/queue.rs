//! The queue of one model pool: strict priority levels, and within a level
//! weighted fair queuing (WFQ) by tenant weight on virtual time.
//!
//! - **Strict priority.** A waiting request of a higher level is always
//!   dequeued before any of a lower one.
//! - **Weighted fair queuing within a level** (start-time fair queuing): a
//!   request of tenant `t` with cost `c` (its estimated GPU cost: prompt +
//!   max output through the model profile, in GPU-µs) and weight `w` gets
//!   the start tag `S = max(V, F_t)` and the finish tag `F = S + c / w`,
//!   where `F_t` is the finish tag of the tenant's previous request and `V`
//!   the level's virtual time — the start tag of the last request
//!   dequeued. The request with the smallest finish tag goes first. Under
//!   contention each tenant gets service in proportion to its weight; a
//!   tenant returning after being idle starts at `V`, not at its old clock,
//!   so it cannot jump the queue with the credit of its idle time.
//! - **Bounded.** Each level holds at most its configured depth; a request
//!   beyond it is refused ([`Full`]) and the caller answers 429.
//! - **Cancellation.** A request whose client left or whose wait budget
//!   passed is cancelled through its [`Ticket`]; it is skipped when it
//!   reaches the head, without moving virtual time.
//!
//! "A request leaves its queue when a replica can admit it for its class":
//! [`Queue::pop_if`] takes the admission check for a level. Class
//! thresholds rise with priority, so when the highest waiting level cannot
//! be admitted no lower one can either, and the pop stops there.
//!
//! Integer arithmetic only: tags are in GPU-µs × [`TAG_SCALE`] / weight.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Priority levels: 1 (lowest) to 5 (highest), as tenants' `priority`.
pub const LEVELS: usize = 5;
/// Virtual-time units per GPU-µs of cost at weight 1 (keeps the division
/// by a weight exact enough: weights are small integers).
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

/// A handle on a queued request: cancel it (client gone, wait budget
/// passed) and it is skipped.
#[derive(Debug, Clone, Default)]
pub struct Ticket(Arc<AtomicBool>);

impl Ticket {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What [`Queue::push`] accepted.
#[derive(Debug, Clone)]
pub struct Enqueued {
    pub ticket: Ticket,
    /// Its tags, for tests and tracing.
    pub start: u128,
    pub finish: u128,
}

struct Entry<T> {
    item: T,
    ticket: Ticket,
    start: u128,
    finish: u128,
}

struct TenantQueue<T> {
    entries: VecDeque<Entry<T>>,
    /// Finish tag of the tenant's last enqueued request.
    last_finish: u128,
}

struct Level<T> {
    tenants: HashMap<String, TenantQueue<T>>,
    /// (finish tag of a tenant's head, order of arrival, tenant): the
    /// smallest finish tag first, ties by arrival.
    heads: BinaryHeap<Reverse<(u128, u64, String)>>,
    /// The start tag of the last request dequeued.
    virtual_time: u128,
    /// Entries in the level, cancelled ones included until skipped.
    len: usize,
    /// Order of the pushes onto `heads` (ties go to the earlier).
    seq: u64,
}

impl<T> Default for Level<T> {
    fn default() -> Self {
        Self {
            tenants: HashMap::new(),
            heads: BinaryHeap::new(),
            virtual_time: 0,
            len: 0,
            seq: 0,
        }
    }
}

impl<T> Level<T> {
    /// Pops the request with the smallest finish tag, skipping cancelled
    /// ones (returned in `skipped`).
    fn pop(&mut self, skipped: &mut Vec<T>) -> Option<T> {
        while let Some(Reverse((_, _, tenant))) = self.heads.pop() {
            let Some(q) = self.tenants.get_mut(&tenant) else {
                continue;
            };
            let Some(entry) = q.entries.pop_front() else {
                continue;
            };
            self.len -= 1;
            if let Some(next) = q.entries.front() {
                self.seq += 1;
                self.heads
                    .push(Reverse((next.finish, self.seq, tenant.clone())));
            }
            if entry.ticket.is_cancelled() {
                skipped.push(entry.item);
                continue;
            }
            self.virtual_time = self.virtual_time.max(entry.start);
            return Some(entry.item);
        }
        None
    }

    /// Whether any request that is not cancelled waits here.
    fn has_live(&self) -> bool {
        self.tenants
            .values()
            .any(|q| q.entries.iter().any(|e| !e.ticket.is_cancelled()))
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

impl<T> Queue<T> {
    pub fn new(config: QueueConfig) -> Self {
        Self {
            config,
            levels: Default::default(),
        }
    }

    /// Waiting requests per level, lowest first (cancelled ones not yet
    /// skipped included).
    pub fn lens(&self) -> [usize; LEVELS] {
        let mut out = [0; LEVELS];
        for (o, l) in out.iter_mut().zip(&self.levels) {
            *o = l.len;
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.levels.iter().all(|l| l.len == 0)
    }

    /// Queues `item` of `tenant` at `priority`, with its `cost` (GPU-µs)
    /// and the tenant's `weight` (at least 1), or refuses it when the level
    /// is at its depth.
    pub fn push(
        &mut self,
        tenant: &str,
        priority: i16,
        weight: u32,
        cost: u64,
        item: T,
    ) -> Result<Enqueued, Full> {
        let i = index(priority);
        let depth = self.config.depth[i];
        let level = &mut self.levels[i];
        if level.len >= depth {
            return Err(Full {
                level: i as u8 + 1,
                depth,
            });
        }
        let q = level
            .tenants
            .entry(tenant.to_owned())
            .or_insert_with(|| TenantQueue {
                entries: VecDeque::new(),
                last_finish: 0,
            });
        let start = level.virtual_time.max(q.last_finish);
        let finish = start + u128::from(cost.max(1)) * TAG_SCALE / u128::from(weight.max(1));
        q.last_finish = finish;
        let ticket = Ticket::default();
        let was_empty = q.entries.is_empty();
        q.entries.push_back(Entry {
            item,
            ticket: ticket.clone(),
            start,
            finish,
        });
        level.len += 1;
        if was_empty {
            level.seq += 1;
            level
                .heads
                .push(Reverse((finish, level.seq, tenant.to_owned())));
        }
        Ok(Enqueued {
            ticket,
            start,
            finish,
        })
    }

    /// The next request: from the highest level holding one, if `admits`
    /// says a replica can take that level now; cancelled requests met on
    /// the way are dropped into `skipped` (the caller has answered them).
    pub fn pop_if(&mut self, admits: impl Fn(i16) -> bool, skipped: &mut Vec<T>) -> Option<T> {
        for i in (0..LEVELS).rev() {
            if !self.levels[i].has_live() {
                // Drop what is cancelled so the depth frees up.
                while self.levels[i].len > 0 && self.levels[i].pop(skipped).is_some() {}
                continue;
            }
            if !admits(i as i16 + 1) {
                return None;
            }
            if let Some(item) = self.levels[i].pop(skipped) {
                return Some(item);
            }
        }
        None
    }

    /// [`Queue::pop_if`] with every level admitted.
    pub fn pop(&mut self) -> Option<T> {
        let mut skipped = Vec::new();
        self.pop_if(|_| true, &mut skipped)
    }
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
        // The admission check for level 4 says no: nothing below goes either.
        let mut skipped = Vec::new();
        assert_eq!(q.pop_if(|level| level != 4, &mut skipped), None);
        assert_eq!(q.pop(), Some("p4-b"));
        assert_eq!(q.pop(), Some("p1"));
        assert!(q.is_empty());
    }

    #[test]
    fn cancelled_requests_are_skipped_and_free_their_place() {
        let mut q = Queue::new(QueueConfig { depth: [2; LEVELS] });
        let a = q.push("t", 3, 1, 10, "a").unwrap();
        q.push("t", 3, 1, 10, "b").unwrap();
        a.ticket.cancel();
        let mut skipped = Vec::new();
        assert_eq!(q.pop_if(|_| true, &mut skipped), Some("b"));
        assert_eq!(skipped, vec!["a"]);
        let c = q.push("t", 3, 1, 10, "c").unwrap();
        c.ticket.cancel();
        assert_eq!(q.pop_if(|_| true, &mut skipped), None);
        assert_eq!(
            q.lens(),
            [0; LEVELS],
            "the cancelled one no longer takes room"
        );
    }

    proptest! {
        /// Whatever the arrivals, a level's requests leave in finish-tag
        /// order and each exactly once.
        #[test]
        fn every_request_leaves_once_in_tag_order(
            arrivals in proptest::collection::vec((0usize..5, 1u64..10_000), 1..300)
        ) {
            let mut q = Queue::new(QueueConfig { depth: [10_000; LEVELS] });
            let mut tags = HashMap::new();
            for (n, (t, cost)) in arrivals.iter().enumerate() {
                let (name, w) = TENANTS[*t];
                let e = q.push(name, 2, w, *cost, n).unwrap();
                tags.insert(n, e.finish);
            }
            let mut seen = std::collections::HashSet::new();
            let mut last = 0u128;
            while let Some(n) = q.pop() {
                prop_assert!(seen.insert(n), "{} twice", n);
                // Everything was queued before the first pop, so the tags
                // come out in order.
                prop_assert!(tags[&n] >= last);
                last = tags[&n];
            }
            prop_assert_eq!(seen.len(), arrivals.len());
        }
    }
}
