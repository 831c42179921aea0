//! The archiver's batch loop: the consumer's feed → planned pieces →
//! Parquet files in the store → one manifest transaction.
//!
//! A batch is written when it reaches `max_batch` messages or `max_bytes`
//! of payload, or when its first message has waited `linger`. Order of a
//! batch: encode every file, write every file (atomically, fsync'd), then
//! commit the manifest rows and move the archive offsets by compare-and-set
//! in one Postgres transaction. A failure anywhere before the commit keeps
//! the batch in memory and retries it, re-writing the same files; a crash
//! leaves orphan files that the next attempt overwrites or that
//! `archiver verify` lists.
//!
//! Every second, also while no message arrives, the archiver reads its
//! stored archive offsets and compares them with the positions it holds,
//! as ingest does (see `crate::batcher`): if Postgres went back (a
//! failover to a standby that was behind, a restored backup) or another
//! archiver moved them, it stops as fenced and the session rejoins from
//! what is stored. The same read sets `archive_lag`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tokio::sync::mpsc;

use crate::archive::manifest::{self, Entry, Outcome};
use crate::archive::plan::{plan, Plan};
use crate::archive::store;
use crate::archive::telemetry::{self, Committed};
use crate::archive::writer;
use crate::batch::RawMessage;
use crate::batcher::Stopped;
use crate::consumer::{Feed, HighWatermarks};
use crate::error::IngestError;
use crate::offsets::{self, ConsumerKey, Ledger};

/// Batching limits.
#[derive(Debug, Clone, Copy)]
pub struct ArchiveLimits {
    pub max_batch: usize,
    pub max_bytes: usize,
    pub linger: Duration,
    /// Fault tests only: abort after writing the files of this many batches,
    /// before the commit (0: never).
    pub crash_after_write: u64,
}

pub struct Archiver {
    pool: PgPool,
    store: Arc<dyn ObjectStore>,
    key: ConsumerKey,
    limits: ArchiveLimits,
    /// Owned partitions and the stored archive offset this archiver believes in.
    owned: BTreeMap<i32, Option<i64>>,
    pending: Vec<RawMessage>,
    pending_bytes: usize,
    first_at: Option<Instant>,
    watermarks: HighWatermarks,
    /// Batches whose files this process has written.
    written: u64,
}

/// A planned batch with its files encoded.
struct Encoded {
    plan: Plan,
    rows: u64,
    files: Vec<(String, bytes::Bytes)>,
    entries: Vec<Entry>,
}

impl Archiver {
    pub fn new(
        pool: PgPool,
        store: Arc<dyn ObjectStore>,
        key: ConsumerKey,
        limits: ArchiveLimits,
        watermarks: HighWatermarks,
    ) -> Self {
        Self {
            pool,
            store,
            key,
            limits,
            owned: BTreeMap::new(),
            pending: Vec::new(),
            pending_bytes: 0,
            first_at: None,
            watermarks,
            written: 0,
        }
    }

    /// Runs until the feed closes or this archiver is fenced.
    pub async fn run(mut self, mut feed: mpsc::Receiver<Feed>) -> Stopped {
        // The stored offsets are checked (and lag reported from them) on a
        // tick, so both happen while nothing commits.
        let mut check = tokio::time::interval(Duration::from_secs(1));
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let deadline = self.first_at.map(|t| t + self.limits.linger);
            let next = tokio::select! {
                next = feed.recv() => next,
                _ = check.tick() => {
                    if let Err(moved) = self.check_offsets().await {
                        return Stopped::Fenced(moved);
                    }
                    continue;
                }
                () = sleep_until(deadline) => {
                    if let Err(fenced) = self.flush().await {
                        return Stopped::Fenced(fenced);
                    }
                    continue;
                }
            };
            match next {
                None => {
                    return match self.flush().await {
                        Ok(()) => Stopped::Drained,
                        Err(fenced) => Stopped::Fenced(fenced),
                    }
                }
                Some(Feed::Assigned(stored)) => {
                    self.owned.extend(stored);
                    self.report_lag(&self.owned);
                }
                Some(Feed::Revoked(partitions, ack)) => {
                    let flushed = self.flush().await;
                    for p in &partitions {
                        self.owned.remove(p);
                    }
                    let _ = ack.send(());
                    if let Err(fenced) = flushed {
                        return Stopped::Fenced(fenced);
                    }
                }
                Some(Feed::Messages(messages)) => {
                    self.accept(messages);
                    if self.pending.len() >= self.limits.max_batch
                        || self.pending_bytes >= self.limits.max_bytes
                    {
                        if let Err(fenced) = self.flush().await {
                            return Stopped::Fenced(fenced);
                        }
                    }
                }
            }
        }
    }

    /// Keeps messages of owned partitions that are not archived yet.
    fn accept(&mut self, messages: Vec<RawMessage>) {
        for m in messages {
            let Some(stored) = self.owned.get(&m.partition) else {
                continue;
            };
            if stored.is_some_and(|next| m.offset < next) {
                continue;
            }
            if self.first_at.is_none() {
                self.first_at = Some(Instant::now());
            }
            self.pending_bytes += m.payload.len();
            self.pending.push(m);
        }
    }

    /// Archives what is pending, retrying until it lands. `Err` carries the
    /// partitions this archiver has been fenced out of.
    async fn flush(&mut self) -> Result<(), Vec<i32>> {
        let mut backoff = Duration::from_millis(100);
        while !self.pending.is_empty() {
            let started = Instant::now();
            match self.write_and_commit().await {
                Ok((Outcome::Committed, encoded, commit_took)) => {
                    let committed = Committed {
                        files: encoded.files.len() as u64,
                        rows: encoded.rows,
                        bytes: encoded.files.iter().map(|(_, b)| b.len() as u64).sum(),
                        skipped: encoded.plan.skipped.into_iter().collect(),
                    };
                    telemetry::record_batch(&committed, commit_took, started.elapsed());
                    tracing::debug!(
                        files = committed.files,
                        rows = committed.rows,
                        bytes = committed.bytes,
                        "batch archived"
                    );
                    for (p, next) in encoded.plan.next_offsets {
                        self.owned.insert(p, Some(next));
                    }
                    self.clear();
                    self.report_lag(&self.owned);
                }
                Ok((Outcome::Stale { done, fenced }, encoded, _)) => {
                    if !fenced.is_empty() {
                        tracing::warn!(
                            ?fenced,
                            "archive offsets moved by another archiver; rejoining"
                        );
                        self.clear();
                        return Err(fenced);
                    }
                    tracing::info!(?done, "batch already archived for these partitions");
                    for p in done {
                        if let Some(next) = encoded.plan.next_offsets.get(&p) {
                            self.owned.insert(p, Some(*next));
                        }
                        self.pending.retain(|m| m.partition != p);
                    }
                    self.pending_bytes = self.pending.iter().map(|m| m.payload.len()).sum();
                    if self.pending.is_empty() {
                        self.first_at = None;
                    }
                }
                Err(e) => {
                    telemetry::record_error();
                    tracing::warn!(error = %e, retry_in = ?backoff, "archive batch failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.pending.clear();
        self.pending_bytes = 0;
        self.first_at = None;
    }

    /// Plans and encodes the pending batch, writes its files, then commits.
    async fn write_and_commit(&mut self) -> Result<(Outcome, Encoded, Duration), IngestError> {
        let messages = std::mem::take(&mut self.pending);
        let starts = self.owned.clone();
        let topic = self.key.topic.clone();
        // Decoding and Parquet encoding are CPU work: off the async workers.
        // The messages go along and come back (no copy of the batch).
        let (encoded, messages) = tokio::task::spawn_blocking(move || {
            let encoded = encode(&messages, &starts, &topic);
            (encoded, messages)
        })
        .await
        .map_err(|e| IngestError::Parquet(format!("encoder task failed: {e}")))?;
        self.pending = messages;
        let encoded = encoded?;
        for (path, bytes) in &encoded.files {
            store::put(self.store.as_ref(), path, bytes.clone()).await?;
        }
        self.written += 1;
        if self.written == self.limits.crash_after_write {
            tracing::error!("ARCHIVE_TEST_CRASH_AFTER_WRITE: aborting before the commit");
            std::process::abort();
        }
        let commit_started = Instant::now();
        let outcome = manifest::commit(
            &self.pool,
            &self.key,
            &self.owned,
            &encoded.plan.next_offsets,
            &encoded.entries,
        )
        .await?;
        Ok((outcome, encoded, commit_started.elapsed()))
    }

    /// Compares the stored archive offsets with the held positions; `Err`:
    /// the partitions that differ. A failed read changes nothing.
    async fn check_offsets(&self) -> Result<(), Vec<i32>> {
        if self.owned.is_empty() {
            return Ok(());
        }
        let check = match offsets::check_held(&self.pool, Ledger::Archive, &self.key, &self.owned)
            .await
        {
            Ok(check) => check,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read archive offsets; checking again later");
                return Ok(());
            }
        };
        self.report_lag(&check.stored);
        if check.differing.is_empty() {
            return Ok(());
        }
        tracing::warn!(
            partitions = ?check.differing,
            "stored archive offsets differ from the positions held (postgres went back, or \
             another archiver moved them); rejoining to start from the stored offsets"
        );
        Err(check.differing)
    }

    fn report_lag(&self, next: &BTreeMap<i32, Option<i64>>) {
        let Ok(marks) = self.watermarks.lock() else {
            return;
        };
        for (p, next) in next {
            if let Some(high) = marks.get(p) {
                telemetry::record_lag(*p, (high - next.unwrap_or(0)).max(0));
            }
        }
    }
}

/// Plans a batch and encodes one Parquet file per piece with rows.
fn encode(
    messages: &[RawMessage],
    starts: &BTreeMap<i32, Option<i64>>,
    topic: &str,
) -> Result<Encoded, IngestError> {
    let mut plan = plan(messages, starts);
    let rows = plan.rows() as u64;
    let mut files = Vec::new();
    let mut entries = Vec::with_capacity(plan.pieces.len());
    for piece in &mut plan.pieces {
        let path = piece.path(topic);
        let (bytes, sha256) = match &path {
            Some(path) => {
                let bytes = writer::encode(&piece.rows)?;
                let sha: [u8; 32] = Sha256::digest(&bytes).into();
                let size = bytes.len() as i64;
                files.push((path.clone(), bytes::Bytes::from(bytes)));
                (size, Some(sha))
            }
            None => (0, None),
        };
        entries.push(Entry {
            partition: piece.partition,
            first_offset: piece.first_offset,
            last_offset: piece.last_offset,
            path,
            hour: piece.hour,
            rows: piece.rows.len() as i64,
            skipped: piece.skipped as i64,
            bytes,
            sha256,
        });
        // The rows are in the file now; the entry keeps their count.
        piece.rows = Vec::new();
    }
    Ok(Encoded {
        plan,
        rows,
        files,
        entries,
    })
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
