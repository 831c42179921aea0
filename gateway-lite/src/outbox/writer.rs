//! The writer thread: the only one that appends to the log. It takes
//! everything queued, appends it in one write and flushes once (group
//! commit), rolls to a fresh segment when one is full, and keeps the next
//! segment preallocated in the background. What handles send it
//! ([`Message`]) is declared here, beside the loop that receives it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use redb::Durability;
use tokio::sync::{mpsc, oneshot, Notify};

use super::error::OutboxError;
use super::log::{self, SEGMENT_BYTES};
use super::shared::{Segment, Shared, ANSWERS, DEPTH_GAUGE};

/// The most a writer flush takes at once.
pub(super) const MAX_GROUP: usize = 4096;

/// One event (and maybe its answer) a handle sends the writer; `done`
/// hears once it is durable.
pub(super) struct Append {
    pub(super) key: String,
    pub(super) payload: Vec<u8>,
    /// An idempotent answer to store with the event: (key, value).
    pub(super) answer: Option<(Vec<u8>, Vec<u8>)>,
    pub(super) done: oneshot::Sender<Result<(), OutboxError>>,
}

/// What handles send the writer thread.
pub(super) enum Message {
    Append(Append),
    /// Flush the "published below" mark now.
    Sync(oneshot::Sender<Result<(), OutboxError>>),
}

/// The writer thread's state.
pub(super) struct Writer {
    pub(super) shared: Arc<Shared>,
    pub(super) file: File,
    pub(super) index: u64,
    pub(super) offset: u64,
    pub(super) capacity: u64,
    /// The next segment, being preallocated off the writer's path.
    pub(super) spare: Option<std::thread::JoinHandle<std::io::Result<File>>>,
    pub(super) next_seq: u64,
    pub(super) written_cursor: u64,
    pub(super) buf: Vec<u8>,
    /// Where each record of `buf` ends, with its event's sequence number.
    pub(super) records: Vec<(usize, Option<u64>)>,
}

impl Writer {
    pub(super) fn run(mut self, mut rx: mpsc::Receiver<Message>, committed: &Notify) {
        let mut group: Vec<Append> = Vec::with_capacity(MAX_GROUP);
        let mut syncs = Vec::new();
        while let Some(first) = rx.blocking_recv() {
            let mut next = Some(first);
            while let Some(message) = next.take() {
                match message {
                    Message::Append(a) => group.push(a),
                    Message::Sync(done) => syncs.push(done),
                }
                if group.len() < MAX_GROUP {
                    next = rx.try_recv().ok();
                }
            }
            let result = self.commit(&group);
            if result.is_ok() && !group.is_empty() {
                let now = self
                    .shared
                    .depth
                    .fetch_add(group.len() as u64, Ordering::Relaxed)
                    + group.len() as u64;
                metrics::gauge!(DEPTH_GAUGE).set(now as f64);
            }
            for done in syncs.drain(..) {
                let _ = done.send(result.clone());
            }
            for a in group.drain(..) {
                let _ = a.done.send(result.clone());
            }
            if result.is_ok() {
                committed.notify_one();
            }
        }
    }

    /// Appends `group` (and the "published below" mark, if it moved) and
    /// flushes; then stores the group's answers.
    fn commit(&mut self, group: &[Append]) -> Result<(), OutboxError> {
        let now = chrono::Utc::now().timestamp_millis();
        self.buf.clear();
        self.records.clear();
        for (i, a) in group.iter().enumerate() {
            let seq = self.next_seq + i as u64;
            let answer = a.answer.as_ref().map(|(k, v)| (k.as_slice(), v.as_slice()));
            log::encode_event(&mut self.buf, seq, now, &a.key, &a.payload, answer)?;
            self.records.push((self.buf.len(), Some(seq)));
        }
        let cursor = self.shared.state().cursor;
        if cursor > self.written_cursor {
            log::encode_published(&mut self.buf, cursor)?;
            self.records.push((self.buf.len(), None));
        }
        if self.buf.is_empty() {
            return Ok(());
        }
        self.write_records()?;
        self.next_seq += group.len() as u64;
        self.written_cursor = self.written_cursor.max(cursor);
        let with_answers = group.iter().any(|a| a.answer.is_some());
        if with_answers {
            // Written without a flush: the log record is the durable copy
            // until the segment is deleted (see `delete_published_segments`).
            if let Err(e) = self.store_answers(group) {
                tracing::error!(error = %e, "cannot index idempotent answers; they are in the log and come back at the next start");
            }
        }
        let mut state = self.shared.state();
        state.durable_cursor = state.durable_cursor.max(cursor);
        if with_answers {
            state.answers_written += 1;
        }
        Ok(())
    }

    /// Writes `buf` record by record into segments, rolling to a new one
    /// when a record does not fit, and flushes every segment it wrote to.
    fn write_records(&mut self) -> Result<(), OutboxError> {
        let mut start = 0usize;
        let mut pending = 0usize;
        while pending < self.records.len() {
            let room = (self.capacity - self.offset) as usize;
            let fits = self.records[pending..]
                .iter()
                .take_while(|(end, _)| end - start <= room)
                .count();
            if fits == 0 {
                // Everything written so far is flushed already.
                self.roll((self.records[pending].0 - start) as u64)?;
                continue;
            }
            let (end, _) = self.records[pending + fits - 1];
            self.file.write_all_at(&self.buf[start..end], self.offset)?;
            self.offset += (end - start) as u64;
            let last_seq = self.records[pending..pending + fits]
                .iter()
                .rev()
                .find_map(|(_, seq)| *seq);
            self.file.sync_data()?;
            let mut state = self.shared.state();
            if let Some(segment) = state.segments.back_mut() {
                segment.end = self.offset;
                segment.last_seq = last_seq.or(segment.last_seq);
            }
            drop(state);
            pending += fits;
            start = end;
        }
        Ok(())
    }

    /// Moves to the next segment. It is preallocated in the background
    /// after every roll, so the writer rarely waits for it.
    fn roll(&mut self, need: u64) -> Result<(), OutboxError> {
        let index = self.index + 1;
        let capacity = need.max(SEGMENT_BYTES);
        let file = match self.spare.take().map(std::thread::JoinHandle::join) {
            Some(Ok(Ok(file))) if capacity == SEGMENT_BYTES => file,
            _ => {
                // No spare (yet), it failed, or it is too small: make it here.
                let path = log::segment_path(&self.shared.dir, index);
                match std::fs::remove_file(path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                    _ => {}
                }
                log::create_segment(&self.shared.dir, index, capacity)?
            }
        };
        self.file = file;
        self.index = index;
        self.offset = 0;
        self.capacity = capacity;
        self.shared.state().segments.push_back(Segment {
            index,
            end: 0,
            last_seq: None,
        });
        self.prepare_spare();
        Ok(())
    }

    /// Starts preallocating the segment after the current one.
    pub(super) fn prepare_spare(&mut self) {
        let dir = self.shared.dir.clone();
        let index = self.index + 1;
        self.spare = std::thread::Builder::new()
            .name("outbox-prealloc".into())
            .spawn(move || log::create_segment(&dir, index, SEGMENT_BYTES))
            .ok();
    }

    fn store_answers(&self, group: &[Append]) -> Result<(), OutboxError> {
        let mut tx = self.shared.answers.begin_write()?;
        tx.set_durability(Durability::None)?;
        {
            let mut table = tx.open_table(ANSWERS)?;
            for (k, v) in group.iter().filter_map(|a| a.answer.as_ref()) {
                table.insert(k.as_slice(), v.as_slice())?;
            }
        }
        tx.commit()?;
        Ok(())
    }
}
