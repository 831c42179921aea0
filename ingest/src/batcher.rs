//! Turns the consumer's feed into committed batches.
//!
//! A batch is flushed when it reaches `max_batch` messages or when its
//! first message has waited `linger`. A failed commit (Postgres away) is
//! retried with backoff, the batch kept in memory and the consumer held
//! back by the bounded channel, so ingest keeps its place and resumes by
//! itself.
//!
//! Every `offset_check`, also while no message arrives, the batcher reads
//! the offsets stored in Postgres for the partitions it owns and compares
//! them with the positions it holds. They differ when Postgres lost
//! commits (a crash with `synchronous_commit = off`, a failover to a
//! standby that was behind, a restored backup) or when another consumer
//! moved them; either way the batcher stops as fenced and the session
//! rejoins the group, starting again from what is stored. Without the
//! check, lost commits were consumed again only when the next message
//! reached that partition — never, on an idle one. The same read sets the
//! lag gauge, so lag is measured from what is stored, not believed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::mpsc;

use crate::batch::{split_prepared, RawMessage};
use crate::consumer::{Feed, HighWatermarks};
use crate::offsets::{self, ConsumerKey, Ledger};
use crate::store::{self, Outcome, Partitions, Writes};
use crate::telemetry;

/// Batching limits.
#[derive(Debug, Clone, Copy)]
pub struct BatchSettings {
    pub max_batch: usize,
    pub linger: Duration,
    /// How batches are written and committed.
    pub writes: Writes,
    /// How often the stored offsets are compared with the held positions.
    pub offset_check: Duration,
}

/// Why the batcher stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Stopped {
    /// The feed closed (shutdown): everything received was committed.
    Drained,
    /// Another consumer moved these partitions' offsets: this one is a
    /// zombie and must rejoin the group to get a fresh assignment.
    Fenced(Vec<i32>),
}

pub struct Batcher {
    pool: PgPool,
    key: ConsumerKey,
    settings: BatchSettings,
    /// Owned partitions and the stored offset this consumer believes in.
    owned: BTreeMap<i32, Option<i64>>,
    pending: Vec<RawMessage>,
    first_at: Option<Instant>,
    partitions: Partitions,
    watermarks: HighWatermarks,
}

impl Batcher {
    pub fn new(
        pool: PgPool,
        key: ConsumerKey,
        settings: BatchSettings,
        watermarks: HighWatermarks,
    ) -> Self {
        Self {
            pool,
            key,
            settings,
            owned: BTreeMap::new(),
            pending: Vec::with_capacity(settings.max_batch),
            first_at: None,
            partitions: Partitions::default(),
            watermarks,
        }
    }

    /// Runs until the feed closes or this consumer is fenced.
    pub async fn run(mut self, mut feed: mpsc::Receiver<Feed>) -> Stopped {
        let mut check = tokio::time::interval(self.settings.offset_check);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let deadline = self.first_at.map(|t| t + self.settings.linger);
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
                Some(Feed::Assigned(stored)) => self.owned.extend(stored),
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
                    if self.pending.len() >= self.settings.max_batch {
                        if let Err(fenced) = self.flush().await {
                            return Stopped::Fenced(fenced);
                        }
                    }
                }
            }
        }
    }

    /// Keeps messages of owned partitions that are not committed yet.
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
            self.pending.push(m);
        }
    }

    /// Commits what is pending, retrying until it lands. `Err` carries the
    /// partitions this consumer has been fenced out of.
    async fn flush(&mut self) -> Result<(), Vec<i32>> {
        let mut backoff = Duration::from_millis(100);
        while !self.pending.is_empty() {
            let decoded = split_prepared(&mut self.pending, chrono::Utc::now());
            let size = decoded.len();
            let next_offsets = decoded.next_offsets.clone();
            let started = Instant::now();
            let result = match self
                .partitions
                .ensure(&self.pool, decoded.firsts.iter().map(|c| &c.event))
                .await
            {
                Ok(()) => {
                    store::commit_batch(
                        &self.pool,
                        &self.key,
                        &self.owned,
                        decoded,
                        self.settings.writes,
                    )
                    .await
                }
                Err(e) => Err(e),
            };
            match result {
                Ok(Outcome::Committed(counts)) => {
                    telemetry::record_batch(size, started.elapsed(), &counts);
                    for (p, next) in next_offsets {
                        self.owned.insert(p, Some(next));
                    }
                    self.pending.clear();
                    self.first_at = None;
                    self.report_lag(&self.owned);
                }
                Ok(Outcome::Stale { done, fenced }) => {
                    if !fenced.is_empty() {
                        tracing::warn!(?fenced, "offsets moved by another consumer; rejoining");
                        self.pending.clear();
                        self.first_at = None;
                        return Err(fenced);
                    }
                    tracing::info!(?done, "batch already committed for these partitions");
                    for p in done {
                        if let Some(next) = next_offsets.get(&p) {
                            self.owned.insert(p, Some(*next));
                        }
                        self.pending.retain(|m| m.partition != p);
                    }
                }
                Err(e) => {
                    telemetry::record_commit_error();
                    tracing::warn!(error = %e, retry_in = ?backoff, "batch commit failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        Ok(())
    }

    /// Compares the stored offsets of the owned partitions with the held
    /// positions (see the module docs). `Err`: the partitions that differ.
    /// A failed read (Postgres away) changes nothing; the next tick retries.
    async fn check_offsets(&self) -> Result<(), Vec<i32>> {
        if self.owned.is_empty() {
            return Ok(());
        }
        let check =
            match offsets::check_held(&self.pool, Ledger::Ingest, &self.key, &self.owned).await {
                Ok(check) => check,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read stored offsets; checking again later");
                    return Ok(());
                }
            };
        self.report_lag(&check.stored);
        if check.differing.is_empty() {
            return Ok(());
        }
        let held: BTreeMap<i32, Option<i64>> = check
            .differing
            .iter()
            .map(|p| (*p, self.owned[p]))
            .collect();
        let found: BTreeMap<i32, Option<i64>> = check
            .differing
            .iter()
            .map(|p| (*p, check.stored[p]))
            .collect();
        tracing::warn!(
            ?held,
            stored = ?found,
            "stored offsets differ from the positions held (postgres lost commits, or another \
             consumer moved them); rejoining to start from the stored offsets"
        );
        telemetry::record_offsets_mismatch(check.differing.len());
        Err(check.differing)
    }

    /// Lag per partition: the broker's high watermark minus `next` (a
    /// partition never committed lags by its whole high watermark).
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

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
