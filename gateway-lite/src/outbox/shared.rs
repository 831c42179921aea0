//! What the writer thread, the relay and request handlers share: the
//! segments on disk and how far publishing got ([`State`], behind one
//! lock), the answers table and the depth counter. Kept apart from both
//! the handle and the writer so each of them imports it, not the other.

use std::collections::{BTreeSet, VecDeque};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard, PoisonError};

use redb::{Database, TableDefinition};

/// (api key id, NUL, Idempotency-Key) → answer (see `idempotency`).
pub(super) const ANSWERS: TableDefinition<&[u8], &[u8]> =
    TableDefinition::new("idempotent_answers");
/// Events waiting in the outbox, kept current by every append and delete.
pub const DEPTH_GAUGE: &str = "gateway_outbox_depth";

/// What the writer, the relay and request handlers share.
pub(super) struct Shared {
    pub(super) dir: PathBuf,
    pub(super) answers: Database,
    pub(super) state: Mutex<State>,
    pub(super) depth: AtomicU64,
    /// Held for as long as the outbox is open: one process per directory.
    pub(super) _lock: File,
}

/// A segment file and what the writer has flushed into it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Segment {
    pub(super) index: u64,
    /// Where its durable records end.
    pub(super) end: u64,
    /// The highest event sequence number in it.
    pub(super) last_seq: Option<u64>,
}

pub(super) struct State {
    /// Segments on disk, oldest first; the last one is being written.
    pub(super) segments: VecDeque<Segment>,
    /// Every event below this was published.
    pub(super) cursor: u64,
    /// Published events at or above the cursor (acknowledged out of order).
    pub(super) acked: BTreeSet<u64>,
    /// The cursor as last flushed to the log.
    pub(super) durable_cursor: u64,
    /// Where the relay's reading starts: (segment index, offset). Every
    /// record before it is below the cursor.
    pub(super) read_from: (u64, u64),
    /// Groups whose answers went into `answers.redb` without a flush, and
    /// how many of those a durable commit covered.
    pub(super) answers_written: u64,
    pub(super) answers_synced: u64,
}

impl Shared {
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
