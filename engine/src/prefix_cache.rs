//! The prefix cache: full KV blocks of prompts, kept after their request
//! finishes so a later prompt with the same prefix skips that prefill.
//!
//! Keys are (tenant, model version, chained block hash). A lookup is always
//! made with the caller's own tenant, so no tenant can hit another's entry:
//! a hit is timing-observable and sharing would leak prompts. Each tenant's
//! entries are capped at a quota of the replica's blocks; a tenant at its
//! quota evicts its own least recently used entry, never anyone else's.
//! Under memory pressure the replica evicts the globally least recently
//! used unpinned entry. Pinned entries (in use by a running sequence) are
//! never evicted.

use crate::kv::KvPool;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub tenant: u32,
    pub version: u32,
    pub block: u64,
}

impl Key {
    /// Keys are already hashes: a cheap mix and splitmix64's finalizer, so
    /// every input bit reaches the bits the table indexes by.
    fn hash(&self) -> u32 {
        let mut z = self.block
            ^ (u64::from(self.tenant) << 32 | u64::from(self.version))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 32) as u32
    }
}

const NIL: u32 = u32::MAX;
/// Link sets of a node: the global LRU list and its tenant's LRU list.
const GLOBAL: usize = 0;
const TENANT: usize = 1;

#[derive(Debug, Clone, Copy)]
struct Node {
    key: Key,
    /// The key's hash, kept so removal finds its slot without re-hashing.
    hash: u32,
    /// Running sequences using the entry; it is on the LRU lists iff 0.
    refs: u32,
    prev: [u32; 2],
    next: [u32; 2],
}

#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

impl Default for List {
    fn default() -> Self {
        Self {
            head: NIL,
            tail: NIL,
        }
    }
}

/// One slot of the index: an entry's hash and its node, or empty.
#[derive(Debug, Clone, Copy)]
struct Slot {
    hash: u32,
    node: u32,
}

const EMPTY: Slot = Slot { hash: 0, node: NIL };

/// An open-addressing index from keys to nodes: linear probing, at most
/// half full (short probe runs: a miss, the common case for a unique
/// prompt block, costs ~1.5 slots; the simulator ran 10% faster than at
/// 3/4), with backward-shift deletion (no tombstones). Slots hold the
/// hash, so probes compare keys only on a full 32-bit hash match.
#[derive(Debug, Default)]
struct Index {
    slots: Vec<Slot>,
    len: usize,
}

impl Index {
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// The node holding `key`, if any.
    fn find(&self, nodes: &[Node], key: &Key, hash: u32) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut p = hash as usize & mask;
        loop {
            let s = self.slots[p];
            if s.node == NIL {
                return None;
            }
            if s.hash == hash && nodes[s.node as usize].key == *key {
                return Some(s.node);
            }
            p = (p + 1) & mask;
        }
    }

    /// Adds a node whose key is not in the index.
    fn insert(&mut self, hash: u32, node: u32) {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        self.place(Slot { hash, node });
        self.len += 1;
    }

    fn place(&mut self, slot: Slot) {
        let mask = self.mask();
        let mut p = slot.hash as usize & mask;
        while self.slots[p].node != NIL {
            p = (p + 1) & mask;
        }
        self.slots[p] = slot;
    }

    fn grow(&mut self) {
        let cap = (self.slots.len() * 2).max(1024);
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; cap]);
        for s in old {
            if s.node != NIL {
                self.place(s);
            }
        }
    }

    /// Removes a node that is in the index.
    fn remove(&mut self, hash: u32, node: u32) {
        let mask = self.mask();
        let mut hole = hash as usize & mask;
        while self.slots[hole].node != node {
            debug_assert!(self.slots[hole].node != NIL, "node not indexed");
            hole = (hole + 1) & mask;
        }
        // Shift later members of the probe run back over the hole, unless
        // that would move one before its home slot.
        let mut j = (hole + 1) & mask;
        loop {
            let s = self.slots[j];
            if s.node == NIL {
                break;
            }
            let home = s.hash as usize & mask;
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = s;
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
    }
}

/// What became of a block a sequence offered to the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    /// The block is now a pinned cache entry with this handle.
    Inserted(u32),
    /// The same tenant already cached it; the sequence now pins that entry
    /// (this handle) and should free its own copy.
    Shared(u32),
    /// Over the tenant's quota with nothing of its own to evict.
    Refused,
}

/// Entries live in a slab; unpinned ones are on two intrusive LRU lists
/// (global and per tenant), so every operation is O(1).
#[derive(Debug, Default)]
pub struct PrefixCache {
    index: Index,
    nodes: Vec<Node>,
    free_slots: Vec<u32>,
    lru: List,
    tenant_lru: Vec<List>,
    tenant_blocks: Vec<u64>,
    quota: u64,
}

impl PrefixCache {
    /// A cache whose tenants may each hold at most `quota_blocks` entries.
    pub fn new(quota_blocks: u64) -> Self {
        Self {
            quota: quota_blocks.max(1),
            ..Self::default()
        }
    }

    pub fn len(&self) -> usize {
        self.index.len
    }

    pub fn is_empty(&self) -> bool {
        self.index.len == 0
    }

    /// Entries `tenant` holds.
    pub fn tenant_blocks(&self, tenant: u32) -> u64 {
        self.tenant_blocks
            .get(tenant as usize)
            .copied()
            .unwrap_or(0)
    }

    fn grow(&mut self, tenant: u32) {
        let need = tenant as usize + 1;
        if self.tenant_blocks.len() < need {
            self.tenant_blocks.resize(need, 0);
            self.tenant_lru.resize(need, List::default());
        }
    }

    fn list(&mut self, which: usize, tenant: u32) -> &mut List {
        if which == GLOBAL {
            &mut self.lru
        } else {
            &mut self.tenant_lru[tenant as usize]
        }
    }

    fn push_back(&mut self, which: usize, i: u32) {
        let tenant = self.nodes[i as usize].key.tenant;
        let tail = self.list(which, tenant).tail;
        self.nodes[i as usize].prev[which] = tail;
        self.nodes[i as usize].next[which] = NIL;
        if tail == NIL {
            self.list(which, tenant).head = i;
        } else {
            self.nodes[tail as usize].next[which] = i;
        }
        self.list(which, tenant).tail = i;
    }

    fn unlink(&mut self, which: usize, i: u32) {
        let Node {
            key, prev, next, ..
        } = self.nodes[i as usize];
        let (prev, next) = (prev[which], next[which]);
        if prev == NIL {
            self.list(which, key.tenant).head = next;
        } else {
            self.nodes[prev as usize].next[which] = next;
        }
        if next == NIL {
            self.list(which, key.tenant).tail = prev;
        } else {
            self.nodes[next as usize].prev[which] = prev;
        }
    }

    fn pin_node(&mut self, kv: &mut KvPool, i: u32) {
        if self.nodes[i as usize].refs == 0 {
            self.unlink(GLOBAL, i);
            self.unlink(TENANT, i);
            kv.pin();
        }
        self.nodes[i as usize].refs += 1;
    }

    /// Pins the leading blocks of `blocks` this tenant has cached, pushing
    /// their entry handles onto `pinned`; returns how many.
    pub fn lookup_pin(
        &mut self,
        kv: &mut KvPool,
        tenant: u32,
        version: u32,
        blocks: &[u64],
        pinned: &mut Vec<u32>,
    ) -> u32 {
        let mut hits = 0;
        for &block in blocks {
            let key = Key {
                tenant,
                version,
                block,
            };
            let Some(i) = self.index.find(&self.nodes, &key, key.hash()) else {
                break;
            };
            self.pin_node(kv, i);
            pinned.push(i);
            hits += 1;
        }
        hits
    }

    /// Offers a sequence's private block to the cache (see [`Publish`]).
    pub fn publish(&mut self, kv: &mut KvPool, tenant: u32, version: u32, block: u64) -> Publish {
        let key = Key {
            tenant,
            version,
            block,
        };
        let hash = key.hash();
        if let Some(i) = self.index.find(&self.nodes, &key, hash) {
            self.pin_node(kv, i);
            return Publish::Shared(i);
        }
        self.grow(tenant);
        if self.tenant_blocks[tenant as usize] >= self.quota {
            let oldest = self.tenant_lru[tenant as usize].head;
            if oldest == NIL {
                return Publish::Refused;
            }
            self.remove(kv, oldest);
        }
        let node = Node {
            key,
            hash,
            refs: 1,
            prev: [NIL; 2],
            next: [NIL; 2],
        };
        let i = match self.free_slots.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.index.insert(hash, i);
        self.tenant_blocks[tenant as usize] += 1;
        kv.private_to_cache();
        Publish::Inserted(i)
    }

    /// Releases pins taken by [`lookup_pin`](Self::lookup_pin) or
    /// [`publish`](Self::publish), by the handles they gave.
    pub fn unpin(&mut self, kv: &mut KvPool, pinned: &[u32]) {
        for &i in pinned {
            let node = &mut self.nodes[i as usize];
            debug_assert!(node.refs > 0);
            node.refs -= 1;
            if node.refs == 0 {
                kv.unpin();
                self.push_back(GLOBAL, i);
                self.push_back(TENANT, i);
            }
        }
    }

    /// Evicts the least recently used unpinned entry of any tenant.
    pub fn evict_lru(&mut self, kv: &mut KvPool) -> bool {
        let oldest = self.lru.head;
        if oldest == NIL {
            return false;
        }
        self.remove(kv, oldest);
        true
    }

    /// Removes an unpinned entry.
    fn remove(&mut self, kv: &mut KvPool, i: u32) {
        self.unlink(GLOBAL, i);
        self.unlink(TENANT, i);
        let Node { key, hash, .. } = self.nodes[i as usize];
        self.index.remove(hash, i);
        self.free_slots.push(i);
        self.tenant_blocks[key.tenant as usize] -= 1;
        kv.evicted();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_with(kv: &mut KvPool, quota: u64) -> PrefixCache {
        assert!(kv.take_private(10));
        PrefixCache::new(quota)
    }

    #[test]
    fn the_index_agrees_with_a_hash_map_through_inserts_and_removals() {
        use std::collections::HashMap;
        let mut nodes = Vec::new();
        let mut index = Index::default();
        let mut reference: HashMap<Key, u32> = HashMap::new();
        let mut x = 1u64;
        for step in 0..20_000u32 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let key = Key {
                tenant: (x >> 60) as u32,
                version: 0,
                // Few distinct blocks, so inserts and removals collide.
                block: (x >> 33) % 3_000,
            };
            let hash = key.hash();
            let found = index.find(&nodes, &key, hash);
            assert_eq!(found, reference.get(&key).copied(), "step {step}");
            match found {
                Some(i) => {
                    index.remove(hash, i);
                    reference.remove(&key);
                }
                None => {
                    nodes.push(Node {
                        key,
                        hash,
                        refs: 0,
                        prev: [NIL; 2],
                        next: [NIL; 2],
                    });
                    let i = (nodes.len() - 1) as u32;
                    index.insert(hash, i);
                    reference.insert(key, i);
                }
            }
            assert_eq!(index.len, reference.len());
        }
        for (key, &i) in &reference {
            assert_eq!(index.find(&nodes, key, key.hash()), Some(i));
        }
    }

    #[test]
    fn another_tenant_never_hits() {
        let mut kv = KvPool::new(100);
        let mut c = cache_with(&mut kv, 10);
        let Publish::Inserted(h) = c.publish(&mut kv, 1, 0, 42) else {
            panic!("not inserted")
        };
        c.unpin(&mut kv, &[h]);
        let mut pins = Vec::new();
        assert_eq!(c.lookup_pin(&mut kv, 2, 0, &[42], &mut pins), 0);
        assert_eq!(
            c.lookup_pin(&mut kv, 1, 1, &[42], &mut pins),
            0,
            "other model version"
        );
        assert_eq!(c.lookup_pin(&mut kv, 1, 0, &[42, 43], &mut pins), 1);
        assert_eq!(pins, [h]);
    }

    #[test]
    fn a_tenant_at_quota_evicts_only_its_own_entries() {
        let mut kv = KvPool::new(100);
        let mut c = cache_with(&mut kv, 2);
        for (tenant, block) in [(1, 1), (2, 2), (2, 3)] {
            let Publish::Inserted(h) = c.publish(&mut kv, tenant, 0, block) else {
                panic!("not inserted")
            };
            c.unpin(&mut kv, &[h]);
        }
        // Tenant 2 is at quota: its oldest entry (2) goes, tenant 1's stays.
        assert!(matches!(c.publish(&mut kv, 2, 0, 4), Publish::Inserted(_)));
        assert_eq!(c.tenant_blocks(1), 1);
        assert_eq!(c.tenant_blocks(2), 2);
        let mut pins = Vec::new();
        assert_eq!(c.lookup_pin(&mut kv, 2, 0, &[2], &mut pins), 0);
        assert_eq!(c.lookup_pin(&mut kv, 1, 0, &[1], &mut pins), 1);
        // Pinned entries are never evicted: tenant 2 pins both, quota full.
        assert_eq!(c.lookup_pin(&mut kv, 2, 0, &[3], &mut pins), 1);
        assert_eq!(c.publish(&mut kv, 2, 0, 5), Publish::Refused);
    }

    #[test]
    fn global_eviction_takes_the_least_recently_used_unpinned_entry() {
        let mut kv = KvPool::new(100);
        let mut c = cache_with(&mut kv, 10);
        let handles: Vec<Publish> = [1, 2].map(|b| c.publish(&mut kv, 1, 0, b)).into();
        let [Publish::Inserted(h1), Publish::Inserted(h2)] = handles[..] else {
            panic!("not inserted: {handles:?}")
        };
        c.unpin(&mut kv, &[h2]);
        c.unpin(&mut kv, &[h1]);
        assert!(c.evict_lru(&mut kv));
        assert_eq!(c.lookup_pin(&mut kv, 1, 0, &[1], &mut Vec::new()), 1);
        assert!(!c.evict_lru(&mut kv), "the only other entry is pinned");
        assert_eq!(kv.cached(), 1);
    }
}
