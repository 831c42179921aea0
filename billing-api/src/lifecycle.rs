//! The invoice lifecycle: the invoice as it stands (finalized, or a fresh
//! draft), finalize (immutable, gapless number, content hash; finalizing
//! twice returns the same invoice), void with a reason, and closing a
//! month (finalizing every tenant's invoice of it).
//!
//! A finalization reads everything — the finalized invoice it may find,
//! the tenant, price book, usage and earlier invoices of its draft — on the
//! transaction that holds its lock: it needs one connection, however many
//! run at once (it used to read on other pool connections while holding
//! the lock, and eight at once exhausted a pool of eight).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

use crate::drafts;
use crate::error::BillingError;
use crate::invoice::{Invoice, Status};
use crate::period::Month;
use crate::store;

/// The invoices of `month` for the given tenants as they stand: the
/// finalized one where there is one, a fresh draft otherwise; by tenant id.
pub async fn current_many(
    conn: &mut PgConnection,
    month: Month,
    ids: &[String],
) -> Result<Vec<Invoice>, BillingError> {
    let mut done = store::invoices::finalized_many(conn, month, ids).await?;
    let missing: Vec<String> = ids
        .iter()
        .filter(|t| !done.contains_key(*t))
        .cloned()
        .collect();
    let mut drafts: HashMap<String, Invoice> = if missing.is_empty() {
        HashMap::new()
    } else {
        drafts::drafts(conn, month, Some(&missing))
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
pub async fn current(
    conn: &mut PgConnection,
    tenant: &str,
    month: Month,
) -> Result<Invoice, BillingError> {
    if let Some(done) = store::invoices::finalized(conn, tenant, month).await? {
        return Ok(done);
    }
    let ids = [tenant.to_owned()];
    let body = drafts::drafts(conn, month, Some(&ids))
        .await?
        .pop()
        .ok_or(BillingError::NotFound)?;
    Ok(Invoice::draft(body))
}

/// Finalizes a month that is over. Idempotent: a finalized invoice is
/// returned as it is. Returns the invoice and whether this call finalized it.
pub async fn finalize(
    pool: &PgPool,
    tenant: &str,
    month: Month,
    who: &str,
    now: DateTime<Utc>,
) -> Result<(Invoice, bool), BillingError> {
    let ids = [tenant.to_owned()];
    let mut tx = pool.begin().await?;
    // Serializes finalizations: numbers are gapless and a month is finalized once.
    store::invoices::lock_for_finalize(&mut tx).await?;
    if let Some(done) = store::invoices::finalized(&mut tx, tenant, month).await? {
        tx.rollback().await?;
        return Ok((done, false));
    }
    // Ingest pauses until this commits: the draft holds exactly the usage
    // ingested before `finalized_at`.
    let finalized_at = store::invoices::usage_boundary(&mut tx).await?;
    let body = drafts::drafts(&mut tx, month, Some(&ids))
        .await?
        .pop()
        .ok_or(BillingError::NotFound)?;
    if now < body.head.period_end {
        return Err(BillingError::Conflict(format!(
            "{month} for {tenant} ends at {}; it can be finalized after that",
            body.head.period_end.to_rfc3339()
        )));
    }
    let invoice = store::invoices::insert_finalized(&mut tx, &body, finalized_at, who).await?;
    tx.commit().await?;
    Ok((invoice, true))
}

/// Voids the finalized invoice of a month, with a reason. The month can then be finalized again.
pub async fn void(
    conn: &mut PgConnection,
    tenant: &str,
    month: Month,
    reason: &str,
    who: &str,
) -> Result<Invoice, BillingError> {
    if reason.trim().is_empty() {
        return Err(BillingError::BadRequest("a void needs a reason".into()));
    }
    store::invoices::void(conn, tenant, month, reason, who)
        .await?
        .ok_or_else(|| {
            BillingError::Conflict(format!("{tenant} has no finalized invoice for {month}"))
        })
}

/// What closing a month did, tenant by tenant.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CloseReport {
    pub period: String,
    /// Tenants whose invoice this call finalized, with its number.
    pub finalized: Vec<Closed>,
    /// Tenants whose invoice was already finalized, with its number.
    pub already_finalized: Vec<Closed>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Closed {
    pub tenant_id: String,
    pub number: Option<i64>,
}

/// Finalizes every tenant's invoice of `month` (idempotent: a second call
/// finalizes nothing and says so). Stops at the first tenant that cannot
/// be finalized (the month not over, no price book), naming it.
pub async fn close_month(
    pool: &PgPool,
    month: Month,
    who: &str,
    now: DateTime<Utc>,
) -> Result<CloseReport, BillingError> {
    let tenants = {
        let mut conn = pool.acquire().await?;
        store::tenants::list(&mut conn, None).await?
    };
    let mut report = CloseReport {
        period: month.to_string(),
        finalized: Vec::new(),
        already_finalized: Vec::new(),
    };
    for t in tenants {
        let (invoice, fresh) = finalize(pool, &t.tenant_id, month, who, now).await?;
        debug_assert_eq!(invoice.status, Status::Finalized);
        let closed = Closed {
            tenant_id: t.tenant_id,
            number: invoice.number,
        };
        if fresh {
            report.finalized.push(closed);
        } else {
            report.already_finalized.push(closed);
        }
    }
    Ok(report)
}
