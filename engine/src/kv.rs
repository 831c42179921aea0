//! The paged KV cache of one replica, as block accounting: blocks of
//! [`BLOCK_TOKENS`](crate::profile::BLOCK_TOKENS) tokens are held privately
//! by running sequences or by prefix-cache entries (pinned while a
//! sequence uses them, evictable when not).
//!
//! Occupancy — what admission and `vllm:kv_cache_usage_perc` see — counts
//! the blocks in use: private blocks plus pinned cache blocks. Unpinned
//! cache blocks are free memory that happens to still hold a prefix.

use crate::profile::BLOCK_TOKENS;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPool {
    total: u64,
    private: u64,
    cached: u64,
    pinned: u64,
}

impl KvPool {
    pub fn new(total_blocks: u64) -> Self {
        Self {
            total: total_blocks,
            private: 0,
            cached: 0,
            pinned: 0,
        }
    }

    /// Blocks needed to hold `tokens` tokens of context.
    pub fn blocks_for(tokens: u64) -> u64 {
        tokens.div_ceil(u64::from(BLOCK_TOKENS))
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// Blocks in use: private plus pinned cache blocks.
    pub fn used(&self) -> u64 {
        self.private + self.pinned
    }

    /// Blocks not held by anyone (evictable cache blocks are not free).
    pub fn free(&self) -> u64 {
        self.total - self.private - self.cached
    }

    /// Cache blocks no running sequence uses; eviction can free them.
    pub fn evictable(&self) -> u64 {
        self.cached - self.pinned
    }

    pub fn cached(&self) -> u64 {
        self.cached
    }

    /// Occupancy as a fraction, for metrics.
    pub fn usage(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        self.used() as f64 / self.total as f64
    }

    /// True when `used + extra` stays below `percent` of the blocks.
    pub fn below(&self, extra: u64, percent: u64) -> bool {
        (self.used() + extra) * 100 < percent * self.total
    }

    /// Takes `n` free blocks for a sequence; false (and nothing taken) when
    /// there are not enough.
    pub fn take_private(&mut self, n: u64) -> bool {
        if self.free() < n {
            return false;
        }
        self.private += n;
        true
    }

    pub fn release_private(&mut self, n: u64) {
        debug_assert!(self.private >= n);
        self.private -= n;
    }

    /// A sequence's private block becomes a pinned cache entry.
    pub(crate) fn private_to_cache(&mut self) {
        debug_assert!(self.private > 0);
        self.private -= 1;
        self.cached += 1;
        self.pinned += 1;
    }

    pub(crate) fn pin(&mut self) {
        self.pinned += 1;
    }

    pub(crate) fn unpin(&mut self) {
        debug_assert!(self.pinned > 0);
        self.pinned -= 1;
    }

    /// An unpinned cache entry was evicted.
    pub(crate) fn evicted(&mut self) {
        debug_assert!(self.cached > self.pinned);
        self.cached -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_up_to_16_tokens() {
        assert_eq!(KvPool::blocks_for(0), 0);
        assert_eq!(KvPool::blocks_for(16), 1);
        assert_eq!(KvPool::blocks_for(17), 2);
    }

    #[test]
    fn occupancy_counts_private_and_pinned_blocks() {
        let mut kv = KvPool::new(100);
        assert!(kv.take_private(10));
        kv.private_to_cache();
        assert_eq!((kv.used(), kv.free(), kv.cached()), (10, 90, 1));
        kv.unpin();
        assert_eq!((kv.used(), kv.free(), kv.evictable()), (9, 90, 1));
        kv.evicted();
        assert_eq!(kv.free(), 91);
        assert!(!kv.take_private(92));
        assert!(kv.below(50, 60));
        assert!(!kv.below(51, 60));
    }
}
