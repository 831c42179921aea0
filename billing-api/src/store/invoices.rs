//! Finalized and voided invoices in Postgres. Finalizing takes a table
//! lock (gapless numbers, a month finalized once); the caller holds it in
//! its transaction and runs every read of the finalization on that same
//! transaction.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::error::BillingError;
use crate::invoice::{Invoice, InvoiceBody, Status};
use crate::period::Month;

const COLUMNS: &str = "tenant_id, status, number, content, encode(content_hash, 'hex') AS hash,
    finalized_at, voided_at, void_reason";

/// A stored invoice as selected by the queries below.
#[derive(sqlx::FromRow)]
struct Row {
    tenant_id: String,
    status: String,
    number: i64,
    content: sqlx::types::Json<InvoiceBody>,
    hash: String,
    finalized_at: DateTime<Utc>,
    voided_at: Option<DateTime<Utc>>,
    void_reason: Option<String>,
}

fn from_row(row: Row) -> Invoice {
    let status = if row.status == "voided" {
        Status::Voided
    } else {
        Status::Finalized
    };
    Invoice {
        payable: status == Status::Finalized && !row.content.0.head.shadow,
        status,
        number: Some(row.number),
        content_hash: row.hash,
        finalized_at: Some(row.finalized_at),
        voided_at: row.voided_at,
        void_reason: row.void_reason,
        body: row.content.0,
    }
}

/// The live finalized invoice of a tenant's month, if any.
pub async fn finalized(
    conn: &mut PgConnection,
    tenant: &str,
    month: Month,
) -> Result<Option<Invoice>, BillingError> {
    let row: Option<Row> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM invoices WHERE tenant_id = $1 AND period = $2 AND status = 'finalized'"
    ))
    .bind(tenant)
    .bind(month.to_string())
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(from_row))
}

/// The first invoice of a month after `month` finalized after `at` (the
/// one whose adjustment lines bill usage of `month` ingested at `at`).
pub async fn first_finalized_after(
    conn: &mut PgConnection,
    tenant: &str,
    month: Month,
    at: DateTime<Utc>,
) -> Result<Option<Invoice>, BillingError> {
    let row: Option<Row> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM invoices WHERE tenant_id = $1 AND period > $2
             AND status = 'finalized' AND finalized_at > $3
         ORDER BY finalized_at LIMIT 1"
    ))
    .bind(tenant)
    .bind(month.to_string())
    .bind(at)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(from_row))
}

/// The months after `month` whose invoice is finalized (`YYYY-MM`).
pub async fn finalized_periods_after(
    conn: &mut PgConnection,
    tenant: &str,
    month: Month,
) -> Result<std::collections::HashSet<String>, BillingError> {
    let rows: Vec<(String,)> = sqlx::query_as(
        "SELECT period FROM invoices WHERE tenant_id = $1 AND period > $2 AND status = 'finalized'",
    )
    .bind(tenant)
    .bind(month.to_string())
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows.into_iter().map(|(p,)| p).collect())
}

/// The finalized invoices of `month` for the given tenants, by tenant id.
pub async fn finalized_many(
    conn: &mut PgConnection,
    month: Month,
    ids: &[String],
) -> Result<HashMap<String, Invoice>, BillingError> {
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM invoices WHERE period = $1 AND status = 'finalized' AND tenant_id = ANY($2)"
    ))
    .bind(month.to_string())
    .bind(ids)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.tenant_id.clone(), from_row(row)))
        .collect())
}

/// Takes the lock that serializes finalizations, for the rest of the transaction.
pub async fn lock_for_finalize(conn: &mut PgConnection) -> Result<(), BillingError> {
    sqlx::query("LOCK TABLE invoices IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Waits for every ingest batch in progress to commit, keeps new ones out
/// for the rest of the transaction (ingest's lock, taken exclusively), and
/// returns the database's clock then: the usage boundary. Every request
/// row and replica report stored before it is visible to this
/// transaction, and every one stored after it carries a later
/// `ingested_at` (its default is the clock at insert, taken under ingest's
/// lock). So "ingested before the invoice's `finalized_at`" is exactly
/// "on the invoice", which is what lookup and the audit rely on.
pub async fn usage_boundary(conn: &mut PgConnection) -> Result<DateTime<Utc>, BillingError> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(schema::USAGE_LOCK)
        .execute(&mut *conn)
        .await?;
    let (at,): (DateTime<Utc>,) = sqlx::query_as("SELECT clock_timestamp()")
        .fetch_one(&mut *conn)
        .await?;
    Ok(at)
}

/// Stores a finalized invoice with the next number (under the lock) and
/// returns it; `finalized_at` is the usage boundary its draft was read at.
pub async fn insert_finalized(
    conn: &mut PgConnection,
    body: &InvoiceBody,
    finalized_at: DateTime<Utc>,
    who: &str,
) -> Result<Invoice, BillingError> {
    let row: Row = sqlx::query_as(&format!(
        "INSERT INTO invoices (tenant_id, period, status, number, content, content_hash, finalized_at, finalized_by)
         SELECT $1, $2, 'finalized', coalesce(max(number), 0) + 1, $3, decode($4, 'hex'), $5, $6 FROM invoices
         RETURNING {COLUMNS}"
    ))
    .bind(&body.head.tenant_id)
    .bind(&body.head.period)
    .bind(sqlx::types::Json(body))
    .bind(body.content_hash())
    .bind(finalized_at)
    .bind(who)
    .fetch_one(&mut *conn)
    .await?;
    Ok(from_row(row))
}

/// Voids the finalized invoice of a month; `None` if there is none.
pub async fn void(
    conn: &mut PgConnection,
    tenant: &str,
    month: Month,
    reason: &str,
    who: &str,
) -> Result<Option<Invoice>, BillingError> {
    let row: Option<Row> = sqlx::query_as(&format!(
        "UPDATE invoices SET status = 'voided', voided_at = now(), voided_by = $3, void_reason = $4
         WHERE tenant_id = $1 AND period = $2 AND status = 'finalized'
         RETURNING {COLUMNS}"
    ))
    .bind(tenant)
    .bind(month.to_string())
    .bind(who)
    .bind(reason)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(from_row))
}

/// The finalized invoices of `[from, to)` for the given tenants:
/// `(tenant, period, content)`, by tenant and period.
pub async fn finalized_between(
    conn: &mut PgConnection,
    ids: &[&str],
    from: Month,
    to: Month,
) -> Result<Vec<(String, String, InvoiceBody)>, BillingError> {
    let rows: Vec<(String, String, sqlx::types::Json<InvoiceBody>)> = sqlx::query_as(
        "SELECT tenant_id, period, content FROM invoices
         WHERE status = 'finalized' AND tenant_id = ANY($1) AND period >= $2 AND period < $3
         ORDER BY tenant_id, period",
    )
    .bind(ids)
    .bind(from.to_string())
    .bind(to.to_string())
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows.into_iter().map(|(t, p, b)| (t, p, b.0)).collect())
}
