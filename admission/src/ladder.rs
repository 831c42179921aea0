//! The gateway's side of [`fleet::ladder`] (with `GATEWAY_QUEUE=on`): every
//! second it looks at the simulated models and the SLO windows and sets
//! each priority's share of its tenants' requests/s bucket.
//!
//! - **Saturated**: requests of any priority wait in a simulated model's
//!   fair queue at two looks a second apart, the queue not shrinking:
//!   every replica they may use refused them for their class (the
//!   pool's own refusals, not its KV readings, which lag admission while
//!   long prefills run), and more arrive than leave. It stays saturated
//!   until the queue is empty. Then, on that model's pool only, priority 1
//!   is refused (429 `degraded`), 2 keeps 25% of its rate, 3 keeps 50%;
//!   requests for the other models keep their rates. The lowest levels' own backlog
//!   counts: a burst of priority 1 that the pool cannot serve is turned
//!   away at the door instead of waiting and then running in batches too
//!   large to meet its own end-to-end objective (the noisy-neighbour
//!   drill's codegen).
//! - **SLO pressure**: a tenant whose window's p95 is at 80% of its
//!   objective or more borrows from the priorities below it, one more
//!   level each second (1, then 2, then 3; never 4 for a priority-5
//!   tenant), each at 50% of its rate; given back a level a second once
//!   its pressure is under 60%.
//!
//! The shares apply to the tenant requests/s bucket (a tenant without
//! `rateLimit` has no rate to scale and is not slowed), except that a
//! level at 0% — priority 1 while saturated — is refused whatever its
//! limits; on this gateway: every gateway computes its own from what it
//! sees.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use fleet::ladder::{rate_percent, Borrowing, SATURATED_PERCENT};

/// How often the ladder is re-evaluated.
pub const EVERY: Duration = Duration::from_secs(1);

/// Each priority's share of its rate, percent; cheap to clone.
#[derive(Clone)]
pub struct Ladder {
    /// Each priority's share with SLO borrowing alone (every pool).
    percent: Arc<[AtomicU32; 5]>,
    /// The models whose pool is saturated: their lower priorities also
    /// follow [`fleet::ladder::SATURATED_PERCENT`].
    saturated: Arc<RwLock<HashSet<String>>>,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for Ladder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ladder")
            .field("percent", &self.all())
            .field(
                "saturated",
                &*self
                    .saturated
                    .read()
                    .unwrap_or_else(PoisonError::into_inner),
            )
            .finish()
    }
}

#[derive(Default)]
struct State {
    borrowing: HashMap<String, Borrowing>,
    /// Each model's queue depth at the last look.
    depth: HashMap<String, usize>,
    /// The models found saturated at the last look.
    saturated: HashSet<String>,
}

impl Default for Ladder {
    /// Every priority at full rate.
    fn default() -> Self {
        Self {
            percent: Arc::new(std::array::from_fn(|_| AtomicU32::new(100))),
            saturated: Arc::default(),
            state: Arc::default(),
        }
    }
}

impl Ladder {
    /// Every priority at full rate.
    pub fn new() -> Self {
        Self::default()
    }

    /// The share of its rate `priority` keeps now on `model`'s pool, percent.
    pub fn percent(&self, model: &str, priority: i16) -> u32 {
        let i = (priority.clamp(1, 5) - 1) as usize;
        let borrowed = self.percent[i].load(Ordering::Relaxed);
        let saturated = self
            .saturated
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(model);
        if saturated {
            borrowed.min(SATURATED_PERCENT[i])
        } else {
            borrowed
        }
    }

    /// Each priority's share on a pool that is not saturated.
    pub fn all(&self) -> [u32; 5] {
        std::array::from_fn(|i| self.percent[i].load(Ordering::Relaxed))
    }

    /// One look: `models` are (model, how many requests wait in its queue
    /// now); `windows` the SLO windows.
    pub fn evaluate(
        &self,
        models: &[(String, usize)],
        windows: &fleet::slo::Windows,
        now: Instant,
    ) -> [u32; 5] {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        for (model, depth) in models {
            let before = st.depth.insert(model.clone(), *depth).unwrap_or(0);
            // Saturated when the queue held at two looks a second apart and
            // did not shrink; it stays so until the queue is empty (one dip
            // does not end it). A request waiting a moment is not enough.
            let was = st.saturated.contains(model);
            let now_saturated = *depth > 0 && ((before > 0 && *depth >= before) || was);
            if now_saturated {
                st.saturated.insert(model.clone());
            } else {
                st.saturated.remove(model);
            }
        }
        for tenant in windows.tenants() {
            let r = windows.report(&tenant, now);
            let Some(pressure) = r.pressure_permille() else {
                st.borrowing.remove(&tenant);
                continue;
            };
            st.borrowing
                .entry(tenant)
                .or_insert_with(|| Borrowing::new(r.priority))
                .update(pressure);
        }
        let borrowing: Vec<Borrowing> = st.borrowing.values().copied().collect();
        let percent = rate_percent(false, &borrowing);
        for (slot, p) in self.percent.iter().zip(percent) {
            slot.store(p, Ordering::Relaxed);
        }
        *self
            .saturated
            .write()
            .unwrap_or_else(PoisonError::into_inner) = st.saturated.clone();
        let saturated_percent = rate_percent(true, &borrowing);
        for (model, _) in models {
            let saturated = st.saturated.contains(model);
            let shares = if saturated {
                &saturated_percent
            } else {
                &percent
            };
            crate::telemetry::ladder(model, shares, saturated);
        }
        percent
    }
}
