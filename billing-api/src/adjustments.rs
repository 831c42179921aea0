//! Adjustments: what changes a finalized month after it was invoiced is
//! billed as an adjustment line on a later invoice, never by changing the
//! finalized one. Late usage changes its usage lines (and, on a dedicated
//! replica, its owner's credit for it); a late replica report changes its
//! owner's reserved line. So an adjustment is the month's charges as they
//! rate now — usage, reserved capacity and credits, less the grace waiver
//! (recomputed: late charges above the budget that accrued in grace are
//! not billed either) — less everything billed for them. The overhead
//! split of a finalized month is final: its pool was allocated in full when
//! the month closed, and late rows do not re-split it.

use std::collections::{BTreeMap, HashMap};

use rust_decimal::Decimal;
use sqlx::PgConnection;

use crate::error::BillingError;
use crate::grace;
use crate::invoice::InvoiceBody;
use crate::period::Month;
use crate::rating::{Line, LineKind, PriceBook};
use crate::store;
use crate::tenant::Tenant;

/// How far back late usage is looked for.
const ADJUSTMENT_MONTHS: usize = 12;

/// Adjustment lines for `month`: for each earlier finalized month (up to a
/// year back), what it rates to now, less what its invoice billed and what
/// finalized invoices after it already adjusted.
pub async fn lines(
    conn: &mut PgConnection,
    month: Month,
    tenants: &[Tenant],
) -> Result<HashMap<String, Vec<Line>>, BillingError> {
    let mut earliest = month;
    for _ in 0..ADJUSTMENT_MONTHS {
        earliest = earliest.prev();
    }
    let ids: Vec<&str> = tenants.iter().map(|t| t.tenant_id.as_str()).collect();
    let rows = store::invoices::finalized_between(conn, &ids, earliest, month).await?;
    if rows.is_empty() {
        return Ok(HashMap::new());
    }
    // What each (tenant, earlier month) has been billed so far: its own
    // invoice's charges, plus adjustments for it on finalized invoices since.
    let mut billed: HashMap<(String, String), Decimal> = HashMap::new();
    for (tenant, period, body) in &rows {
        *billed.entry((tenant.clone(), period.clone())).or_default() += charged(body);
        for l in body.lines.iter().filter(|l| l.kind == LineKind::Adjustment) {
            if let Some(q) = &l.adjusts {
                *billed.entry((tenant.clone(), q.clone())).or_default() += l.amount;
            }
        }
    }
    let mut books: BTreeMap<Month, PriceBook> = BTreeMap::new();
    let mut out: HashMap<String, Vec<Line>> = HashMap::new();
    for (tenant, period, _) in &rows {
        let Some(t) = tenants.iter().find(|t| &t.tenant_id == tenant) else {
            continue;
        };
        let q = Month::parse(period)?;
        if let std::collections::btree_map::Entry::Vacant(slot) = books.entry(q) {
            slot.insert(store::price_books::in_effect(conn, q.first_day()).await?);
        }
        let (start, end) = q.bounds(t.time_zone);
        let lines = crate::rated::charge_lines(conn, &books[&q], t, start, end).await?;
        let charges = grace::budgeted(&lines);
        let now = charges - grace::waived_now(conn, t, q).await?;
        let delta = now
            - billed
                .get(&(tenant.clone(), period.clone()))
                .copied()
                .unwrap_or_default();
        if !delta.is_zero() {
            out.entry(tenant.clone())
                .or_default()
                .push(adjustment_line(period, delta));
        }
    }
    Ok(out)
}

/// What an invoice charged for its own month's usage and reservations,
/// net of its waiver: what later adjustments for the month are measured
/// against (its overhead share and its adjustments of earlier months are
/// not part of it).
pub fn charged(body: &InvoiceBody) -> Decimal {
    body.subtotal + body.reserved + body.waived
}

/// The adjustment line billing `delta` more (or less) for `period`.
pub fn adjustment_line(period: &str, delta: Decimal) -> Line {
    Line {
        kind: LineKind::Adjustment,
        description: format!("charges for {period} that changed after its invoice was finalized (late usage or replica reports)"),
        model: None,
        priority: None,
        off_peak: None,
        unit: "-".into(),
        quantity: Decimal::ONE,
        unit_price: delta,
        per: 1,
        amount: delta,
        adjusts: Some(period.to_owned()),
    }
}
