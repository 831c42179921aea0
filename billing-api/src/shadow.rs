//! Shadow bills for team leads: "what you would have paid" for a month,
//! month-to-date with a projection to month end, broken down by model, by
//! local day and by local hour of day, peak vs off-peak, and what moving a
//! share of the peak load off-peak would save.
//!
//! The month-to-date total is the draft invoice's total. Breakdowns are
//! rated per (local day, local hour) and rounded to cents there, so their
//! sums can differ from the total by a few cents of rounding.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Timelike, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::PgConnection;

use crate::error::BillingError;
use crate::invoice::Invoice;
use crate::period::Month;
use crate::rating::{cents, rate, UsageGroup};
use crate::store;
use crate::tenant::Tenant;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ShadowBill {
    pub tenant_id: String,
    pub period: String,
    pub currency: String,
    pub as_of: DateTime<Utc>,
    /// The draft (or finalized) invoice for the month so far.
    pub month_to_date: Invoice,
    /// Usage so far scaled by the hours left, plus overhead and adjustments.
    #[serde(with = "rust_decimal::serde::str")]
    pub projected_month_total: Decimal,
    pub by_model: BTreeMap<String, Amount>,
    /// By local day, `YYYY-MM-DD`.
    pub by_day: BTreeMap<NaiveDate, Amount>,
    /// By local hour of day, `0` to `23` (JSON keys are strings).
    #[schema(value_type = BTreeMap<String, Amount>)]
    pub by_hour_of_day: BTreeMap<u32, Amount>,
    /// By local day and model (the daily chart's stacks).
    pub by_day_and_model: BTreeMap<NaiveDate, BTreeMap<String, Amount>>,
    /// By hour of day in the price book's zone, `0` to `23`: where the
    /// off-peak window is defined.
    #[schema(value_type = BTreeMap<String, Amount>)]
    pub by_hour_of_day_book_zone: BTreeMap<u32, Amount>,
    /// The price book's zone and off-peak window (`HH:MM`, local to it).
    pub book_time_zone: String,
    pub off_peak_start: String,
    pub off_peak_end: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub off_peak_discount_percent: Decimal,
    pub peak: Amount,
    pub off_peak: Amount,
    /// Cost per API key (from usage_key_hourly, rated per hour like the
    /// other breakdowns). Covers the requests counted in `by_api_key_requests`;
    /// months older than request_log's retention when the rollup began have
    /// no per-key split.
    pub by_api_key: BTreeMap<String, Amount>,
    /// Requests the per-key split covers, of `month_to_date.usage.requests`.
    pub by_api_key_requests: i64,
    /// The month's budget and the share of it the month-to-date budgeted
    /// charges use (warnings at 80% and 100%); absent when finance set none.
    pub budget: Option<crate::budget::BudgetStatus>,
    /// The tenant's grace period, once it has begun real chargeback: while
    /// it lasts, charges above the budget are shown and not invoiced.
    pub grace: Option<crate::grace::GraceStatus>,
    pub shift: ShiftSaving,
}

#[derive(Debug, Default, Clone, Copy, Serialize, utoipa::ToSchema)]
pub struct Amount {
    pub requests: i64,
    #[serde(with = "rust_decimal::serde::str")]
    pub amount: Decimal,
}

impl Amount {
    fn add(&mut self, requests: i64, amount: Decimal) {
        self.requests += requests;
        self.amount += amount;
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ShiftSaving {
    /// The share of peak usage moved off-peak, 0..1.
    #[serde(with = "rust_decimal::serde::str")]
    pub share: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub saving: Decimal,
}

pub async fn shadow_bill(
    conn: &mut PgConnection,
    tenant: &Tenant,
    month: Month,
    shift: Decimal,
    now: DateTime<Utc>,
) -> Result<ShadowBill, BillingError> {
    if shift.is_sign_negative() || shift > Decimal::ONE {
        return Err(BillingError::BadRequest(
            "shift must be between 0 and 1".into(),
        ));
    }
    let month_to_date = crate::lifecycle::current(conn, &tenant.tenant_id, month).await?;
    let book = store::price_books::in_effect(conn, month.first_day()).await?;
    let (start, end) = month.bounds(tenant.time_zone);
    let book_zone = crate::period::parse_zone(&book.time_zone)?;
    let rows = store::usage::shadow_rows(conn, &tenant.tenant_id, start, end).await?;
    let (mut by_model, mut by_day, mut by_hour) =
        (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    let mut by_day_model: BTreeMap<NaiveDate, BTreeMap<String, Amount>> = BTreeMap::new();
    let mut by_book_hour: BTreeMap<u32, Amount> = BTreeMap::new();
    let (mut peak, mut off_peak) = (Amount::default(), Amount::default());
    for (at, model, priority, requests, prompt, cached, completion, gpu) in rows {
        // Peak or off-peak in the book's zone; day and hour in the tenant's.
        let off = book.is_off_peak(book_zone, at);
        let local = at.with_timezone(&tenant.time_zone);
        let (day, hour) = (local.date_naive(), local.hour());
        let group = UsageGroup {
            model: model.clone(),
            priority,
            off_peak: off,
            requests,
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: completion,
            gpu_seconds: gpu,
        };
        let amount: Decimal = rate(&[group], &book, tenant.billing_mode)?
            .iter()
            .map(|l| l.amount)
            .sum();
        by_day_model
            .entry(day)
            .or_default()
            .entry(model.clone())
            .or_default()
            .add(requests, amount);
        by_book_hour
            .entry(at.with_timezone(&book_zone).hour())
            .or_default()
            .add(requests, amount);
        by_model
            .entry(model)
            .or_insert_with(Amount::default)
            .add(requests, amount);
        by_day
            .entry(day)
            .or_insert_with(Amount::default)
            .add(requests, amount);
        by_hour
            .entry(hour)
            .or_insert_with(Amount::default)
            .add(requests, amount);
        if off {
            off_peak.add(requests, amount)
        } else {
            peak.add(requests, amount)
        }
    }
    let body = &month_to_date.body;
    let elapsed = (now.min(end) - start).num_seconds().max(1);
    let whole = (end - start).num_seconds().max(1);
    let projected = if now >= end {
        body.total
    } else {
        cents(body.subtotal * Decimal::from(whole) / Decimal::from(elapsed))
            + body.overhead
            + body.adjustments
    };
    let mut by_key: BTreeMap<String, Amount> = BTreeMap::new();
    for (key, at, model, priority, requests, prompt, cached, completion, gpu) in
        store::usage::key_rows(conn, &tenant.tenant_id, start, end).await?
    {
        let group = UsageGroup {
            model,
            priority,
            off_peak: book.is_off_peak(book_zone, at),
            requests,
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: completion,
            gpu_seconds: gpu,
        };
        let amount: Decimal = rate(&[group], &book, tenant.billing_mode)?
            .iter()
            .map(|l| l.amount)
            .sum();
        by_key.entry(key).or_default().add(requests, amount);
    }
    let by_api_key_requests = by_key.values().map(|a| a.requests).sum();
    let lines = &month_to_date.body.lines;
    let budget = crate::budget::for_month(
        conn,
        &tenant.tenant_id,
        month,
        crate::grace::budgeted(lines),
    )
    .await?;
    let grace = crate::grace::status(tenant, month, lines);
    let saving = cents(shift * peak.amount * book.off_peak.discount_percent / Decimal::ONE_HUNDRED);
    Ok(ShadowBill {
        tenant_id: tenant.tenant_id.clone(),
        period: month.to_string(),
        currency: book.currency.clone(),
        as_of: now,
        projected_month_total: projected,
        month_to_date,
        by_model,
        by_day,
        by_hour_of_day: by_hour,
        by_day_and_model: by_day_model,
        by_hour_of_day_book_zone: by_book_hour,
        book_time_zone: book.time_zone.clone(),
        off_peak_start: book.off_peak.start.format("%H:%M").to_string(),
        off_peak_end: book.off_peak.end.format("%H:%M").to_string(),
        off_peak_discount_percent: book.off_peak.discount_percent,
        peak,
        off_peak,
        by_api_key: by_key,
        by_api_key_requests,
        budget,
        grace,
        shift: ShiftSaving {
            share: shift,
            saving,
        },
    })
}
