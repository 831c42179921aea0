//! Continuous batching: which sequences run in the next step and how many
//! tokens each processes.
//!
//! Every step has a token budget (512 by default). Running sequences in
//! decode take one token each, first; sequences part-way through their
//! prompt take the next chunk; then waiting sequences are started, highest
//! class first, FIFO within a class, while the budget, `max_running` and the
//! class's KV threshold allow. A sequence's prompt blocks are allocated when
//! it starts (minus prefix-cache hits); a decode that crosses a block
//! boundary takes one more. When no block is free and no unpinned cache
//! entry can be evicted, the lowest-class, most recently started sequence
//! is preempted: its KV is dropped and it waits to recompute prompt plus
//! generated tokens; the GPU time it had accrued since it started is
//! reported as preempted.
//!
//! Admission by class: a request arrives only while KV occupancy — blocks in
//! use plus the blocks the waiting queue needs to start — is below its
//! class's threshold (best-effort 60%, standard 85%, reserved 92%), and
//! starts only if its blocks keep occupancy below it. It is also refused
//! while the prompts waiting ahead of it (its class and the higher ones)
//! hold the profile's `backlog_steps` full steps of prefill or more
//! (128 by default, ~4 s on the reference 70B): a deeper queue
//! inside the replica only adds wait in first-come order, which the
//! gateway's fair queue does better (by priority and weight, within each
//! tenant's wait budget).

use std::collections::VecDeque;

use crate::kv::KvPool;
use crate::prefix_cache::{PrefixCache, Publish};
use crate::profile::BLOCK_TOKENS;

/// A tenant's admission class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum ServiceClass {
    BestEffort,
    #[default]
    Standard,
    Reserved,
}

impl ServiceClass {
    pub const ALL: [Self; 3] = [Self::BestEffort, Self::Standard, Self::Reserved];

    /// Admitted only while KV occupancy is below this percentage.
    pub fn threshold_percent(self) -> u64 {
        match self {
            Self::BestEffort => 60,
            Self::Standard => 85,
            Self::Reserved => 92,
        }
    }

    /// The class of a tenant priority (1 lowest … 5 highest): 4 and 5 are
    /// reserved, 3 standard, 1 and 2 best effort.
    pub fn from_priority(priority: i16) -> Self {
        match priority {
            i16::MIN..=2 => Self::BestEffort,
            3 => Self::Standard,
            4.. => Self::Reserved,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::BestEffort => "best-effort",
            Self::Standard => "standard",
            Self::Reserved => "reserved",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A sequence's id within its replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// One request's state on a replica.
#[derive(Debug, Clone)]
pub struct Seq {
    pub id: SeqId,
    pub tenant: u32,
    pub class: ServiceClass,
    pub prompt_tokens: u32,
    /// Tokens it will generate unless cancelled.
    pub output_tokens: u32,
    /// True when `max_tokens` set `output_tokens`.
    pub capped: bool,
    /// Report each token as it is generated.
    pub stream: bool,
    /// Chained hashes of the prompt's full blocks.
    pub blocks: Vec<u64>,
    pub arrived_at: u64,
    /// Prompt tokens served from the prefix cache when it first started.
    pub cached_tokens: Option<u32>,
    pub generated: u32,
    /// Tokens whose KV is stored.
    pub computed: u32,
    /// Tokens to compute before decoding: prompt plus tokens generated
    /// before a preemption.
    pub prefill_target: u32,
    pub private_blocks: u32,
    /// Leading prompt blocks held as pinned cache entries (their handles).
    pub shared: Vec<u32>,
    pub first_token_at: Option<u64>,
    pub last_token_at: u64,
    pub gpu_micros: u64,
    pub since_start_micros: u64,
    pub preempted_micros: u64,
    pub preemptions: u32,
    /// When it (last) started, in start order; preemption picks the latest.
    pub start_order: u64,
    /// Tokens processed in the step being built.
    pub step_tokens: u32,
}

impl Seq {
    fn held_blocks(&self) -> u64 {
        u64::from(self.private_blocks) + self.shared.len() as u64
    }

    pub fn in_prefill(&self) -> bool {
        self.computed < self.prefill_target
    }
}

/// The KV memory and prefix cache of a replica, as the scheduler uses them.
#[derive(Debug)]
pub struct Memory {
    pub kv: KvPool,
    pub cache: PrefixCache,
    pub version: u32,
}

impl Memory {
    /// Frees `n` blocks by evicting unpinned cache entries if needed.
    fn make_free(&mut self, n: u64) -> bool {
        while self.kv.free() < n {
            if !self.cache.evict_lru(&mut self.kv) {
                return false;
            }
        }
        true
    }

    /// Drops everything a sequence holds.
    pub fn release(&mut self, seq: &mut Seq) {
        self.cache.unpin(&mut self.kv, &seq.shared);
        self.kv.release_private(u64::from(seq.private_blocks));
        seq.shared.clear();
        seq.private_blocks = 0;
    }

    /// Offers the prompt's full blocks after the cached ones to the cache.
    pub fn publish(&mut self, seq: &mut Seq) {
        while seq.shared.len() < seq.blocks.len() && seq.private_blocks > 0 {
            let block = seq.blocks[seq.shared.len()];
            let handle = match self
                .cache
                .publish(&mut self.kv, seq.tenant, self.version, block)
            {
                Publish::Inserted(h) => h,
                Publish::Shared(h) => {
                    self.kv.release_private(1);
                    h
                }
                Publish::Refused => break,
            };
            seq.private_blocks -= 1;
            seq.shared.push(handle);
        }
    }
}

/// The blocks a waiting sequence needs to start.
fn demand(s: &Seq) -> u64 {
    KvPool::blocks_for(u64::from(s.prompt_tokens + s.generated))
}

/// The tokens a waiting sequence must prefill once it starts (its prompt
/// and, after a preemption, what it had generated).
fn backlog(s: &Seq) -> u64 {
    u64::from(s.prompt_tokens + s.generated)
}

#[derive(Debug, Default)]
pub struct Scheduler {
    pub running: Vec<Seq>,
    waiting: [VecDeque<Seq>; 3],
    /// KV blocks the waiting sequences will need to start (their prompt
    /// and what they generated before a preemption): admission counts them
    /// as taken, so a flood that can't start is refused, not queued forever.
    waiting_blocks: u64,
    /// Per class, the tokens its waiting sequences must prefill.
    waiting_tokens: [u64; 3],
    starts: u64,
    pub preemptions: u64,
    /// Prompt tokens looked up in and served from the prefix cache.
    pub cache_queries: u64,
    pub cache_hits: u64,
    /// Scratch for cache lookups and for the step's prefilling sequences.
    pinned: Vec<u32>,
    prefilling: Vec<usize>,
}

impl Scheduler {
    pub fn waiting_len(&self) -> usize {
        self.waiting.iter().map(VecDeque::len).sum()
    }

    pub fn enqueue(&mut self, seq: Seq) {
        self.waiting_blocks += demand(&seq);
        self.waiting_tokens[seq.class.index()] += backlog(&seq);
        self.waiting[seq.class.index()].push_back(seq);
    }

    /// See the `waiting_blocks` field.
    pub fn waiting_blocks(&self) -> u64 {
        self.waiting_blocks
    }

    /// The prefill tokens waiting ahead of a new request of `class`: its
    /// own class's and the higher ones' (they start first).
    pub fn waiting_tokens_ahead_of(&self, class: ServiceClass) -> u64 {
        self.waiting_tokens[class.index()..].iter().sum()
    }

    /// Every sequence's id, running ones first.
    pub fn ids(&self) -> Vec<SeqId> {
        self.running
            .iter()
            .chain(self.waiting.iter().flatten())
            .map(|s| s.id)
            .collect()
    }

    /// Removes a sequence wherever it is; the caller releases its memory.
    pub fn remove(&mut self, id: SeqId) -> Option<Seq> {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            return Some(self.running.remove(i));
        }
        for q in &mut self.waiting {
            if let Some(i) = q.iter().position(|s| s.id == id) {
                let s = q.remove(i)?;
                self.waiting_blocks -= demand(&s);
                self.waiting_tokens[s.class.index()] -= backlog(&s);
                return Some(s);
            }
        }
        None
    }

    /// Builds the next step: sets `step_tokens` on the running sequences.
    pub fn schedule(&mut self, mem: &mut Memory, budget: u32, max_running: u32) {
        let mut budget = budget;
        // Decodes first, in start order.
        let mut i = 0;
        while i < self.running.len() {
            let s = &mut self.running[i];
            s.step_tokens = 0;
            if s.in_prefill() || budget == 0 {
                i += 1;
                continue;
            }
            let need =
                KvPool::blocks_for(u64::from(s.computed) + 1).saturating_sub(s.held_blocks());
            if need > 0 && !mem.make_free(need) {
                let victim = self.victim();
                // A victim scheduled earlier in this step gives its token back.
                budget += self.running[victim].step_tokens;
                self.preempt(mem, victim);
                if victim < i {
                    i -= 1;
                }
                continue;
            }
            let s = &mut self.running[i];
            s.private_blocks += need as u32;
            if need > 0 && !mem.kv.take_private(need) {
                debug_assert!(false, "blocks were made free");
            }
            s.step_tokens = 1;
            budget -= 1;
            i += 1;
        }
        // Prompt chunks, then new starts, class by class from the highest,
        // so a reserved request never waits behind a best-effort prefill.
        // A head that cannot start stops further starts (no overtaking),
        // but prefills already holding memory keep going.
        let mut prefilling = std::mem::take(&mut self.prefilling);
        prefilling.clear();
        prefilling.extend((0..self.running.len()).filter(|&i| self.running[i].in_prefill()));
        let mut blocked = false;
        for class in ServiceClass::ALL.into_iter().rev() {
            for &i in &prefilling {
                let s = &mut self.running[i];
                if budget > 0 && s.class == class {
                    let chunk = (s.prefill_target - s.computed).min(budget);
                    s.step_tokens = chunk;
                    budget -= chunk;
                }
            }
            while !blocked && budget > 0 && self.running.len() < max_running as usize {
                let Some(head) = self.waiting[class.index()].front() else {
                    break;
                };
                let target = head.prompt_tokens + head.generated;
                let lookup = ((target.saturating_sub(1)) / BLOCK_TOKENS) as usize;
                let lookup = lookup.min(head.blocks.len());
                let mut pinned = std::mem::take(&mut self.pinned);
                pinned.clear();
                let hits = mem.cache.lookup_pin(
                    &mut mem.kv,
                    head.tenant,
                    mem.version,
                    &head.blocks[..lookup],
                    &mut pinned,
                );
                let need = KvPool::blocks_for(u64::from(target)).saturating_sub(u64::from(hits));
                if !mem.kv.below(need, class.threshold_percent()) || !mem.make_free(need) {
                    mem.cache.unpin(&mut mem.kv, &pinned);
                    self.pinned = pinned;
                    blocked = true;
                    break;
                }
                let Some(mut s) = self.waiting[class.index()].pop_front() else {
                    break;
                };
                self.waiting_blocks -= demand(&s);
                self.waiting_tokens[class.index()] -= backlog(&s);
                if !mem.kv.take_private(need) {
                    debug_assert!(false, "blocks were made free");
                }
                let cached = hits * BLOCK_TOKENS;
                if s.cached_tokens.is_none() {
                    s.cached_tokens = Some(cached);
                    self.cache_queries += u64::from(s.prompt_tokens);
                    self.cache_hits += u64::from(cached);
                }
                s.shared.clear();
                // Publishing adds the prompt's other blocks: allocate once.
                s.shared.reserve(s.blocks.len().max(pinned.len()));
                s.shared.extend_from_slice(&pinned);
                self.pinned = pinned;
                s.private_blocks = need as u32;
                s.computed = cached;
                s.prefill_target = target;
                self.starts += 1;
                s.start_order = self.starts;
                s.since_start_micros = 0;
                s.step_tokens = (target - cached).min(budget);
                budget -= s.step_tokens;
                self.running.push(s);
            }
        }
        self.prefilling = prefilling;
    }

    /// The running sequence to preempt: lowest class, latest started.
    fn victim(&self) -> usize {
        let mut best = 0;
        for (i, s) in self.running.iter().enumerate() {
            let b = &self.running[best];
            if (s.class, std::cmp::Reverse(s.start_order))
                < (b.class, std::cmp::Reverse(b.start_order))
            {
                best = i;
            }
        }
        best
    }

    fn preempt(&mut self, mem: &mut Memory, i: usize) {
        let mut s = self.running.remove(i);
        mem.release(&mut s);
        s.preempted_micros += s.since_start_micros;
        s.since_start_micros = 0;
        s.preemptions += 1;
        s.computed = 0;
        s.step_tokens = 0;
        self.preemptions += 1;
        self.waiting_blocks += demand(&s);
        self.waiting_tokens[s.class.index()] += backlog(&s);
        self.waiting[s.class.index()].push_front(s);
    }
}
