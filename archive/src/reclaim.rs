//! Keeping the archive queue small: the archiver vacuums what it drains.
//!
//! Every statement that inserts into request_log passes through the queue
//! once (a row of `archive_queue_batches`, inserted by the trigger, deleted
//! when its files are listed), so the queue leaves one dead row, and its
//! ids' out-of-line chunks, per ingest batch behind. Left to autovacuum —
//! off on some operators' servers — they pile up and every poll reads
//! them: on the demo, when the queue held a row per request, 2 million dead
//! rows made an idle poll take ~70 ms and kept a core ~30% busy, and a
//! `VACUUM` brought the poll to 0.5 ms. So the archiver does not rely on
//! autovacuum:
//!
//! - at start, once (a queue left bloated by an earlier run);
//! - after a batch that drained the queue (did not fill), if it took rows
//!   off it since the last vacuum: the queue then holds little more than
//!   what was just deleted, so the vacuum is short;
//! - while it works through a backlog, every [`Reclaim::every`] rows taken
//!   off, so a long backlog does not leave the table at its peak size.
//!
//! `VACUUM` cannot run inside a transaction, so it runs on its own
//! statement; `SKIP_LOCKED` lets it pass when another archiver's vacuum
//! holds the table, and `INDEX_CLEANUP ON` makes it clear the index even
//! when it judges the dead rows few. An idle archiver that drained nothing
//! vacuums nothing.

use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::error::ArchiveError;

/// Request rows taken off the queue between vacuums while a backlog lasts.
pub const EVERY: u64 = 1_000_000;

/// When the archiver owes the queue a vacuum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reclaim {
    /// No vacuum yet: what an earlier run left is unknown.
    first: bool,
    /// Rows taken off the queue since the last vacuum.
    owed: u64,
    /// Vacuum during a backlog once this many rows are owed.
    pub every: u64,
}

impl Default for Reclaim {
    fn default() -> Self {
        Self::new(EVERY)
    }
}

impl Reclaim {
    pub fn new(every: u64) -> Self {
        Self {
            first: true,
            owed: 0,
            every,
        }
    }

    /// A batch took `rows` off the queue.
    pub fn taken(&mut self, rows: u64) {
        self.owed += rows;
    }

    /// Whether to vacuum now; `drained`: the last batch did not fill.
    pub fn due(&self, drained: bool) -> bool {
        self.first || (self.owed > 0 && (drained || self.owed >= self.every))
    }

    /// The vacuum ran.
    pub fn done(&mut self) {
        self.first = false;
        self.owed = 0;
    }
}

/// Vacuums `archive_queue_batches` and its TOAST table (outside any
/// transaction); how long it took.
pub async fn vacuum_queue(pool: &PgPool) -> Result<Duration, ArchiveError> {
    let started = Instant::now();
    sqlx::raw_sql("VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) archive_queue_batches")
        .execute(pool)
        .await?;
    Ok(started.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vacuums_at_start_after_a_drain_and_during_a_long_backlog_only() {
        let mut r = Reclaim::new(1000);
        assert!(r.due(false), "once at start, whatever the queue holds");
        r.taken(1000);
        assert!(r.due(false), "at start, also behind a full batch");
        r.done();
        assert!(!r.due(true), "an idle poll owes nothing");
        r.taken(400);
        assert!(!r.due(false), "a backlog under `every`");
        assert!(r.due(true), "drained after taking rows");
        r.taken(600);
        assert!(r.due(false), "a backlog reaching `every`");
        r.done();
        assert!(!r.due(false) && !r.due(true));
    }
}
