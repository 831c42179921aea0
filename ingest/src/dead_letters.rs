//! Dead letters: storing the messages that cannot be counted, and listing
//! them (re-driving them after a fix is [`crate::redrive`]).
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
use usage_contract::UsageEvent;
use uuid::Uuid;

use crate::batch::Rejected;

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
