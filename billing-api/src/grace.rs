//! The grace period: the first [`GRACE_DAYS`] days of a tenant's real
//! chargeback, from `chargeback_since` (local midnight in the tenant's
//! zone; the reference rollout's step after at least one shadow month).
//! Charges above the month's budget that accrue inside it are shown and
//! not invoiced: the invoice carries a `grace_waiver` line taking them off,
//! and the shadow bill (page and API) says how much that is.
//!
//! **Which charges.** The budgeted charges: usage lines net of their
//! off-peak discounts, and reserved capacity net of its credits — what the
//! tenant's own traffic and capacity cost, the figure the budget's share
//! is measured on ([`crate::budget`]). The overhead share (allocated per
//! month, it has no time) and adjustments for earlier months are outside
//! the budget and are always invoiced.
//!
//! **Chronological.** Charges accrue hour by hour. With `C(t)` the month's
//! budgeted charges rated on its usage from the month's start to `t` (the
//! invoice's own rating of a prefix, so prices and rounding are the
//! invoice's), the grace part of the month `[g₀, g₁)` and the budget `B`:
//!
//! `waived = max(0, C(g₁) − B) − max(0, C(g₀) − B)`
//!
//! — the excess over the budget that accrued inside the grace period.
//! Usage after the grace period that pushes the month over its budget is
//! invoiced in full; a month without a budget waives nothing (there is
//! nothing to be above), and the page says so.

use chrono::{DateTime, Days, NaiveDate, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::PgConnection;

use crate::error::BillingError;
use crate::period::{local_midnight, Month};
use crate::rating::{Line, LineKind, PriceBook};
use crate::store;
use crate::tenant::Tenant;

/// How long the grace period lasts.
pub const GRACE_DAYS: u64 = 30;

/// A tenant's grace period, `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    /// The first day of real chargeback.
    pub since: NaiveDate,
    /// The day after its last day.
    pub until: NaiveDate,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

/// The tenant's grace period, if it has begun real chargeback.
pub fn period(tenant: &Tenant) -> Option<Period> {
    let since = tenant.chargeback_since?;
    let until = since.checked_add_days(Days::new(GRACE_DAYS))?;
    Some(Period {
        since,
        until,
        start: local_midnight(since, tenant.time_zone),
        end: local_midnight(until, tenant.time_zone),
    })
}

/// The part of `[month_start, month_end)` inside the grace period, if any.
pub fn overlap(
    grace: &Period,
    month_start: DateTime<Utc>,
    month_end: DateTime<Utc>,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let (from, to) = (grace.start.max(month_start), grace.end.min(month_end));
    (from < to).then_some((from, to))
}

/// What is waived of a month's charges: the excess over `budget` that
/// accrued between the grace part's start (`before`, the charges accrued
/// by then) and its end (`through`), never below 0 nor above the month's
/// own excess (`total`).
pub fn waived(budget: Decimal, before: Decimal, through: Decimal, total: Decimal) -> Decimal {
    let over = |c: Decimal| (c - budget).max(Decimal::ZERO);
    (over(through) - over(before)).clamp(Decimal::ZERO, over(total))
}

/// The budgeted charges among `lines` (see the module docs).
pub fn budgeted(lines: &[Line]) -> Decimal {
    lines
        .iter()
        .filter(|l| {
            matches!(
                l.kind,
                LineKind::Usage | LineKind::Discount | LineKind::Reserved | LineKind::Credit
            )
        })
        .map(|l| l.amount)
        .sum()
}

/// The waiver line for a tenant's month, if its grace period reaches into
/// the month, it has a budget and charges above it accrued in the grace
/// part. `total` is the month's budgeted charges (already rated).
pub async fn waiver(
    conn: &mut PgConnection,
    book: &PriceBook,
    tenant: &Tenant,
    month: Month,
    total: Decimal,
) -> Result<Option<Line>, BillingError> {
    let Some(grace) = period(tenant) else {
        return Ok(None);
    };
    let (start, end) = month.bounds(tenant.time_zone);
    let Some((from, to)) = overlap(&grace, start, end) else {
        return Ok(None);
    };
    let Some(budget) = store::budgets::get(conn, &tenant.tenant_id, month).await? else {
        return Ok(None);
    };
    let before = if from == start {
        Decimal::ZERO
    } else {
        charges_until(conn, book, tenant, start, from).await?
    };
    let through = if to == end {
        total
    } else {
        charges_until(conn, book, tenant, start, to).await?
    };
    Ok(waiver_line(
        &grace,
        book,
        month,
        budget,
        waived(budget, before, through, total),
    ))
}

/// The waiver line taking `amount` off a month in `grace` (none for 0).
pub fn waiver_line(
    grace: &Period,
    book: &PriceBook,
    month: Month,
    budget: Decimal,
    amount: Decimal,
) -> Option<Line> {
    if amount.is_zero() {
        return None;
    }
    let last_day = grace.until.pred_opt().unwrap_or(grace.until);
    Some(Line {
        kind: LineKind::GraceWaiver,
        description: format!(
            "grace period (real chargeback since {}, through {last_day}): charges above the \
             {month} budget of {budget} {} not invoiced",
            grace.since, book.currency
        ),
        model: None,
        priority: None,
        off_peak: None,
        unit: "-".into(),
        quantity: Decimal::ONE,
        unit_price: -amount,
        per: 1,
        amount: -amount,
        adjusts: None,
    })
}

/// What the waiver of a tenant's month comes to on its usage as it stands
/// now (for adjustments of a finalized month); 0 outside a grace period.
pub async fn waived_now(
    conn: &mut PgConnection,
    tenant: &Tenant,
    month: Month,
) -> Result<Decimal, BillingError> {
    let Some(grace) = period(tenant) else {
        return Ok(Decimal::ZERO);
    };
    let (start, end) = month.bounds(tenant.time_zone);
    if overlap(&grace, start, end).is_none() {
        return Ok(Decimal::ZERO);
    }
    let book = store::price_books::in_effect(conn, month.first_day()).await?;
    let total = charges_until(conn, &book, tenant, start, end).await?;
    Ok(waiver(conn, &book, tenant, month, total)
        .await?
        .map_or(Decimal::ZERO, |l| -l.amount))
}

/// The budgeted charges of the tenant's usage and reservations in
/// `[start, until)`, rated as the invoice rates them.
async fn charges_until(
    conn: &mut PgConnection,
    book: &PriceBook,
    tenant: &Tenant,
    start: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Decimal, BillingError> {
    let lines = crate::rated::charge_lines(conn, book, tenant, start, until).await?;
    Ok(budgeted(&lines))
}

/// The grace period as the shadow bill shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct GraceStatus {
    /// The first day of real chargeback (the tenant's zone).
    pub since: NaiveDate,
    /// The grace period's last day.
    pub last_day: NaiveDate,
    /// Whether the grace period reaches into this month.
    pub this_month: bool,
    /// Charges above the budget not invoiced this month (0 without a budget).
    #[serde(with = "rust_decimal::serde::str")]
    pub waived: Decimal,
}

/// The tenant's grace status for a month whose invoice has `lines`.
pub fn status(tenant: &Tenant, month: Month, lines: &[Line]) -> Option<GraceStatus> {
    let grace = period(tenant)?;
    let (start, end) = month.bounds(tenant.time_zone);
    let taken_off: Decimal = lines
        .iter()
        .filter(|l| l.kind == LineKind::GraceWaiver)
        .map(|l| l.amount)
        .sum();
    Some(GraceStatus {
        since: grace.since,
        last_day: grace.until.pred_opt().unwrap_or(grace.until),
        this_month: overlap(&grace, start, end).is_some(),
        // Waiver lines are negative; `-0` is never shown.
        waived: Decimal::ZERO - taken_off,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use chrono_tz::America::New_York;
    use proptest::prelude::*;
    use rust_decimal_macros::dec;

    fn tenant(since: Option<&str>) -> Tenant {
        Tenant {
            tenant_id: "t".into(),
            display_name: "t".into(),
            billing_mode: crate::rating::BillingMode::PerToken,
            shadow: false,
            time_zone: New_York,
            priority: 3,
            chargeback_since: since.map(|d| d.parse().unwrap()),
        }
    }

    #[test]
    fn thirty_days_from_local_midnight() {
        let g = period(&tenant(Some("2026-11-01"))).unwrap();
        assert_eq!(g.until, "2026-12-01".parse::<NaiveDate>().unwrap());
        // 2026-11-01 00:00 EDT and 2026-12-01 00:00 EST.
        assert_eq!(g.start, Utc.with_ymd_and_hms(2026, 11, 1, 4, 0, 0).unwrap());
        assert_eq!(g.end, Utc.with_ymd_and_hms(2026, 12, 1, 5, 0, 0).unwrap());
        assert!(period(&tenant(None)).is_none());
    }

    #[test]
    fn nothing_waived_reads_as_0_not_minus_0() {
        let t = tenant(Some("2026-11-01"));
        let s = status(&t, Month::parse("2026-11").unwrap(), &[]).unwrap();
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["waived"], "0", "{json}");
        assert!(s.this_month);
    }

    #[test]
    fn a_grace_period_from_mid_month_reaches_into_the_next() {
        let t = tenant(Some("2026-10-15"));
        let g = period(&t).unwrap();
        for (m, expect) in [
            ("2026-09", false),
            ("2026-10", true),
            ("2026-11", true),
            ("2026-12", false),
        ] {
            let (s, e) = Month::parse(m).unwrap().bounds(t.time_zone);
            assert_eq!(overlap(&g, s, e).is_some(), expect, "{m}");
        }
        let (s, e) = Month::parse("2026-11").unwrap().bounds(t.time_zone);
        let (from, to) = overlap(&g, s, e).unwrap();
        assert_eq!(from, s);
        assert_eq!(
            to,
            local_midnight("2026-11-14".parse().unwrap(), t.time_zone)
        );
    }

    #[test]
    fn only_the_excess_that_accrued_in_grace_is_waived() {
        // Whole month in grace: everything above the budget.
        assert_eq!(waived(dec!(100), dec!(0), dec!(130), dec!(130)), dec!(30));
        // Under budget: nothing.
        assert_eq!(waived(dec!(100), dec!(0), dec!(90), dec!(90)), dec!(0));
        // Grace ends at 120 of a 150 month: 20 waived, the last 30 billed.
        assert_eq!(waived(dec!(100), dec!(0), dec!(120), dec!(150)), dec!(20));
        // Grace begins at 80 and runs to the end at 150: 50 waived.
        assert_eq!(waived(dec!(100), dec!(80), dec!(150), dec!(150)), dec!(50));
        // Already over when grace begins: the excess before it is billed.
        assert_eq!(waived(dec!(100), dec!(110), dec!(150), dec!(150)), dec!(40));
    }

    proptest! {
        #[test]
        fn the_waiver_never_takes_off_more_than_the_excess(
            budget in 1i64..10_000, a in 0i64..10_000, b in 0i64..10_000, c in 0i64..10_000,
        ) {
            let mut v = [a, b, c];
            v.sort();
            let [before, through, total] = v.map(|x| Decimal::new(x, 2));
            let budget = Decimal::new(budget, 2);
            let w = waived(budget, before, through, total);
            prop_assert!(w >= Decimal::ZERO);
            // What is invoiced of the budgeted charges is at least the
            // budget where the month went above it.
            prop_assert!(total - w >= total.min(budget));
            // Never more than what accrued in grace.
            prop_assert!(w <= through - before);
        }
    }
}
