//! Dead letters: listing them, and re-driving them after a fix (a tenant
//! added, a producer bug understood). Re-driving is exactly-once: each dead
//! letter is locked, re-decoded and applied in one transaction that also
//! marks it re-driven, so running it twice, or from two shells, counts
//! nothing twice.
//!
//! A dead letter is filed under the topic its message was read from (the
//! consumer's `INGEST_TOPIC`), partition and offset: one row per message,
//! also when several topics feed one database. A conflict's
//! `stored_version` is the version already stored, as the contract's
//! canonical JSON text (the gateway's serializer: GPU-seconds as decimal
//! strings, the contract's key order).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use usage_contract::{decode_record, Record, UsageEvent};
use uuid::Uuid;

use crate::batch::{Candidate, Decoded, Rejected, ReportCandidate};
use crate::store::{apply, Partitions};

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct DeadLetter {
    pub dead_letter_id: i64,
    pub topic: String,
    pub kafka_partition: i32,
    pub kafka_offset: i64,
    pub reason_code: String,
    pub reason: String,
    pub tenant_id: Option<String>,
    /// For conflicts: the version already stored, read with the contract's
    /// decoder (it lists as the same canonical JSON it is stored as).
    #[sqlx(try_from = "StoredVersion")]
    pub stored_version: Option<UsageEvent>,
    pub received_at: DateTime<Utc>,
    pub redriven_at: Option<DateTime<Utc>>,
    pub redrive_outcome: Option<String>,
}

/// The `stored_version` column as read: canonical contract JSON, or NULL.
#[derive(sqlx::Type)]
#[sqlx(transparent)]
struct StoredVersion(Option<String>);

impl TryFrom<StoredVersion> for Option<UsageEvent> {
    type Error = serde_json::Error;

    fn try_from(text: StoredVersion) -> Result<Self, Self::Error> {
        text.0.map(|t| serde_json::from_str(&t)).transpose()
    }
}

/// Open (not yet re-driven) dead letters, oldest first, optionally of one reason.
pub async fn list_open(
    pool: &PgPool,
    reason_code: Option<&str>,
    limit: i64,
) -> Result<Vec<DeadLetter>, sqlx::Error> {
    sqlx::query_as(
        "SELECT dead_letter_id, topic, kafka_partition, kafka_offset, reason_code, reason,
                tenant_id, stored_version, received_at, redriven_at, redrive_outcome
         FROM dead_letters
         WHERE redriven_at IS NULL AND ($1::text IS NULL OR reason_code = $1)
         ORDER BY dead_letter_id LIMIT $2",
    )
    .bind(reason_code)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// What re-driving did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RedriveReport {
    pub counted: u64,
    pub duplicates: u64,
    pub still_rejected: u64,
}

/// Re-drives every open dead letter of `reason_code` (or all).
pub async fn redrive(
    pool: &PgPool,
    reason_code: Option<&str>,
) -> Result<RedriveReport, sqlx::Error> {
    let mut report = RedriveReport::default();
    let mut partitions = Partitions::default();
    let open = list_open(pool, reason_code, i64::MAX).await?;
    for dl in open {
        let mut tx = pool.begin().await?;
        let row: Option<(Vec<u8>,)> = sqlx::query_as(
            "SELECT raw FROM dead_letters
             WHERE dead_letter_id = $1 AND redriven_at IS NULL FOR UPDATE SKIP LOCKED",
        )
        .bind(dl.dead_letter_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((raw,)) = row else {
            continue; // re-driven meanwhile by someone else
        };
        let outcome = match decode_record(&raw, Utc::now()) {
            Err(violation) => format!("still rejected: {violation}"),
            Ok(Record::Replica(report)) => {
                let decoded = Decoded {
                    reports: vec![ReportCandidate {
                        report,
                        partition: dl.kafka_partition,
                        offset: dl.kafka_offset,
                        raw: raw.clone(),
                    }],
                    ..Decoded::default()
                };
                let counts = apply(&mut tx, &dl.topic, decoded).await?;
                if counts.reports == 1 {
                    "counted".to_owned()
                } else if counts.report_duplicates == 1 {
                    "duplicate".to_owned()
                } else {
                    "still rejected".to_owned()
                }
            }
            Ok(Record::Usage(event)) => {
                partitions.ensure(pool, [&event]).await?;
                let decoded = Decoded {
                    firsts: vec![Candidate {
                        hash: event.content_hash(),
                        event,
                        partition: dl.kafka_partition,
                        offset: dl.kafka_offset,
                    }],
                    ..Decoded::default()
                };
                // Still rejected, it is the same message: filed under its
                // own topic again, it meets its own row and adds none.
                let counts = apply(&mut tx, &dl.topic, decoded).await?;
                if counts.inserted == 1 {
                    "counted".to_owned()
                } else if counts.duplicates == 1 {
                    "duplicate".to_owned()
                } else {
                    "still rejected".to_owned()
                }
            }
        };
        let resolved = outcome == "counted" || outcome == "duplicate";
        match outcome.as_str() {
            "counted" => report.counted += 1,
            "duplicate" => report.duplicates += 1,
            _ => report.still_rejected += 1,
        }
        sqlx::query(
            "UPDATE dead_letters SET redrive_outcome = $2,
                 redriven_at = CASE WHEN $3 THEN now() ELSE NULL END
             WHERE dead_letter_id = $1",
        )
        .bind(dl.dead_letter_id)
        .bind(&outcome)
        .bind(resolved)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
    }
    Ok(report)
}

/// Stores rejected messages read from `topic`. A message already
/// dead-lettered (same topic, partition, offset) is not stored twice.
pub(crate) async fn insert_dead_letters(
    conn: &mut PgConnection,
    topic: &str,
    rejected: &[Rejected],
) -> Result<u64, sqlx::Error> {
    if rejected.is_empty() {
        return Ok(0);
    }
    let partition: Vec<i32> = rejected.iter().map(|r| r.partition).collect();
    let offset: Vec<i64> = rejected.iter().map(|r| r.offset).collect();
    let raw: Vec<&[u8]> = rejected.iter().map(|r| r.raw.as_slice()).collect();
    let code: Vec<&str> = rejected.iter().map(|r| r.violation.code()).collect();
    // Postgres text can't hold NUL, and a reason may quote the bad input.
    let reason: Vec<String> = rejected
        .iter()
        .map(|r| r.violation.to_string().replace('\0', "\u{fffd}"))
        .collect();
    let request_id: Vec<Option<Uuid>> = rejected.iter().map(|r| r.request_id).collect();
    let tenant: Vec<Option<&str>> = rejected.iter().map(|r| r.tenant_id.as_deref()).collect();
    let stored: Vec<Option<&str>> = rejected
        .iter()
        .map(|r| r.stored_version.as_deref())
        .collect();
    let result = sqlx::query(
        "INSERT INTO dead_letters (topic, kafka_partition, kafka_offset, raw, reason_code,
             reason, request_id, tenant_id, stored_version)
         SELECT $1, * FROM UNNEST($2::integer[], $3::bigint[], $4::bytea[], $5::text[],
             $6::text[], $7::uuid[], $8::text[], $9::text[])
         ON CONFLICT (topic, kafka_partition, kafka_offset) DO NOTHING",
    )
    .bind(topic)
    .bind(partition)
    .bind(offset)
    .bind(raw)
    .bind(code)
    .bind(reason)
    .bind(request_id)
    .bind(tenant)
    .bind(stored)
    .execute(conn)
    .await?;
    Ok(result.rows_affected())
}
