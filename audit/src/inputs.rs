//! What the audit reads from Postgres, besides the archive's manifest:
//! the invoices as issued (every status, with when each was finalized and
//! voided, so the audit can tell which were live at any instant), the
//! replica reports (capacity has no other record), and whether the
//! archive has caught up. Tenants, budgets and price books are read with
//! billing's own store functions ([`billing_api::store`]).

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgPool;

use billing_api::invoice::InvoiceBody;

use crate::error::AuditError;

/// One stored invoice, finalized or since voided.
#[derive(Debug, Clone)]
pub struct Issued {
    pub tenant_id: String,
    pub period: String,
    pub number: i64,
    pub finalized_at: DateTime<Utc>,
    pub voided_at: Option<DateTime<Utc>>,
    pub body: InvoiceBody,
}

impl Issued {
    /// Whether this invoice was the month's live one at `at` (finalized
    /// before it, not yet voided).
    pub fn live_at(&self, at: DateTime<Utc>) -> bool {
        self.finalized_at < at && self.voided_at.is_none_or(|v| v >= at)
    }
}

/// Every invoice issued for periods `[from, to]` (`YYYY-MM`), in number order.
pub async fn issued(pool: &PgPool, from: &str, to: &str) -> Result<Vec<Issued>, AuditError> {
    type Row = (
        String,
        String,
        i64,
        DateTime<Utc>,
        Option<DateTime<Utc>>,
        sqlx::types::Json<InvoiceBody>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT tenant_id, period, number, finalized_at, voided_at, content FROM invoices
         WHERE period >= $1 AND period <= $2 ORDER BY number",
    )
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(tenant_id, period, number, finalized_at, voided_at, body)| Issued {
                tenant_id,
                period,
                number,
                finalized_at,
                voided_at,
                body: body.0,
            },
        )
        .collect())
}

/// Replica reports of one (owner or shared pool, model, hour, ingestion class).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportHour {
    /// The owner of a dedicated replica; `None` for a shared one.
    pub dedicated_to: Option<String>,
    pub model: String,
    pub hour: DateTime<Utc>,
    /// As in [`crate::scan::ArchiveHour::class`], by the report's `ingested_at`.
    pub class: usize,
    pub busy_gpu_seconds: Decimal,
    pub idle_gpu_seconds: Decimal,
    /// What the v2 reports among them lent (ran for other tenants).
    pub lent_gpu_seconds: Decimal,
    /// How many of them are v1 reports, which do not say what they lent.
    pub without_lent: i64,
}

/// The replica reports of hours `[from, to)`, summed per owner, model,
/// hour and ingestion class against `instants` (sorted, distinct).
pub async fn reports(
    pool: &PgPool,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    instants: &[DateTime<Utc>],
) -> Result<Vec<ReportHour>, AuditError> {
    type Row = (
        Option<String>,
        String,
        DateTime<Utc>,
        i32,
        Decimal,
        Decimal,
        Decimal,
        i64,
    );
    // width_bucket over sorted lower bounds: how many are <= ingested_at.
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT dedicated_to, model, hour,
                CASE WHEN cardinality($3::timestamptz[]) = 0 THEN 0
                     ELSE width_bucket(ingested_at, $3::timestamptz[]) END,
                sum(busy_gpu_seconds), sum(idle_gpu_seconds),
                coalesce(sum(lent_gpu_seconds), 0),
                count(*) FILTER (WHERE lent_gpu_seconds IS NULL)
         FROM replica_reports WHERE hour >= $1 AND hour < $2
         GROUP BY 1, 2, 3, 4",
    )
    .bind(from)
    .bind(to)
    .bind(instants)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(
            |(dedicated_to, model, hour, class, busy, idle, lent, without_lent)| {
                Ok(ReportHour {
                    dedicated_to,
                    model,
                    hour,
                    class: usize::try_from(class)
                        .map_err(|_| AuditError::Invalid(format!("report class {class}")))?,
                    busy_gpu_seconds: busy,
                    idle_gpu_seconds: idle,
                    lent_gpu_seconds: lent,
                    without_lent,
                })
            },
        )
        .collect()
}

/// Per hour in `[from, to)`, the latest `ingested_at` among the replica
/// reports ingested at or after `after` (late reports, as far as any
/// invoice finalized at `after` or later is concerned).
pub async fn late_reports(
    pool: &PgPool,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    after: DateTime<Utc>,
) -> Result<Vec<(DateTime<Utc>, DateTime<Utc>)>, AuditError> {
    Ok(sqlx::query_as(
        "SELECT hour, max(ingested_at) FROM replica_reports
         WHERE hour >= $1 AND hour < $2 AND ingested_at >= $3
         GROUP BY hour",
    )
    .bind(from)
    .bind(to)
    .bind(after)
    .fetch_all(pool)
    .await?)
}

/// How many requests that started in any of `ranges` (`[from, to)`,
/// disjoint) and were ingested before `before` are not in the archive's
/// files yet: one query however many ranges.
pub async fn not_yet_archived(
    pool: &PgPool,
    ranges: &[(DateTime<Utc>, DateTime<Utc>)],
    before: DateTime<Utc>,
) -> Result<i64, AuditError> {
    let (froms, tos): (Vec<DateTime<Utc>>, Vec<DateTime<Utc>>) = ranges.iter().copied().unzip();
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM archive_queue q JOIN request_log r USING (request_id)
         JOIN UNNEST($1::timestamptz[], $2::timestamptz[]) AS p(s, e)
           ON r.started_at >= p.s AND r.started_at < p.e
         WHERE r.ingested_at < $3",
    )
    .bind(&froms)
    .bind(&tos)
    .bind(before)
    .fetch_one(pool)
    .await?;
    Ok(n)
}
