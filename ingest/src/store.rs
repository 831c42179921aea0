//! The one Postgres transaction that makes a batch count exactly once:
//! move each partition's offset by compare-and-set, insert the new request
//! rows, add only what was inserted to usage_hourly, and keep everything
//! that can't be counted in dead_letters. All of it commits, or none.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::NaiveDate;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use usage_contract::{StoredRequest, UsageEvent, Violation};
use uuid::Uuid;

use crate::batch::{compare, Candidate, Decoded, Rejected, Verdict};
use crate::capacity::store_reports;
use crate::dead_letters::insert_dead_letters;
use crate::hourly::upsert_rollups;
use crate::offsets::{self, ConsumerKey, Ledger};
use crate::request_rows::{insert_request_rows, stored_rows};
use crate::unnest_path;
pub use crate::write_path::WritePath;

/// What a committed batch did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub inserted: u64,
    pub duplicates: u64,
    pub conflicts: u64,
    pub dead_lettered: u64,
    /// Replica reports stored, and re-sent ones skipped.
    pub reports: u64,
    pub report_duplicates: u64,
}

/// The result of trying to commit a batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Committed(Counts),
    /// Some partitions' stored offsets were not where this consumer thought.
    /// `done`: already moved exactly to this batch's end (an earlier attempt
    /// whose acknowledgement was lost, or another consumer with the same
    /// messages): nothing more to write for them. `fenced`: moved elsewhere,
    /// so this consumer is a zombie for them and must rejoin.
    Stale {
        done: Vec<i32>,
        fenced: Vec<i32>,
    },
}

/// Remembers which day partitions of request_log exist.
#[derive(Debug, Default)]
pub struct Partitions {
    known: HashSet<NaiveDate>,
}

impl Partitions {
    /// Creates the day partitions the events need, outside the batch
    /// transaction so the DDL lock is held only for a moment.
    pub async fn ensure<'a>(
        &mut self,
        pool: &PgPool,
        events: impl IntoIterator<Item = &'a UsageEvent>,
    ) -> Result<(), sqlx::Error> {
        let missing: HashSet<NaiveDate> = events
            .into_iter()
            .map(|e| e.request_id.day())
            .filter(|d| !self.known.contains(d))
            .collect();
        for day in missing {
            sqlx::query("SELECT ensure_request_log_partition($1)")
                .bind(day)
                .execute(pool)
                .await?;
            self.known.insert(day);
        }
        Ok(())
    }
}

/// Whether a batch's commit waits for Postgres to flush its WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SynchronousCommit {
    /// The commit returns once its WAL is on disk: a Postgres crash loses
    /// nothing that was acknowledged (one flush per batch).
    On,
    /// The commit returns before its WAL is flushed: a Postgres crash can
    /// lose the last commits, data and offsets together. Ingest then finds
    /// the stored offsets behind the positions it holds (the periodic
    /// offsets check, which runs while idle too) and consumes them again.
    Off,
}

/// How a batch is written and committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Writes {
    pub synchronous_commit: SynchronousCommit,
    pub path: WritePath,
}

/// Commits one batch. `expected` holds, per partition, the stored offset
/// this consumer believes in (`None`: no row yet).
pub async fn commit_batch(
    pool: &PgPool,
    key: &ConsumerKey,
    expected: &BTreeMap<i32, Option<i64>>,
    decoded: Decoded,
    writes: Writes,
) -> Result<Outcome, sqlx::Error> {
    let Writes {
        synchronous_commit,
        path,
    } = writes;
    let mut tx = match path {
        // The usage lock (see [`apply`]) in the same round trip as BEGIN.
        WritePath::Rows => pool.begin_with(begin_locked(synchronous_commit)).await?,
        WritePath::Unnest => {
            let mut tx = pool.begin().await?;
            if synchronous_commit == SynchronousCommit::Off {
                sqlx::query("SET LOCAL synchronous_commit = off")
                    .execute(&mut *tx)
                    .await?;
            }
            tx
        }
    };
    // Offsets before any data: the row locks serialize two consumers of one
    // partition before either writes, and a zombie fails fast.
    let unmoved = offsets::move_all(
        &mut tx,
        Ledger::Ingest,
        key,
        expected,
        &decoded.next_offsets,
    )
    .await?;
    if !unmoved.is_empty() {
        tx.rollback().await?;
        return Ok(Outcome::Stale {
            done: unmoved.done,
            fenced: unmoved.fenced,
        });
    }
    let lock = match path {
        WritePath::Rows => UsageLock::Held,
        WritePath::Unnest => UsageLock::Take,
    };
    let counts = write(&mut tx, &key.topic, decoded, path, lock).await?;
    tx.commit().await?;
    Ok(Outcome::Committed(counts))
}

/// The statement that opens a batch's transaction holding the usage lock
/// shared ([`schema::USAGE_LOCK`]), as one simple query.
fn begin_locked(synchronous_commit: SynchronousCommit) -> String {
    let lock = schema::USAGE_LOCK;
    match synchronous_commit {
        SynchronousCommit::On => format!("BEGIN; SELECT pg_advisory_xact_lock_shared({lock})"),
        SynchronousCommit::Off => format!(
            "BEGIN; SET LOCAL synchronous_commit = off; SELECT pg_advisory_xact_lock_shared({lock})"
        ),
    }
}

/// Whether a transaction holds the usage lock already or must take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UsageLock {
    Held,
    Take,
}

/// Writes a decoded batch inside an open transaction: request rows, hourly
/// deltas for what was inserted, dead letters for the rest, filed under
/// `topic`, the topic the messages were read from.
pub async fn apply(
    tx: &mut Transaction<'_, Postgres>,
    topic: &str,
    decoded: Decoded,
) -> Result<Counts, sqlx::Error> {
    write(tx, topic, decoded, WritePath::default(), UsageLock::Take).await
}

async fn write(
    tx: &mut Transaction<'_, Postgres>,
    topic: &str,
    decoded: Decoded,
    path: WritePath,
    lock: UsageLock,
) -> Result<Counts, sqlx::Error> {
    let Decoded {
        firsts,
        repeats,
        mut rejected,
        reports,
        ..
    } = decoded;
    let mut counts = Counts::default();
    // Shared with every other ingest transaction; rollup takes it exclusively
    // to close hours or drop partitions, so neither happens under a batch.
    if lock == UsageLock::Take {
        sqlx::query("SELECT pg_advisory_xact_lock_shared($1)")
            .bind(schema::USAGE_LOCK)
            .execute(&mut **tx)
            .await?;
    }

    // Requests from dropped days can't be deduplicated any more: keep them
    // aside rather than risk counting a re-send twice. Unknown tenants are
    // dead letters, decided against the table itself. Both read after the
    // lock is held.
    let tenants: Vec<&str> = firsts
        .iter()
        .map(|c| c.event.tenant_id.as_str())
        .chain(
            reports
                .iter()
                .filter_map(|r| r.report.dedicated_to.as_deref()),
        )
        .collect();
    let (dropped, known) = match path {
        WritePath::Rows => retention_and_tenants(tx, &tenants).await?,
        WritePath::Unnest => {
            let dropped: Option<(NaiveDate,)> =
                sqlx::query_as("SELECT dropped_through FROM request_log_retention")
                    .fetch_optional(&mut **tx)
                    .await?;
            (dropped.map(|(d,)| d), known_tenants(tx, &tenants).await?)
        }
    };
    let (firsts, repeats) = match dropped {
        None => (firsts, repeats),
        Some(through) => {
            let expired = |c: &Candidate| c.event.request_id.day() <= through;
            let (old, firsts): (Vec<_>, Vec<_>) = firsts.into_iter().partition(expired);
            let (old_repeats, repeats): (Vec<_>, Vec<_>) = repeats.into_iter().partition(expired);
            for c in old.into_iter().chain(old_repeats) {
                let day = c.event.request_id.day();
                rejected.push(reject(c, Violation::BeyondRetention(day), None));
            }
            (firsts, repeats)
        }
    };

    let (firsts, unknown) = split_off(firsts, |c| known.contains(&c.event.tenant_id));
    let (repeats, unknown_repeats) = split_off(repeats, |c| known.contains(&c.event.tenant_id));
    for c in unknown.into_iter().chain(unknown_repeats) {
        let violation = Violation::UnknownTenant(c.event.tenant_id.clone());
        rejected.push(reject(c, violation, None));
    }

    let inserted = insert_request_rows(tx, &firsts, path).await?;

    // Every id not inserted now has a stored version to compare against:
    // either a row from an earlier batch, or this batch's first occurrence.
    // Only an id repeated within this batch can meet its just-inserted
    // version again, so only those keep their event aside. Comparing takes
    // the hashes alone; the stored version's JSON is built for conflicts only.
    let repeated: HashSet<Uuid> = repeats
        .iter()
        .map(|c| c.event.request_id.as_uuid())
        .collect();
    let mut stored: HashMap<Uuid, Stored> = HashMap::new();
    let mut lookup = Vec::new();
    for c in &firsts {
        let id = c.event.request_id.as_uuid();
        if !inserted.contains(&id) {
            lookup.push(id);
        } else if repeated.contains(&id) {
            let (hash, event) = (c.hash, c.event.clone());
            stored.insert(id, Stored::Batch { hash, event });
        }
    }
    let rows = stored_rows(tx, &lookup).await?;
    stored.extend(rows.into_iter().map(|(id, row)| (id, Stored::Row(row))));

    let (counted, others) = split_off(firsts, |c| inserted.contains(&c.event.request_id.as_uuid()));
    counts.inserted = counted.len() as u64;
    for c in others.into_iter().chain(repeats) {
        let Some(version) = stored.get(&c.event.request_id.as_uuid()) else {
            // The row vanished between insert and lookup: only possible if a
            // partition was dropped concurrently. Keep the message.
            let violation = Violation::InvalidField("stored version disappeared".into());
            rejected.push(reject(c, violation, None));
            continue;
        };
        match compare(version.hash(), &c.hash) {
            Verdict::Duplicate => counts.duplicates += 1,
            Verdict::Conflict => {
                counts.conflicts += 1;
                let json = version.canonical_json();
                rejected.push(reject(c, Violation::Conflict, json));
            }
        }
    }

    let events: Vec<&UsageEvent> = counted.iter().map(|c| &c.event).collect();
    match path {
        WritePath::Rows => upsert_rollups(tx, events.iter().copied()).await?,
        WritePath::Unnest => unnest_path::upsert_rollups(tx, &events).await?,
    }
    let report_counts = store_reports(tx, reports, &known, &mut rejected).await?;
    counts.reports = report_counts.inserted;
    counts.report_duplicates = report_counts.duplicates;
    counts.dead_lettered = insert_dead_letters(tx, topic, &rejected).await?;
    Ok(counts)
}

/// The version of an id that is already stored, to compare a later one with.
enum Stored {
    /// Inserted earlier in this batch.
    Batch { hash: [u8; 32], event: UsageEvent },
    /// In request_log since an earlier batch.
    Row(StoredRequest),
}

impl Stored {
    fn hash(&self) -> &[u8] {
        match self {
            Self::Batch { hash, .. } => hash,
            Self::Row(row) => &row.content_hash,
        }
    }

    /// The stored version as the contract's canonical JSON, as the gateway
    /// serialized it (a row goes back through the contract's one conversion).
    fn canonical_json(&self) -> Option<String> {
        match self {
            Self::Batch { event, .. } => Some(event.to_json_string()),
            Self::Row(row) => match row.to_event() {
                Ok(event) => Some(event.to_json_string()),
                Err(error) => {
                    // Only a row written by something other than ingest.
                    tracing::warn!(
                        request_id = %row.request_id,
                        %error,
                        "stored row is not a contract event; conflict kept without its stored version"
                    );
                    None
                }
            },
        }
    }
}

fn reject(c: Candidate, violation: Violation, stored: Option<String>) -> Rejected {
    Rejected {
        partition: c.partition,
        offset: c.offset,
        raw: c.event.to_json(),
        violation,
        request_id: Some(c.event.request_id.as_uuid()),
        tenant_id: Some(c.event.tenant_id),
        stored_version: stored,
    }
}

/// The day request_log is dropped through (if any) and which of `tenants`
/// are known, in one statement.
async fn retention_and_tenants(
    conn: &mut PgConnection,
    tenants: &[&str],
) -> Result<(Option<NaiveDate>, HashSet<String>), sqlx::Error> {
    let distinct = distinct(tenants);
    let (dropped, known): (Option<NaiveDate>, Vec<String>) = sqlx::query_as(
        "SELECT (SELECT dropped_through FROM request_log_retention),
                ARRAY(SELECT tenant_id FROM tenants WHERE tenant_id = ANY($1))",
    )
    .bind(&distinct)
    .fetch_one(conn)
    .await?;
    Ok((dropped, known.into_iter().collect()))
}

/// `items` split into those that `keep` and the rest, moving nothing when
/// all are kept (a batch's thousands of candidates, almost always).
fn split_off(
    items: Vec<Candidate>,
    keep: impl Fn(&Candidate) -> bool,
) -> (Vec<Candidate>, Vec<Candidate>) {
    if items.iter().all(&keep) {
        return (items, Vec::new());
    }
    items.into_iter().partition(keep)
}

/// The distinct names among `tenants`.
fn distinct<'a>(tenants: &[&'a str]) -> Vec<&'a str> {
    let set: HashSet<&str> = tenants.iter().copied().collect();
    set.into_iter().collect()
}

async fn known_tenants(
    conn: &mut PgConnection,
    tenants: &[&str],
) -> Result<HashSet<String>, sqlx::Error> {
    let distinct = distinct(tenants);
    let rows: Vec<(String,)> =
        sqlx::query_as("SELECT tenant_id FROM tenants WHERE tenant_id = ANY($1)")
            .bind(&distinct)
            .fetch_all(conn)
            .await?;
    Ok(rows.into_iter().map(|(t,)| t).collect())
}
