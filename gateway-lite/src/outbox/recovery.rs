//! Opening an outbox a previous run left: which segments hold what, how
//! far publishing had durably got, and the idempotent answers to put back.

use std::collections::VecDeque;
use std::fs::File;
use std::path::Path;

use redb::Database;

use super::error::OutboxError;
use super::log::{self, Record};
use super::shared::{Segment, ANSWERS};

/// What a previous run left in the directory.
pub(super) struct Recovered {
    pub segments: VecDeque<Segment>,
    pub cursor: u64,
    pub next_seq: u64,
}

/// Reads every segment, deletes those with no records (spares prepared but
/// never used), and puts the answers found back into `answers.redb`.
pub(super) fn recover(dir: &Path, answers: &Database) -> Result<Recovered, OutboxError> {
    let mut segments = VecDeque::new();
    let mut published: Option<u64> = None;
    let mut first_seq: Option<u64> = None;
    let mut next_seq = 0u64;
    let tx = answers.begin_write()?;
    {
        let mut table = tx.open_table(ANSWERS)?;
        for index in log::list_segments(dir)? {
            let path = log::segment_path(dir, index);
            let file = File::open(&path)?;
            let len = file.metadata()?.len();
            let mut last_seq = None;
            let mut failed = None;
            let end = log::read_records(&file, 0, len, |_, record| {
                match record {
                    Record::Published { below } => {
                        published = Some(published.map_or(below, |p| p.max(below)));
                    }
                    Record::Event(e) => {
                        if e.seq < next_seq {
                            // Sequence numbers only grow: this is not ours.
                            return false;
                        }
                        first_seq.get_or_insert(e.seq);
                        next_seq = e.seq + 1;
                        last_seq = Some(e.seq);
                        if let Some((k, v)) = &e.answer {
                            if let Err(err) = table.insert(k.as_slice(), v.as_slice()) {
                                failed = Some(err);
                                return false;
                            }
                        }
                    }
                }
                true
            })?;
            if let Some(err) = failed {
                return Err(err.into());
            }
            if end == 0 {
                std::fs::remove_file(&path)?;
                continue;
            }
            segments.push_back(Segment {
                index,
                end,
                last_seq,
            });
        }
    }
    tx.commit()?;
    // Without a surviving mark, everything still on disk goes out again;
    // sequence numbers below the first on disk are gone (all published).
    let cursor = match (published, first_seq) {
        (Some(p), Some(f)) => p.max(f),
        (p, f) => p.or(f).unwrap_or(0),
    };
    Ok(Recovered {
        segments,
        cursor,
        next_seq: next_seq.max(cursor),
    })
}
