//! Computing draft invoices from usage_hourly and the price book. One code
//! path serves one tenant or every tenant of a month: usage is summed in
//! Postgres per tenant × model × priority × peak/off-peak (the off-peak
//! test runs on each hour's local time in the book's zone, so DST days of
//! 23 and 25 hours fall where they should), then rated in Rust. Every read
//! goes through the connection given, so a finalization computes its draft
//! inside the transaction that holds its lock. A tenant in its grace period
//! gets a waiver line for what it spent above budget there ([`grace`]).

use std::collections::BTreeMap;

use rust_decimal::Decimal;
use sqlx::PgConnection;

use crate::error::BillingError;
use crate::grace;
use crate::invoice::{InvoiceBody, InvoiceHead, UsageTotals};
use crate::period::{parse_zone, Month};
use crate::rating::{
    allocate, cents, rate, reserved_lines, Line, LineKind, Overhead, PriceBook, UsageGroup,
};
use crate::store::{self, usage::Window};

/// Every tenant's share of the month's overhead pool (the month in the
/// book's zone), by billable GPU-seconds.
pub async fn overhead_shares(
    conn: &mut PgConnection,
    book: &PriceBook,
    month: Month,
) -> Result<BTreeMap<String, Decimal>, BillingError> {
    let (start, end) = month.bounds(parse_zone(&book.time_zone)?);
    let weights = store::usage::gpu_seconds_by_tenant(conn, start, end).await?;
    let pool_amount = match book.overhead {
        Overhead::FixedPerMonth(amount) => amount,
        Overhead::IdleGpuHourRate(rate) => {
            let idle = store::usage::idle_gpu_seconds(conn, start, end).await?;
            cents(idle * rate / Decimal::from(3600))
        }
    };
    Ok(allocate(pool_amount, &weights.into_iter().collect()))
}

/// Draft invoice bodies for `month`, for the given tenants (or all), by tenant id.
pub async fn drafts(
    conn: &mut PgConnection,
    month: Month,
    ids: Option<&[String]>,
) -> Result<Vec<InvoiceBody>, BillingError> {
    let book = store::price_books::in_effect(conn, month.first_day()).await?;
    let tenants = store::tenants::list(conn, ids).await?;
    let windows: Vec<Window> = tenants
        .iter()
        .map(|t| {
            let (s, e) = month.bounds(t.time_zone);
            (t.tenant_id.clone(), s, e)
        })
        .collect();
    let mut groups = crate::rated::usage_groups(conn, &book, &windows).await?;
    let mut reservations = crate::rated::reservations(conn, &book, &windows).await?;
    let shares = overhead_shares(conn, &book, month).await?;
    let adjustments = crate::adjustments::lines(conn, month, &tenants).await?;
    let mut out = Vec::with_capacity(tenants.len());
    for (t, (_, start, end)) in tenants.iter().zip(&windows) {
        let mine = groups.remove(&t.tenant_id).unwrap_or_default();
        let mut lines = rate(&mine, &book, t.billing_mode)?;
        if let Some(pools) = reservations.remove(&t.tenant_id) {
            lines.extend(reserved_lines(&pools, &book, t.billing_mode, t.priority)?);
        }
        if let Some(w) = grace::waiver(conn, &book, t, month, grace::budgeted(&lines)).await? {
            lines.push(w);
        }
        if let Some(share) = shares.get(&t.tenant_id).filter(|s| !s.is_zero()) {
            lines.push(overhead_line(*share, month));
        }
        lines.extend(adjustments.get(&t.tenant_id).cloned().unwrap_or_default());
        let usage = totals(&mine);
        let head = InvoiceHead {
            tenant_id: t.tenant_id.clone(),
            period: month.to_string(),
            period_start: *start,
            period_end: *end,
            time_zone: t.time_zone.name().to_owned(),
            currency: book.currency.clone(),
            price_book: book.version.clone(),
            billing_mode: t.billing_mode,
            shadow: t.shadow,
        };
        out.push(InvoiceBody::new(head, usage, lines));
    }
    Ok(out)
}

/// The overhead line of a tenant's `share` of the month's pool.
pub fn overhead_line(share: Decimal, month: Month) -> Line {
    Line {
        kind: LineKind::Overhead,
        description: format!("shared overhead for {month} (share of billable GPU-seconds)"),
        model: None,
        priority: None,
        off_peak: None,
        unit: "-".into(),
        quantity: Decimal::ONE,
        unit_price: share,
        per: 1,
        amount: share,
        adjusts: None,
    }
}

/// The usage totals of an invoice: its rating groups summed.
pub fn totals(groups: &[UsageGroup]) -> UsageTotals {
    let mut t = UsageTotals::default();
    for g in groups {
        t.requests += g.requests;
        t.prompt_tokens += g.prompt_tokens;
        t.cached_tokens += g.cached_tokens;
        t.completion_tokens += g.completion_tokens;
        t.gpu_seconds += g.gpu_seconds;
    }
    t
}
