//! Finance's invoice pages: the list for a period with status and totals,
//! one invoice with its lines, finalize / void / export behind a
//! confirmation, "close the month" (every tenant's invoice finalized in
//! one idempotent action that reports what it did), and a printable page
//! for a payable invoice (the print stylesheet hides everything but it).

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::Utc;
use maud::{html, Markup};
use serde::Deserialize;

use crate::access::{audit, check, Access};
use crate::error::BillingError;
use crate::invoice::{Invoice, Status};
use crate::pages::format::{count, money};
use crate::pages::layout::{html, page};
use crate::pages::session::PageUser;
use crate::pages::{CsrfForm, Form, PageError, Path, Query};
use crate::params::TenantId;
use crate::period::Month;
use crate::routes::known_tenant;
use crate::state::AppState;
use crate::{export, lifecycle, store};

#[derive(Deserialize)]
pub struct ListQuery {
    period: Option<String>,
}

#[derive(Deserialize)]
pub struct TenantMonth {
    tenant: TenantId,
    period: Month,
}

#[derive(Deserialize)]
pub struct PeriodPath {
    period: Month,
}

fn status_text(inv: &Invoice) -> &'static str {
    match (inv.status, inv.payable) {
        (Status::Draft, _) => "draft",
        (Status::Finalized, true) => "finalized · payable",
        (Status::Finalized, false) => "finalized · shadow",
        (Status::Voided, _) => "voided",
    }
}

fn confirmed(form: &CsrfForm) -> Result<(), BillingError> {
    if form.confirm.as_deref() == Some("on") {
        Ok(())
    } else {
        Err(BillingError::BadRequest(
            "confirm: tick the confirmation box to go ahead".into(),
        ))
    }
}

pub async fn list(
    State(state): State<AppState>,
    user: PageUser,
    Query(q): Query<ListQuery>,
) -> Result<Response, PageError> {
    check(&user.who, None, Access::ManageMoney)?;
    let month = match q.period.as_deref().filter(|p| !p.is_empty()) {
        Some(p) => Month::parse(p)?,
        None => Month::containing(Utc::now(), chrono_tz::UTC).prev(),
    };
    let mut conn = state.pool.acquire().await?;
    let ids = store::tenants::page(&mut conn, None, 1000).await?;
    let invoices = lifecycle::current_many(&mut conn, month, &ids).await?;
    audit(&mut conn, &user.who, "list_invoices", None, None).await?;
    let total: rust_decimal::Decimal = invoices.iter().map(|i| i.body.total).sum();
    let cur = invoices
        .first()
        .map(|i| i.body.head.currency.clone())
        .unwrap_or_else(|| "USD".into());
    let body = html! {
        h1 { "Invoices · " (month) }
        form method="get" { label { "Period " input type="month" name="period" value=(month.to_string()); } " " button { "Show" } }
        table #invoices {
            thead { tr { th { "Tenant" } th { "Status" } th.num { "Number" } th.num { "Requests" } th.num { "Total" } th { "Zone" } } }
            tbody {
                @for inv in &invoices {
                    @let h = &inv.body.head;
                    tr data-tenant=(h.tenant_id) {
                        td { a href=(format!("/pages/tenants/{}/invoices/{month}", h.tenant_id)) { (h.tenant_id) } }
                        td { (status_text(inv)) }
                        td.num { @if let Some(n) = inv.number { (n) } }
                        td.num { (count(inv.body.usage.requests)) }
                        td.num.total { (money(inv.body.total, &h.currency)) }
                        td { (h.time_zone) }
                    }
                }
            }
            tfoot { tr { th colspan="4" { "All tenants" } th.num #grand-total { (money(total, &cur)) } th {} } }
        }
        h2 { "Export" }
        p {
            a href=(format!("/pages/exports/{month}/csv")) { "Invoices (CSV)" } " · "
            a href=(format!("/pages/exports/{month}/json")) { "Invoices (JSON)" } " · "
            a href=(format!("/pages/exports/{month}/focus")) { "FOCUS (CSV)" }
        }
        h2 { "Close the month" }
        form method="post" action=(format!("/pages/periods/{month}/close")) {
            input type="hidden" name="csrf" value=(user.csrf);
            label { input type="checkbox" name="confirm"; " Finalize every tenant's invoice for " (month) "; finalized invoices never change." }
            " " button type="submit" #close-month { "Close " (month) }
        }
    };
    Ok(html(
        StatusCode::OK,
        page(Some(user.signed()), "Invoices", body),
    ))
}

fn lines_table(inv: &Invoice) -> Markup {
    let cur = &inv.body.head.currency;
    html! {
        table #lines {
            thead { tr { th { "Line" } th.num { "Quantity" } th { "Unit" } th.num { "Amount" } } }
            tbody {
                @for l in &inv.body.lines {
                    tr { td { (l.description) } td.num { (l.quantity) } td { (l.unit) } td.num { (money(l.amount, cur)) } }
                }
            }
            tfoot {
                tr { th colspan="3" { "Subtotal" } th.num { (money(inv.body.subtotal, cur)) } }
                @if !inv.body.reserved.is_zero() {
                    tr { th colspan="3" { "Reserved capacity (net of credits)" } th.num #reserved { (money(inv.body.reserved, cur)) } }
                }
                @if !inv.body.waived.is_zero() {
                    tr { th colspan="3" { "Grace period: above the budget, not invoiced" } th.num #waived { (money(inv.body.waived, cur)) } }
                }
                tr { th colspan="3" { "Shared overhead" } th.num { (money(inv.body.overhead, cur)) } }
                tr { th colspan="3" { "Adjustments" } th.num { (money(inv.body.adjustments, cur)) } }
                tr { th colspan="3" { "Total" } th.num #invoice-total { (money(inv.body.total, cur)) } }
            }
        }
    }
}

fn head_facts(inv: &Invoice) -> Markup {
    let h = &inv.body.head;
    html! {
        p {
            "Period " (h.period) " in " strong { (h.time_zone) } " (" (h.period_start.to_rfc3339()) " to " (h.period_end.to_rfc3339()) " UTC) · price book " (h.price_book)
            " · status " strong #status { (status_text(inv)) }
            @if let Some(n) = inv.number { " · invoice no. " strong #number { (n) } }
        }
        @if let Some(r) = &inv.void_reason { p.warn { "Voided: " (r) } }
    }
}

pub async fn one(
    State(state): State<AppState>,
    user: PageUser,
    Path(TenantMonth { tenant, period }): Path<TenantMonth>,
) -> Result<Response, PageError> {
    let tenant = tenant.as_str();
    check(&user.who, Some(tenant), Access::ReadMoney)?;
    let mut conn = state.pool.acquire().await?;
    let t = known_tenant(&mut conn, tenant).await?;
    let inv = lifecycle::current(&mut conn, tenant, period).await?;
    audit(&mut conn, &user.who, "read_invoice", Some(tenant), None).await?;
    let finance = user.who.role == crate::access::Role::Finance;
    let body = html! {
        h1 { "Invoice · " (t.display_name) " · " (period) }
        (head_facts(&inv))
        (lines_table(&inv))
        @if inv.payable { p { a href=(format!("/pages/tenants/{tenant}/invoices/{period}/print")) #print-link { "Printable invoice" } } }
        @if finance && inv.status == Status::Draft {
            h2 { "Finalize" }
            form method="post" action=(format!("/pages/tenants/{tenant}/invoices/{period}/finalize")) {
                input type="hidden" name="csrf" value=(user.csrf);
                label { input type="checkbox" name="confirm"; " I have checked this invoice; finalizing numbers it and it never changes." }
                " " button type="submit" #finalize { "Finalize" }
            }
        }
        @if finance && inv.status == Status::Finalized {
            h2 { "Void" }
            form method="post" action=(format!("/pages/tenants/{tenant}/invoices/{period}/void")) {
                input type="hidden" name="csrf" value=(user.csrf);
                label { "Reason " input type="text" name="reason" size="40"; }
                " " label { input type="checkbox" name="confirm"; " Void invoice " (inv.number.unwrap_or_default()) }
                " " button type="submit" #void { "Void" }
            }
        }
    };
    Ok(html(
        StatusCode::OK,
        page(Some(user.signed()), "Invoice", body),
    ))
}

pub async fn print(
    State(state): State<AppState>,
    user: PageUser,
    Path(TenantMonth { tenant, period }): Path<TenantMonth>,
) -> Result<Response, PageError> {
    let tenant = tenant.as_str();
    check(&user.who, Some(tenant), Access::ReadMoney)?;
    let mut conn = state.pool.acquire().await?;
    let t = known_tenant(&mut conn, tenant).await?;
    let inv = lifecycle::current(&mut conn, tenant, period).await?;
    if !inv.payable {
        return Err(BillingError::Conflict(format!(
            "{tenant}'s invoice for {period} is not payable (only a finalized, non-shadow invoice prints)"
        ))
        .into());
    }
    audit(&mut conn, &user.who, "print_invoice", Some(tenant), None).await?;
    let body = html! {
        h1 { "Invoice " (inv.number.unwrap_or_default()) }
        p { strong { (t.display_name) } " (" (tenant) ")" }
        (head_facts(&inv))
        (lines_table(&inv))
        p.note { "Content hash " code { (inv.content_hash) } }
        p.noprint { a href="javascript:window.print()" { "Print" } " (or your browser's Print)" }
    };
    Ok(html(
        StatusCode::OK,
        page(Some(user.signed()), "Invoice", body),
    ))
}

pub async fn finalize(
    State(state): State<AppState>,
    user: PageUser,
    Path(TenantMonth { tenant, period }): Path<TenantMonth>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, PageError> {
    user.check_csrf(&form.csrf)?;
    let tenant = tenant.as_str();
    check(&user.who, Some(tenant), Access::ManageMoney)?;
    confirmed(&form)?;
    known_tenant(&mut *state.pool.acquire().await?, tenant).await?;
    lifecycle::finalize(&state.pool, tenant, period, &user.who.token_id, Utc::now()).await?;
    audit(
        &mut *state.pool.acquire().await?,
        &user.who,
        "finalize_invoice",
        Some(tenant),
        None,
    )
    .await?;
    Ok(Redirect::to(&format!("/pages/tenants/{tenant}/invoices/{period}")).into_response())
}

#[derive(Deserialize)]
pub struct VoidForm {
    csrf: String,
    reason: String,
    confirm: Option<String>,
}

pub async fn void(
    State(state): State<AppState>,
    user: PageUser,
    Path(TenantMonth { tenant, period }): Path<TenantMonth>,
    Form(form): Form<VoidForm>,
) -> Result<Response, PageError> {
    user.check_csrf(&form.csrf)?;
    let tenant = tenant.as_str();
    check(&user.who, Some(tenant), Access::ManageMoney)?;
    confirmed(&CsrfForm {
        csrf: String::new(),
        confirm: form.confirm.clone(),
    })?;
    if form.reason.contains('\0') {
        return Err(BillingError::BadRequest(serving::nul_message("reason")).into());
    }
    let mut conn = state.pool.acquire().await?;
    known_tenant(&mut conn, tenant).await?;
    lifecycle::void(&mut conn, tenant, period, &form.reason, &user.who.token_id).await?;
    audit(&mut conn, &user.who, "void_invoice", Some(tenant), None).await?;
    Ok(Redirect::to(&format!("/pages/tenants/{tenant}/invoices/{period}")).into_response())
}

pub async fn close(
    State(state): State<AppState>,
    user: PageUser,
    Path(PeriodPath { period }): Path<PeriodPath>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, PageError> {
    user.check_csrf(&form.csrf)?;
    check(&user.who, None, Access::ManageMoney)?;
    confirmed(&form)?;
    let report =
        lifecycle::close_month(&state.pool, period, &user.who.token_id, Utc::now()).await?;
    let detail = format!(
        "{period}: {} finalized, {} already",
        report.finalized.len(),
        report.already_finalized.len()
    );
    audit(
        &mut *state.pool.acquire().await?,
        &user.who,
        "close_month",
        None,
        Some(&detail),
    )
    .await?;
    let body = html! {
        h1 { "Closed " (period) }
        p #close-report { "Finalized " (report.finalized.len()) " invoice(s); " (report.already_finalized.len()) " were already finalized." }
        @if !report.finalized.is_empty() {
            h2 { "Finalized now" }
            ul { @for c in &report.finalized { li { (c.tenant_id) " — no. " (c.number.unwrap_or_default()) } } }
        }
        @if !report.already_finalized.is_empty() {
            h2 { "Already finalized" }
            ul { @for c in &report.already_finalized { li { (c.tenant_id) " — no. " (c.number.unwrap_or_default()) } } }
        }
        p { a href=(format!("/pages/invoices?period={period}")) { "Back to the invoices" } }
    };
    Ok(html(
        StatusCode::OK,
        page(Some(user.signed()), "Month closed", body),
    ))
}

#[derive(Deserialize)]
pub struct ExportPath {
    period: Month,
    format: String,
}

pub async fn export(
    State(state): State<AppState>,
    user: PageUser,
    Path(ExportPath { period, format }): Path<ExportPath>,
) -> Result<Response, PageError> {
    check(&user.who, None, Access::ManageMoney)?;
    let mut conn = state.pool.acquire().await?;
    let tenants = store::tenants::list(&mut conn, None).await?;
    let ids: Vec<String> = tenants.iter().map(|t| t.tenant_id.clone()).collect();
    let invoices = lifecycle::current_many(&mut conn, period, &ids).await?;
    audit(&mut conn, &user.who, "export_invoices", None, Some(&format)).await?;
    let (kind, name, body) = match format.as_str() {
        "csv" => (
            "text/csv; charset=utf-8",
            "invoices.csv",
            export::invoices_csv(&invoices)?,
        ),
        "json" => (
            "application/json",
            "invoices.json",
            serde_json::to_string_pretty(&invoices)
                .map_err(|e| BillingError::Internal(e.to_string()))?,
        ),
        "focus" => (
            "text/csv; charset=utf-8",
            "focus.csv",
            export::focus_csv(&invoices, &tenants)?,
        ),
        other => {
            return Err(BillingError::BadRequest(format!(
                "format {other:?} must be csv, json or focus"
            ))
            .into())
        }
    };
    Ok((
        [
            (header::CONTENT_TYPE, kind.to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{period}-{name}\""),
            ),
        ],
        body,
    )
        .into_response())
}
