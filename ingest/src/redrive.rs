//! Re-driving dead letters after a fix (a tenant added, a producer bug
//! understood). Re-driving is exactly-once: each dead letter is locked,
//! re-decoded and applied in one transaction that also marks it re-driven,
//! so running it twice, or from two shells, counts nothing twice. Above
//! both [`crate::dead_letters`] (which it lists) and [`crate::store`]
//! (which applies what it re-decodes, and files what is still rejected).

use chrono::Utc;
use serde::Serialize;
use sqlx::PgPool;
use usage_contract::{decode_record, Record};

use crate::batch::{Candidate, Decoded, ReportCandidate};
use crate::dead_letters::list_open;
use crate::store::{apply, Partitions};

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
        let decoded = match decode_record(&raw, Utc::now()) {
            Err(violation) => Err(format!("still rejected: {violation}")),
            Ok(Record::Replica(report)) => Ok(Decoded {
                reports: vec![ReportCandidate {
                    report,
                    partition: dl.kafka_partition,
                    offset: dl.kafka_offset,
                    raw: raw.clone(),
                }],
                ..Decoded::default()
            }),
            Ok(Record::Usage(event)) => {
                partitions.ensure(pool, [&event]).await?;
                Ok(Decoded {
                    firsts: vec![Candidate {
                        hash: event.content_hash(),
                        event,
                        partition: dl.kafka_partition,
                        offset: dl.kafka_offset,
                    }],
                    ..Decoded::default()
                })
            }
        };
        let outcome = match decoded {
            Err(outcome) => outcome,
            Ok(decoded) => {
                // Still rejected, it is the same message: filed under its
                // own topic again, it meets its own row and adds none.
                let counts = apply(&mut tx, &dl.topic, decoded).await?;
                if counts.inserted + counts.reports == 1 {
                    "counted".to_owned()
                } else if counts.duplicates + counts.report_duplicates == 1 {
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
