//! Adjustments: usage that arrives for a finalized month is billed as an
//! adjustment line on a later invoice, never by changing the finalized one.
//! For a month in a tenant's grace period, the waiver is recomputed too:
//! late usage above the budget that accrued in grace is not billed either.

use std::collections::HashMap;

use rust_decimal::Decimal;
use sqlx::PgConnection;

use crate::error::BillingError;
use crate::period::Month;
use crate::rating::{Line, LineKind};
use crate::store;
use crate::tenant::Tenant;

/// How far back late usage is looked for.
const ADJUSTMENT_MONTHS: usize = 12;

/// Adjustment lines for `month`: for each earlier finalized month (up to a
/// year back), what its usage rates to now, less what its invoice billed and
/// what finalized invoices after it already adjusted.
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
    // usage lines, plus adjustments for it on finalized invoices since.
    let mut billed: HashMap<(String, String), Decimal> = HashMap::new();
    for (tenant, period, body) in &rows {
        *billed.entry((tenant.clone(), period.clone())).or_default() += body.subtotal + body.waived;
        for l in body.lines.iter().filter(|l| l.kind == LineKind::Adjustment) {
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
        let usage: Decimal = crate::rated::usage_lines(conn, q, t)
            .await?
            .iter()
            .map(|l| l.amount)
            .sum();
        let now = usage - crate::grace::waived_now(conn, t, q).await?;
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

/// The adjustment line billing `delta` more (or less) for `period`.
pub fn adjustment_line(period: &str, delta: Decimal) -> Line {
    Line {
        kind: LineKind::Adjustment,
        description: format!("usage for {period} that arrived after its invoice was finalized"),
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
