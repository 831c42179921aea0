//! [`Outbox`], the handle requests and the relay hold: opening the
//! directory (recovering what a previous run left and starting the writer
//! thread), appending events with their answers, reading what is not yet
//! published, and marking what was.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableDatabase, ReadableTableMetadata};
use tokio::sync::{mpsc, oneshot, Notify};

use super::error::OutboxError;
use super::log::{self, Record, SEGMENT_BYTES};
use super::recovery::recover;
use super::shared::{Segment, Shared, State, ANSWERS, DEPTH_GAUGE};
use super::writer::{Append, Message, Writer, MAX_GROUP};

/// One stored event.
#[derive(Debug, Clone)]
pub struct Entry {
    pub seq: u64,
    pub enqueued_at_ms: i64,
    pub key: String,
    pub payload: Vec<u8>,
}

/// A handle to the outbox; cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    shared: Arc<Shared>,
    messages: mpsc::Sender<Message>,
    /// Wakes the relay when something was committed.
    pub committed: Arc<Notify>,
}

impl Outbox {
    /// Opens (or creates) the outbox directory, recovers what a previous
    /// run left, and starts the writer thread.
    pub fn open(dir: &Path) -> Result<Self, OutboxError> {
        std::fs::create_dir_all(dir)?;
        let lock = File::create(dir.join("lock"))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |_| OutboxError::Storage(format!("{} is in use by another process", dir.display())),
        )?;
        let answers = Database::create(dir.join("answers.redb"))?;
        let recovered = recover(dir, &answers)?;
        let index = recovered.segments.back().map_or(0, |s| s.index + 1);
        let file = log::create_segment(dir, index, SEGMENT_BYTES)?;
        let mut segments = recovered.segments;
        segments.push_back(Segment {
            index,
            end: 0,
            last_seq: None,
        });
        let read_from = (segments.front().map_or(index, |s| s.index), 0);
        let depth = recovered.next_seq - recovered.cursor;
        let shared = Arc::new(Shared {
            dir: dir.to_owned(),
            answers,
            state: Mutex::new(State {
                segments,
                cursor: recovered.cursor,
                acked: BTreeSet::new(),
                durable_cursor: recovered.cursor,
                read_from,
                answers_written: 0,
                answers_synced: 0,
            }),
            depth: AtomicU64::new(depth),
            _lock: lock,
        });
        metrics::gauge!(DEPTH_GAUGE).set(depth as f64);
        let (messages, rx) = mpsc::channel(MAX_GROUP * 4);
        let committed = Arc::new(Notify::new());
        let mut writer = Writer {
            shared: shared.clone(),
            file,
            index,
            offset: 0,
            capacity: SEGMENT_BYTES,
            spare: None,
            next_seq: recovered.next_seq,
            written_cursor: recovered.cursor,
            buf: Vec::new(),
            records: Vec::new(),
        };
        writer.prepare_spare();
        let notify = committed.clone();
        std::thread::Builder::new()
            .name("outbox-writer".into())
            .spawn(move || writer.run(rx, &notify))?;
        Ok(Self {
            shared,
            messages,
            committed,
        })
    }

    /// Appends one event and returns once it is durable on disk.
    pub async fn append(&self, key: String, payload: Vec<u8>) -> Result<(), OutboxError> {
        self.append_with_answer(key, payload, None).await
    }

    /// Appends one event and, in the same record, an idempotent answer.
    pub async fn append_with_answer(
        &self,
        key: String,
        payload: Vec<u8>,
        answer: Option<(Vec<u8>, Vec<u8>)>,
    ) -> Result<(), OutboxError> {
        let (done, wait) = oneshot::channel();
        self.messages
            .send(Message::Append(Append {
                key,
                payload,
                answer,
                done,
            }))
            .await
            .map_err(|_| OutboxError::Closed)?;
        wait.await.map_err(|_| OutboxError::Closed)?
    }

    /// A stored idempotent answer.
    pub fn answer(&self, key: &[u8]) -> Result<Option<Vec<u8>>, OutboxError> {
        let tx = self.shared.answers.begin_read()?;
        let table = match tx.open_table(ANSWERS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(table.get(key)?.map(|v| v.value().to_vec()))
    }

    /// Deletes the stored answers `expired` says are too old; returns how many.
    pub fn sweep_answers(&self, expired: impl Fn(&[u8]) -> bool) -> Result<u64, OutboxError> {
        let tx = self.shared.answers.begin_write()?;
        let removed = {
            let mut table = tx.open_table(ANSWERS)?;
            let before = table.len()?;
            table.retain(|_, v| !expired(v))?;
            before - table.len()?
        };
        tx.commit()?;
        Ok(removed)
    }

    /// The oldest `limit` events not yet published.
    pub fn peek(&self, limit: usize) -> Result<Vec<Entry>, OutboxError> {
        let (segments, cursor, acked, (start_index, mut offset)) = {
            let state = self.shared.state();
            (
                state.segments.clone(),
                state.cursor,
                state.acked.clone(),
                state.read_from,
            )
        };
        let mut out = Vec::with_capacity(limit.min(1024));
        // Records are skipped up to here for good: all below the cursor.
        let mut skipped_to = (start_index, offset);
        let mut only_old = true;
        for segment in segments.iter().filter(|s| s.index >= start_index) {
            let index = segment.index;
            if index > start_index {
                offset = 0;
            }
            if out.len() >= limit || offset >= segment.end {
                continue;
            }
            let file = File::open(log::segment_path(&self.shared.dir, segment.index))?;
            log::read_records(&file, offset, segment.end, |at, record| {
                let Record::Event(e) = record else {
                    return true;
                };
                if e.seq < cursor {
                    if only_old {
                        skipped_to = (index, at);
                    }
                    return true;
                }
                only_old = false;
                if acked.contains(&e.seq) {
                    return true;
                }
                out.push(Entry {
                    seq: e.seq,
                    enqueued_at_ms: e.enqueued_at_ms,
                    key: e.key,
                    payload: e.payload,
                });
                out.len() < limit
            })?;
        }
        let mut state = self.shared.state();
        if skipped_to > state.read_from {
            state.read_from = skipped_to;
        }
        Ok(out)
    }

    /// Marks events as published. The mark reaches the disk with the next
    /// flush (the relay calls [`Outbox::sync_removals`] when it has nothing
    /// else to do, and at shutdown); a flush of its own here would make the
    /// answers queued behind it wait. If the gateway dies before then, the
    /// events are published again and ingest counts them as duplicates.
    pub fn remove(&self, seqs: &[u64]) -> Result<(), OutboxError> {
        if seqs.is_empty() {
            return Ok(());
        }
        let removed = {
            let mut state = self.shared.state();
            let cursor = state.cursor;
            let before = state.acked.len();
            state.acked.extend(seqs.iter().filter(|s| **s >= cursor));
            let added = state.acked.len() - before;
            while state.acked.first() == Some(&state.cursor) {
                state.acked.pop_first();
                state.cursor += 1;
            }
            added as u64
        };
        let before = self.shared.depth.fetch_sub(removed, Ordering::Relaxed);
        metrics::gauge!(DEPTH_GAUGE).set(before.saturating_sub(removed) as f64);
        self.delete_published_segments()
    }

    /// Flushes the "published below" mark if it moved, then deletes the
    /// segments it covers.
    pub async fn sync_removals(&self) -> Result<(), OutboxError> {
        let (done, wait) = oneshot::channel();
        self.messages
            .send(Message::Sync(done))
            .await
            .map_err(|_| OutboxError::Closed)?;
        wait.await.map_err(|_| OutboxError::Closed)??;
        self.delete_published_segments()
    }

    /// Deletes the segment files whose events are all below the durable
    /// mark, after making the answers they hold durable in `answers.redb`.
    fn delete_published_segments(&self) -> Result<(), OutboxError> {
        let (doomed, answers_written) = {
            let state = self.shared.state();
            let writing = state.segments.len().saturating_sub(1);
            let doomed: Vec<u64> = state
                .segments
                .iter()
                .take(writing)
                .take_while(|s| s.last_seq.is_none_or(|l| l < state.durable_cursor))
                .map(|s| s.index)
                .collect();
            let unsynced =
                (state.answers_written > state.answers_synced).then_some(state.answers_written);
            (doomed, unsynced)
        };
        if doomed.is_empty() {
            return Ok(());
        }
        if let Some(written) = answers_written {
            // An empty durable commit persists the commits made without one.
            self.shared.answers.begin_write()?.commit()?;
            let mut state = self.shared.state();
            state.answers_synced = state.answers_synced.max(written);
        }
        for index in &doomed {
            match std::fs::remove_file(log::segment_path(&self.shared.dir, *index)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        let mut state = self.shared.state();
        state.segments.retain(|s| !doomed.contains(&s.index));
        Ok(())
    }

    /// Events waiting to be published (kept in memory, no disk read).
    pub fn depth(&self) -> u64 {
        self.shared.depth.load(Ordering::Relaxed)
    }
}

/// Opens `path` once the writer thread of a dropped handle let it go
/// (it does when it sees its channel closed).
#[cfg(test)]
pub(crate) async fn reopen(path: &Path) -> Outbox {
    for _ in 0..200 {
        if let Ok(o) = Outbox::open(path) {
            return o;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    #[allow(clippy::unwrap_used, reason = "tests fail loudly")]
    Outbox::open(path).unwrap()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    #[tokio::test]
    async fn appended_events_survive_reopen_until_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox");
        {
            let outbox = Outbox::open(&path).unwrap();
            for i in 0..10u8 {
                outbox.append("acme".into(), vec![i]).await.unwrap();
            }
            let first = outbox.peek(3).unwrap();
            outbox
                .remove(&first.iter().map(|e| e.seq).collect::<Vec<_>>())
                .unwrap();
            // Published out of order: stays published while running,
            // is sent again after a restart (the durable mark is a prefix).
            outbox.remove(&[5]).unwrap();
            assert_eq!(outbox.depth(), 6);
            let left: Vec<u8> = outbox
                .peek(100)
                .unwrap()
                .iter()
                .map(|e| e.payload[0])
                .collect();
            assert_eq!(left, vec![3, 4, 6, 7, 8, 9]);
            outbox.sync_removals().await.unwrap();
        }
        let outbox = reopen(&path).await;
        let left = outbox.peek(100).unwrap();
        assert_eq!(left.len(), 7);
        assert_eq!(left[0].payload, vec![3]);
        assert_eq!(left[0].key, "acme");
        assert_eq!(outbox.depth(), 7);
        outbox.append("acme".into(), vec![99]).await.unwrap();
        let all = outbox.peek(100).unwrap();
        assert!(
            all.last().unwrap().seq > left.last().unwrap().seq,
            "sequence keeps growing"
        );
    }

    #[tokio::test]
    async fn unsynced_removals_are_sent_again_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox");
        {
            let outbox = Outbox::open(&path).unwrap();
            for i in 0..4u8 {
                outbox.append("acme".into(), vec![i]).await.unwrap();
            }
            outbox.remove(&[0, 1]).unwrap();
            assert_eq!(outbox.peek(10).unwrap().len(), 2);
            // No flush after the removal: the mark is not on disk.
        }
        let outbox = reopen(&path).await;
        assert_eq!(outbox.peek(10).unwrap().len(), 4);
    }

    #[tokio::test]
    async fn segments_roll_and_published_ones_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox");
        let outbox = Outbox::open(&path).unwrap();
        // 40 events of 1 MiB fill three 16 MiB segments.
        let big = vec![b'x'; 1 << 20];
        let mut appends = Vec::new();
        for _ in 0..40 {
            let o = outbox.clone();
            let payload = big.clone();
            appends.push(tokio::spawn(async move {
                o.append("acme".into(), payload).await
            }));
        }
        for a in appends {
            a.await.unwrap().unwrap();
        }
        assert!(log::list_segments(&path).unwrap().len() >= 3);
        let mut seen = 0;
        loop {
            let round = outbox.peek(7).unwrap();
            if round.is_empty() {
                break;
            }
            assert_eq!(round[0].seq, seen, "in order, each once");
            seen += round.len() as u64;
            outbox
                .remove(&round.iter().map(|e| e.seq).collect::<Vec<_>>())
                .unwrap();
        }
        assert_eq!(seen, 40);
        outbox.sync_removals().await.unwrap();
        // Only the segment being written (and the spare being prepared) remain.
        let left = log::list_segments(&path).unwrap().len();
        assert!(left <= 2, "{left} segments left");
        assert_eq!(outbox.depth(), 0);
    }

    #[tokio::test]
    async fn answers_come_back_from_the_log_if_the_index_lost_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox");
        {
            let outbox = Outbox::open(&path).unwrap();
            outbox
                .append_with_answer(
                    "acme".into(),
                    b"{}".to_vec(),
                    Some((b"k".to_vec(), b"v".to_vec())),
                )
                .await
                .unwrap();
            assert_eq!(outbox.answer(b"k").unwrap(), Some(b"v".to_vec()));
        }
        // As if the answers file had lost its unflushed commit.
        drop(reopen(&path).await);
        std::fs::remove_file(path.join("answers.redb")).unwrap();
        let outbox = reopen(&path).await;
        assert_eq!(outbox.answer(b"k").unwrap(), Some(b"v".to_vec()));
    }

    #[test]
    fn a_second_process_cannot_open_the_same_outbox() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let _first = Outbox::open(dir.path()).unwrap();
        let err = Outbox::open(dir.path()).err().unwrap();
        assert!(err.to_string().contains("in use"), "{err}");
    }
}
