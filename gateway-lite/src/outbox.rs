//! The durable local outbox: every usage event is written here, and
//! fsynced, before the client gets its answer, so a gateway killed at any
//! instant loses no event a client was answered for.
//!
//! One writer task owns the file. Requests hand it their event and wait for
//! the commit; the writer takes everything queued and commits it in one
//! redb transaction (group commit), so durability costs one fsync per
//! batch, not per request. Entries are keyed by a sequence number and
//! deleted only after the relay's broker acknowledged them; deletions ride
//! on the next durable commit instead of paying a flush of their own.
//!
//! The answers of requests sent with an `Idempotency-Key` are kept here
//! too, committed in the same transaction as their usage event: a retry
//! after a crash finds the answer if and only if the request was billed.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};
use tokio::sync::{mpsc, oneshot, Notify};

/// seq → (enqueued at, unix ms) ++ event JSON.
const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("usage_events");
/// (api key id, NUL, Idempotency-Key) → answer (see `idempotency`).
const ANSWERS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idempotent_answers");
/// Events waiting in the outbox, kept current by every append and delete.
pub const DEPTH_GAUGE: &str = "gateway_outbox_depth";
/// The most a writer commit takes at once.
const MAX_GROUP: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("outbox storage: {0}")]
    Storage(String),
    #[error("outbox writer has stopped")]
    Closed,
}

macro_rules! storage_err {
    ($($t:ty),*) => {$(
        impl From<$t> for OutboxError {
            fn from(e: $t) -> Self { Self::Storage(e.to_string()) }
        }
    )*};
}
storage_err!(
    redb::SetDurabilityError,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// One stored event.
#[derive(Debug, Clone)]
pub struct Entry {
    pub seq: u64,
    pub enqueued_at_ms: i64,
    pub key: String,
    pub payload: Vec<u8>,
}

struct Append {
    key: String,
    payload: Vec<u8>,
    /// An idempotent answer to store with the event: (key, value).
    answer: Option<(Vec<u8>, Vec<u8>)>,
    done: oneshot::Sender<Result<(), OutboxError>>,
}

/// A handle to the outbox; cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    db: Arc<Database>,
    appends: mpsc::Sender<Append>,
    /// Wakes the relay when something was committed.
    pub committed: Arc<Notify>,
    depth: Arc<AtomicU64>,
    /// Set by a removal that is not on disk yet (see [`Outbox::remove`]).
    unsynced_removals: Arc<AtomicBool>,
}

impl Outbox {
    /// Opens (or creates) the outbox file and starts its writer task.
    pub fn open(path: &Path) -> Result<Self, OutboxError> {
        let db = Arc::new(Database::create(path)?);
        let next_seq = {
            let tx = db.begin_write()?;
            let last = {
                let table = tx.open_table(EVENTS)?;
                let last = table.last()?.map(|(k, _)| k.value());
                last
            };
            tx.commit()?;
            last.map_or(0, |s| s + 1)
        };
        let depth = Arc::new(AtomicU64::new(0));
        let (appends, rx) = mpsc::channel(MAX_GROUP * 4);
        let committed = Arc::new(Notify::new());
        let outbox = Self {
            db: db.clone(),
            appends,
            committed: committed.clone(),
            depth: depth.clone(),
            unsynced_removals: Arc::new(AtomicBool::new(false)),
        };
        depth.store(outbox.len()?, Ordering::Relaxed);
        metrics::gauge!(DEPTH_GAUGE).set(outbox.depth() as f64);
        std::thread::Builder::new()
            .name("outbox-writer".into())
            .spawn(move || writer(db, rx, next_seq, committed, depth))
            .map_err(|e| OutboxError::Storage(e.to_string()))?;
        Ok(outbox)
    }

    /// Appends one event and returns once it is durable on disk.
    pub async fn append(&self, key: String, payload: Vec<u8>) -> Result<(), OutboxError> {
        self.append_with_answer(key, payload, None).await
    }

    /// Appends one event and, in the same commit, an idempotent answer.
    pub async fn append_with_answer(
        &self,
        key: String,
        payload: Vec<u8>,
        answer: Option<(Vec<u8>, Vec<u8>)>,
    ) -> Result<(), OutboxError> {
        let (done, wait) = oneshot::channel();
        self.appends
            .send(Append {
                key,
                payload,
                answer,
                done,
            })
            .await
            .map_err(|_| OutboxError::Closed)?;
        wait.await.map_err(|_| OutboxError::Closed)?
    }

    /// A stored idempotent answer.
    pub fn answer(&self, key: &[u8]) -> Result<Option<Vec<u8>>, OutboxError> {
        let tx = self.db.begin_read()?;
        let table = match tx.open_table(ANSWERS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(table.get(key)?.map(|v| v.value().to_vec()))
    }

    /// Deletes the stored answers `expired` says are too old; returns how many.
    pub fn sweep_answers(&self, expired: impl Fn(&[u8]) -> bool) -> Result<u64, OutboxError> {
        let tx = self.db.begin_write()?;
        let removed = {
            let mut table = tx.open_table(ANSWERS)?;
            let before = table.len()?;
            table.retain(|_, v| !expired(v))?;
            before - table.len()?
        };
        tx.commit()?;
        Ok(removed)
    }

    /// The oldest `limit` entries.
    pub fn peek(&self, limit: usize) -> Result<Vec<Entry>, OutboxError> {
        let tx = self.db.begin_read()?;
        let table = match tx.open_table(EVENTS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::with_capacity(limit.min(1024));
        for row in table.iter()?.take(limit) {
            let (k, v) = row?;
            if let Some(entry) = decode_entry(k.value(), v.value()) {
                out.push(entry);
            }
        }
        Ok(out)
    }

    /// Deletes entries the broker acknowledged, without waiting for the
    /// disk: the next append's commit makes the deletion durable with it
    /// (the relay calls [`Outbox::sync_removals`] when it has nothing else
    /// to do, and at shutdown). An fsync here would hold the single writer
    /// lock and make the answers queued behind it wait a second flush. If
    /// the gateway dies before then, the entries are published again and
    /// ingest counts the re-send as a duplicate: harmless, never lost.
    pub fn remove(&self, seqs: &[u64]) -> Result<(), OutboxError> {
        if seqs.is_empty() {
            return Ok(());
        }
        let mut tx = self.db.begin_write()?;
        tx.set_durability(Durability::None)?;
        {
            let mut table = tx.open_table(EVENTS)?;
            for seq in seqs {
                table.remove(seq)?;
            }
        }
        tx.commit()?;
        self.unsynced_removals.store(true, Ordering::Release);
        let before = self.depth.fetch_sub(seqs.len() as u64, Ordering::Relaxed);
        metrics::gauge!(DEPTH_GAUGE).set(before.saturating_sub(seqs.len() as u64) as f64);
        Ok(())
    }

    /// Makes earlier removals durable (one empty commit), if any are not.
    pub fn sync_removals(&self) -> Result<(), OutboxError> {
        if !self.unsynced_removals.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let synced = self
            .db
            .begin_write()
            .map_err(OutboxError::from)
            .and_then(|tx| Ok(tx.commit()?));
        if synced.is_err() {
            self.unsynced_removals.store(true, Ordering::Release);
        }
        synced
    }

    /// Entries waiting to be published.
    pub fn len(&self) -> Result<u64, OutboxError> {
        let tx = self.db.begin_read()?;
        match tx.open_table(EVENTS) {
            Ok(t) => Ok(t.len()?),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// The depth kept in memory (no disk read), for metrics.
    pub fn depth(&self) -> u64 {
        self.depth.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> Result<bool, OutboxError> {
        Ok(self.len()? == 0)
    }
}

fn encode_entry(enqueued_at_ms: i64, key: &str, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + 2 + key.len() + payload.len());
    v.extend_from_slice(&enqueued_at_ms.to_be_bytes());
    v.extend_from_slice(&(key.len() as u16).to_be_bytes());
    v.extend_from_slice(key.as_bytes());
    v.extend_from_slice(payload);
    v
}

fn decode_entry(seq: u64, v: &[u8]) -> Option<Entry> {
    let ts = i64::from_be_bytes(v.get(..8)?.try_into().ok()?);
    let klen = u16::from_be_bytes(v.get(8..10)?.try_into().ok()?) as usize;
    let key = std::str::from_utf8(v.get(10..10 + klen)?).ok()?.to_owned();
    Some(Entry {
        seq,
        enqueued_at_ms: ts,
        key,
        payload: v.get(10 + klen..)?.to_vec(),
    })
}

fn writer(
    db: Arc<Database>,
    mut rx: mpsc::Receiver<Append>,
    mut next_seq: u64,
    committed: Arc<Notify>,
    depth: Arc<AtomicU64>,
) {
    let mut group: Vec<Append> = Vec::with_capacity(MAX_GROUP);
    while let Some(first) = rx.blocking_recv() {
        group.push(first);
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(a) => group.push(a),
                Err(_) => break,
            }
        }
        let now = chrono::Utc::now().timestamp_millis();
        let result = commit_group(&db, &group, next_seq, now);
        let ok = result.is_ok();
        if ok {
            next_seq += group.len() as u64;
            let now_depth =
                depth.fetch_add(group.len() as u64, Ordering::Relaxed) + group.len() as u64;
            metrics::gauge!(DEPTH_GAUGE).set(now_depth as f64);
        }
        for a in group.drain(..) {
            let _ = a.done.send(match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(OutboxError::Storage(e.to_string())),
            });
        }
        if ok {
            committed.notify_one();
        }
    }
}

fn commit_group(
    db: &Database,
    group: &[Append],
    first_seq: u64,
    now: i64,
) -> Result<(), OutboxError> {
    let tx = db.begin_write()?;
    {
        let mut table = tx.open_table(EVENTS)?;
        for (i, a) in group.iter().enumerate() {
            table.insert(
                first_seq + i as u64,
                encode_entry(now, &a.key, &a.payload).as_slice(),
            )?;
        }
        if group.iter().any(|a| a.answer.is_some()) {
            let mut answers = tx.open_table(ANSWERS)?;
            for (k, v) in group.iter().filter_map(|a| a.answer.as_ref()) {
                answers.insert(k.as_slice(), v.as_slice())?;
            }
        }
    }
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn appended_events_survive_reopen_until_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox.redb");
        {
            let outbox = Outbox::open(&path).unwrap();
            for i in 0..10u8 {
                outbox.append("acme".into(), vec![i]).await.unwrap();
            }
            let first = outbox.peek(3).unwrap();
            outbox
                .remove(&first.iter().map(|e| e.seq).collect::<Vec<_>>())
                .unwrap();
        }
        // Give the writer thread of the first handle time to release the file.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let outbox = Outbox::open(&path).unwrap();
        let left = outbox.peek(100).unwrap();
        assert_eq!(left.len(), 7);
        assert_eq!(left[0].payload, vec![3]);
        assert_eq!(left[0].key, "acme");
        outbox.append("acme".into(), vec![99]).await.unwrap();
        let all = outbox.peek(100).unwrap();
        assert!(
            all.last().unwrap().seq > left.last().unwrap().seq,
            "sequence keeps growing"
        );
    }
}
