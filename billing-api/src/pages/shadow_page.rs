//! The team lead's shadow bill page (finance may open any tenant's):
//! month-to-date and projected totals, daily cost stacked by model, cost
//! by hour of day with the off-peak window shaded (in the price book's
//! zone), peak vs off-peak, last full month's "what you would have paid",
//! the saving from moving a chosen share of peak load off-peak (computed by
//! the server from the form's input), the month's budget, and the grace
//! period's note (what above the budget is not invoiced).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{NaiveTime, Utc};
use maud::html;
use rust_decimal::Decimal;
use serde::Deserialize;

use crate::access::{audit, check, Access};
use crate::error::BillingError;
use crate::pages::chart;
use crate::pages::format::{count, money, percent};
use crate::pages::layout::{html, page};
use crate::pages::session::PageUser;
use crate::pages::{Form, PageError, Path, Query};
use crate::params::TenantId;
use crate::period::Month;
use crate::routes::known_tenant;
use crate::state::AppState;
use crate::{budget, lifecycle, shadow};

#[derive(Deserialize)]
pub struct ShadowQuery {
    period: Option<String>,
    /// Percent of peak load to imagine moved off-peak, 0 to 100.
    shift: Option<String>,
}

fn parse_shift(text: Option<&str>) -> Result<u32, BillingError> {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(25);
    };
    match text.parse::<u32>() {
        Ok(p) if p <= 100 => Ok(p),
        _ => Err(BillingError::BadRequest(format!(
            "shift {text:?} must be a whole percentage from 0 to 100"
        ))),
    }
}

/// Whether each hour (0–23, local to the book) starts inside the window.
fn off_peak_hours(start: &str, end: &str) -> [bool; 24] {
    let parse = |t: &str| NaiveTime::parse_from_str(t, "%H:%M").unwrap_or_default();
    let (s, e) = (parse(start), parse(end));
    let mut out = [false; 24];
    for (h, slot) in out.iter_mut().enumerate() {
        let t = NaiveTime::from_hms_opt(u32::try_from(h).unwrap_or(0), 0, 0).unwrap_or_default();
        *slot = if s <= e {
            t >= s && t < e
        } else {
            t >= s || t < e
        };
    }
    out
}

pub async fn show(
    State(state): State<AppState>,
    user: PageUser,
    Path(tenant): Path<TenantId>,
    Query(q): Query<ShadowQuery>,
) -> Result<Response, PageError> {
    let tenant = tenant.as_str();
    check(&user.who, Some(tenant), Access::ReadMoney)?;
    let mut conn = state.pool.acquire().await?;
    let t = known_tenant(&mut conn, tenant).await?;
    let now = Utc::now();
    let month = match q.period.as_deref().filter(|p| !p.is_empty()) {
        Some(p) => Month::parse(p)?,
        None => Month::containing(now, t.time_zone),
    };
    let shift_pct = parse_shift(q.shift.as_deref())?;
    let shift = Decimal::from(shift_pct) / Decimal::ONE_HUNDRED;
    let bill = shadow::shadow_bill(&mut conn, &t, month, shift, now).await?;
    let last = lifecycle::current(&mut conn, tenant, month.prev())
        .await
        .ok();
    audit(&mut conn, &user.who, "read_shadow_bill", Some(tenant), None).await?;
    let cur = bill.currency.as_str();
    let models: Vec<String> = bill.by_model.keys().cloned().collect();
    let shaded = off_peak_hours(&bill.off_peak_start, &bill.off_peak_end);
    let mtd = &bill.month_to_date.body;
    let body = html! {
        h1 { "Shadow bill · " (t.display_name) " · " (month) }
        p.note {
            "Days and months in " strong { (t.time_zone.name()) } "; off-peak "
            (bill.off_peak_start) "–" (bill.off_peak_end) " in " strong { (bill.book_time_zone) }
            " (" (bill.off_peak_discount_percent) "% off). "
            @if t.shadow { "Shadow mode: what you would pay; nothing is invoiced." }
            @else { "Real chargeback." }
        }
        @if let Some(b) = &bill.budget {
            @if b.level == "exceeded" {
                p.over #budget-warning { "Over budget: " (percent(b.share_used)) " of " (money(b.amount, cur)) " used." }
            } @else if b.level == "warning" {
                p.warn #budget-warning { "Budget warning: " (percent(b.share_used)) " of " (money(b.amount, cur)) " used." }
            }
        }
        @if let Some(g) = bill.grace.as_ref().filter(|g| g.this_month) {
            p.warn #grace-note {
                "Grace period: real chargeback since " (g.since) ", through " (g.last_day)
                ". Charges above the budget that accrue in it are shown here and not invoiced"
                @if bill.budget.is_some() {
                    ": " strong #grace-waived { (money(g.waived, cur)) } " not invoiced for " (month) " so far."
                } @else {
                    "; no budget is set for " (month) ", so everything is invoiced."
                }
            }
        }
        div.cards {
            div.card { div { "Month to date" } div.big #month-to-date { (money(mtd.total, cur)) } div.note { (count(mtd.usage.requests)) " requests" } }
            div.card { div { "Projected for the month" } div.big #projected { (money(bill.projected_month_total, cur)) } }
            div.card { div { "Peak" } div.big #peak { (money(bill.peak.amount, cur)) } div.note { (count(bill.peak.requests)) " requests" } }
            div.card { div { "Off-peak" } div.big #off-peak { (money(bill.off_peak.amount, cur)) } div.note { (count(bill.off_peak.requests)) " requests" } }
            div.card {
                div { "Last full month (" (month.prev()) ")" }
                @match &last {
                    Some(inv) => { div.big #last-month { (money(inv.body.total, cur)) } div.note { "what you would have paid" } }
                    None => { div.note { "no price book was in effect" } }
                }
            }
            @if let Some(b) = &bill.budget {
                div.card { div { "Budget" } div.big #budget { (money(b.amount, cur)) } div.note #budget-used { (percent(b.share_used)) " used: " (money(b.spent, cur)) " of usage and capacity (the overhead share is not budgeted)" } }
            }
        }
        h2 { "Daily cost by model" }
        (chart::daily_by_model(&bill.by_day_and_model, &models, cur))
        h2 { "Cost by hour of day (" (bill.book_time_zone) ", off-peak shaded)" }
        (chart::hour_of_day(&bill.by_hour_of_day_book_zone, &shaded, cur))
        h2 { "Moving load off-peak" }
        form method="get" {
            input type="hidden" name="period" value=(month.to_string());
            label { "Share of peak load moved off-peak (%) " input type="number" name="shift" min="0" max="100" step="1" value=(shift_pct); }
            " " button type="submit" { "Recompute" }
        }
        p { "Moving " (shift_pct) "% of peak load off-peak would save " strong #shift-saving { (money(bill.shift.saving, cur)) } " this month." }
        h2 { "By model" }
        table {
            thead { tr { th { "Model" } th.num { "Requests" } th.num { "Cost" } } }
            tbody {
                @for (m, a) in &bill.by_model {
                    tr { td { (m) } td.num { (count(a.requests)) } td.num { (money(a.amount, cur)) } }
                }
            }
        }
        h2 { "Cost per API key" }
        @if bill.by_api_key.is_empty() {
            p.note #no-key-split { "No per-key split for " (month) ": it is kept from request_log, which holds the last 30 days." }
        } @else {
            table #by-key {
                thead { tr { th { "API key" } th.num { "Requests" } th.num { "Cost" } } }
                tbody {
                    @for (k, a) in &bill.by_api_key {
                        tr { td { (k) } td.num { (count(a.requests)) } td.num { (money(a.amount, cur)) } }
                    }
                }
            }
            @if bill.by_api_key_requests < mtd.usage.requests {
                p.note { "The per-key split covers " (count(bill.by_api_key_requests)) " of " (count(mtd.usage.requests)) " requests; older ones were counted before it was kept." }
            }
        }
        p.note { "Breakdowns are rated per hour and rounded to cents there, so their sums can differ from the total by a few cents." }
        @if user.who.role == crate::access::Role::Finance {
            h2 { "Set the budget for " (month) }
            form method="post" action=(format!("/pages/tenants/{tenant}/budget")) {
                input type="hidden" name="csrf" value=(user.csrf);
                input type="hidden" name="period" value=(month.to_string());
                label { "Budget (" (cur) ") " input type="text" name="amount" inputmode="decimal" size="12"; }
                " " button type="submit" { "Set budget" }
            }
        }
    };
    Ok(html(
        StatusCode::OK,
        page(Some(user.signed()), "Shadow bill", body),
    ))
}

#[derive(Deserialize)]
pub struct BudgetForm {
    csrf: String,
    period: String,
    amount: String,
}

pub async fn set_budget(
    State(state): State<AppState>,
    user: PageUser,
    Path(tenant): Path<TenantId>,
    Form(form): Form<BudgetForm>,
) -> Result<Response, PageError> {
    user.check_csrf(&form.csrf)?;
    let tenant = tenant.as_str();
    check(&user.who, Some(tenant), Access::ManageMoney)?;
    let month = Month::parse(&form.period)?;
    let amount = budget::parse_amount(&form.amount)?;
    let mut tx = state.pool.begin().await?;
    budget::set(&mut tx, &user.who, tenant, month, amount).await?;
    tx.commit().await?;
    Ok(Redirect::to(&format!(
        "/pages/tenants/{tenant}/shadow-bill?period={month}"
    ))
    .into_response())
}
