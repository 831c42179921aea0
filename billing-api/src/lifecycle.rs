//! The invoice lifecycle in Postgres: finalize (immutable, gapless number,
//! content hash; finalizing twice returns the same invoice), void with a
//! reason, and adjustments: usage that arrives for a finalized month is
//! billed as an adjustment line on a later invoice, never by changing the
//! finalized one.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgPool;

use crate::drafts::{self, Tenant};
use crate::error::BillingError;
use crate::invoice::{Invoice, InvoiceBody, Status};
use crate::period::Month;
use crate::rating::{Line, LineKind};

/// How far back late usage is looked for.
const ADJUSTMENT_MONTHS: usize = 12;

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
    pool: &PgPool,
    tenant: &str,
    month: Month,
) -> Result<Option<Invoice>, BillingError> {
    let row: Option<Row> = sqlx::query_as(
        "SELECT tenant_id, status, number, content, encode(content_hash, 'hex') AS hash, finalized_at,
                voided_at, void_reason
         FROM invoices WHERE tenant_id = $1 AND period = $2 AND status = 'finalized'",
    )
    .bind(tenant)
    .bind(month.to_string())
    .fetch_optional(pool)
    .await?;
    Ok(row.map(from_row))
}

/// The invoices of `month` for the given tenants as they stand: the
/// finalized one where there is one, a fresh draft otherwise; by tenant id.
pub async fn current_many(
    pool: &PgPool,
    month: Month,
    ids: &[String],
) -> Result<Vec<Invoice>, BillingError> {
    let rows: Vec<Row> = sqlx::query_as(
            "SELECT tenant_id, status, number, content, encode(content_hash, 'hex') AS hash, finalized_at,
                    voided_at, void_reason
             FROM invoices WHERE period = $1 AND status = 'finalized' AND tenant_id = ANY($2)",
        )
        .bind(month.to_string())
        .bind(ids)
        .fetch_all(pool)
        .await?;
    let mut done: HashMap<String, Invoice> = rows
        .into_iter()
        .map(|row| (row.tenant_id.clone(), from_row(row)))
        .collect();
    let missing: Vec<String> = ids
        .iter()
        .filter(|t| !done.contains_key(*t))
        .cloned()
        .collect();
    let mut drafts: HashMap<String, Invoice> = if missing.is_empty() {
        HashMap::new()
    } else {
        drafts::drafts(pool, month, Some(&missing))
            .await?
            .into_iter()
            .map(|b| (b.head.tenant_id.clone(), Invoice::draft(b)))
            .collect()
    };
    Ok(ids
        .iter()
        .filter_map(|t| done.remove(t).or_else(|| drafts.remove(t)))
        .collect())
}

/// The invoice as it stands: the finalized one, or a fresh draft.
pub async fn current(pool: &PgPool, tenant: &str, month: Month) -> Result<Invoice, BillingError> {
    if let Some(done) = finalized(pool, tenant, month).await? {
        return Ok(done);
    }
    let ids = [tenant.to_owned()];
    let body = drafts::drafts(pool, month, Some(&ids))
        .await?
        .pop()
        .ok_or(BillingError::NotFound)?;
    Ok(Invoice::draft(body))
}

/// Finalizes a month that is over. Idempotent: a finalized invoice is returned as it is.
pub async fn finalize(
    pool: &PgPool,
    tenant: &str,
    month: Month,
    who: &str,
    now: DateTime<Utc>,
) -> Result<Invoice, BillingError> {
    let ids = [tenant.to_owned()];
    let mut tx = pool.begin().await?;
    // Serializes finalizations: numbers are gapless and a month is finalized once.
    sqlx::query("LOCK TABLE invoices IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await?;
    if let Some(done) = finalized(pool, tenant, month).await? {
        tx.rollback().await?;
        return Ok(done);
    }
    let body = drafts::drafts(pool, month, Some(&ids))
        .await?
        .pop()
        .ok_or(BillingError::NotFound)?;
    if now < body.head.period_end {
        return Err(BillingError::Conflict(format!(
            "{month} for {tenant} ends at {}; it can be finalized after that",
            body.head.period_end.to_rfc3339()
        )));
    }
    let hash = body.content_hash();
    let (number,): (i64,) = sqlx::query_as("SELECT coalesce(max(number), 0) + 1 FROM invoices")
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO invoices (tenant_id, period, status, number, content, content_hash, finalized_at, finalized_by)
         VALUES ($1, $2, 'finalized', $3, $4, decode($5, 'hex'), $6, $7)",
    )
    .bind(tenant)
    .bind(month.to_string())
    .bind(number)
    .bind(sqlx::types::Json(&body))
    .bind(&hash)
    .bind(now)
    .bind(who)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    finalized(pool, tenant, month)
        .await?
        .ok_or(BillingError::NotFound)
}

/// Voids the finalized invoice of a month, with a reason. The month can then be finalized again.
pub async fn void(
    pool: &PgPool,
    tenant: &str,
    month: Month,
    reason: &str,
    who: &str,
) -> Result<Invoice, BillingError> {
    if reason.trim().is_empty() {
        return Err(BillingError::BadRequest("a void needs a reason".into()));
    }
    let row: Option<Row> = sqlx::query_as(
        "UPDATE invoices SET status = 'voided', voided_at = now(), voided_by = $3, void_reason = $4
         WHERE tenant_id = $1 AND period = $2 AND status = 'finalized'
         RETURNING tenant_id, status, number, content, encode(content_hash, 'hex') AS hash,
                   finalized_at, voided_at, void_reason",
    )
    .bind(tenant)
    .bind(month.to_string())
    .bind(who)
    .bind(reason)
    .fetch_optional(pool)
    .await?;
    row.map(from_row).ok_or_else(|| {
        BillingError::Conflict(format!("{tenant} has no finalized invoice for {month}"))
    })
}

/// Adjustment lines for `month`: for each earlier finalized month (up to a
/// year back), what its usage rates to now, less what its invoice billed and
/// what finalized invoices after it already adjusted.
pub async fn adjustments(
    pool: &PgPool,
    month: Month,
    tenants: &[Tenant],
) -> Result<HashMap<String, Vec<Line>>, BillingError> {
    let mut earliest = month;
    for _ in 0..ADJUSTMENT_MONTHS {
        earliest = earliest.prev();
    }
    let ids: Vec<&str> = tenants.iter().map(|t| t.tenant_id.as_str()).collect();
    let rows: Vec<(String, String, sqlx::types::Json<InvoiceBody>)> = sqlx::query_as(
        "SELECT tenant_id, period, content FROM invoices
         WHERE status = 'finalized' AND tenant_id = ANY($1) AND period >= $2 AND period < $3
         ORDER BY tenant_id, period",
    )
    .bind(&ids)
    .bind(earliest.to_string())
    .bind(month.to_string())
    .fetch_all(pool)
    .await?;
    if rows.is_empty() {
        return Ok(HashMap::new());
    }
    // What each (tenant, earlier month) has been billed so far: its own
    // usage lines, plus adjustments for it on finalized invoices since.
    let mut billed: HashMap<(String, String), Decimal> = HashMap::new();
    for (tenant, period, body) in &rows {
        *billed.entry((tenant.clone(), period.clone())).or_default() += body.0.subtotal;
        for l in body
            .0
            .lines
            .iter()
            .filter(|l| l.kind == LineKind::Adjustment)
        {
            if let Some(q) = &l.adjusts {
                *billed.entry((tenant.clone(), q.clone())).or_default() += l.amount;
            }
        }
    }
    let mut out: HashMap<String, Vec<Line>> = HashMap::new();
    for (tenant, period, _) in &rows {
        let Some(t) = tenants.iter().find(|t| &t.tenant_id == tenant) else {
            continue;
        };
        let q = Month::parse(period)?;
        let now: Decimal = drafts::usage_lines(pool, q, t)
            .await?
            .iter()
            .map(|l| l.amount)
            .sum();
        let delta = now
            - billed
                .get(&(tenant.clone(), period.clone()))
                .copied()
                .unwrap_or_default();
        if !delta.is_zero() {
            out.entry(tenant.clone()).or_default().push(Line {
                kind: LineKind::Adjustment,
                description: format!(
                    "usage for {period} that arrived after its invoice was finalized"
                ),
                model: None,
                priority: None,
                off_peak: None,
                unit: "-".into(),
                quantity: Decimal::ONE,
                unit_price: delta,
                per: 1,
                amount: delta,
                adjusts: Some(period.clone()),
            });
        }
    }
    Ok(out)
}
