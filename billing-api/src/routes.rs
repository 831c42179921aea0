//! The HTTP handlers: extract, check the caller's role, delegate, audit.
//!
//! Access rules, in one place ([`Access`]): finance sees every tenant;
//! a team lead sees only their tenant's usage, invoices and shadow bills
//! (another tenant's id is a 404, never a 403, so ids can't be probed);
//! support looks up requests and sees no money.

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use rust_decimal::Decimal;
use serde::Deserialize;

use crate::auth::{audit, Principal, Role};
use crate::drafts;
use crate::error::BillingError;
use crate::period::Month;
use crate::rating::PriceBook;
use crate::service::AppState;
use crate::{export, lifecycle, lookup, shadow};

/// What a caller may do with a tenant's data.
pub(crate) enum Access {
    /// Read a tenant's money (invoices, shadow bills, usage).
    ReadMoney,
    /// Change or export money (finance only).
    ManageMoney,
}

pub(crate) fn check(
    who: &Principal,
    tenant: Option<&str>,
    access: Access,
) -> Result<(), BillingError> {
    match (who.role, access) {
        (Role::Finance, _) => Ok(()),
        (Role::TeamLead, _) if tenant.is_some() && tenant != who.tenant_id.as_deref() => {
            Err(BillingError::NotFound)
        }
        (Role::TeamLead, Access::ReadMoney) if tenant.is_some() => Ok(()),
        (Role::TeamLead, _) | (Role::Support, _) => Err(BillingError::Forbidden),
    }
}

async fn known_tenant(state: &AppState, tenant: &str) -> Result<drafts::Tenant, BillingError> {
    let ids = [tenant.to_owned()];
    drafts::tenants(&state.pool, Some(&ids))
        .await?
        .pop()
        .ok_or(BillingError::NotFound)
}

#[utoipa::path(get, path = "/v1/tenants/{tenant}/invoices/{period}", params(("tenant" = String, Path), ("period" = String, Path, description = "YYYY-MM")),
    responses(
        (status = 200, description = "the finalized invoice, or a fresh draft", body = crate::invoice::Invoice),
        (status = 401, description = "no or unknown token", body = crate::openapi::ErrorBody),
        (status = 403, description = "the role may not do this", body = crate::openapi::ErrorBody),
        (status = 404, description = "no such tenant, or not this caller's", body = crate::openapi::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get_invoice(
    State(state): State<AppState>,
    who: Principal,
    Path((tenant, period)): Path<(String, String)>,
) -> Result<Response, BillingError> {
    check(&who, Some(&tenant), Access::ReadMoney)?;
    known_tenant(&state, &tenant).await?;
    let invoice = lifecycle::current(&state.pool, &tenant, Month::parse(&period)?).await?;
    audit(&state.pool, &who, "read_invoice", Some(&tenant)).await?;
    Ok(Json(invoice).into_response())
}

#[utoipa::path(post, path = "/v1/tenants/{tenant}/invoices/{period}/finalize", params(("tenant" = String, Path), ("period" = String, Path, description = "YYYY-MM")),
    responses(
        (status = 200, description = "the finalized invoice (the same one when called again)", body = crate::invoice::Invoice),
        (status = 401, description = "no or unknown token", body = crate::openapi::ErrorBody),
        (status = 403, description = "the role may not do this", body = crate::openapi::ErrorBody),
        (status = 404, description = "no such tenant, or not this caller's", body = crate::openapi::ErrorBody),
        (status = 409, description = "the month has not ended", body = crate::openapi::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn finalize_invoice(
    State(state): State<AppState>,
    who: Principal,
    Path((tenant, period)): Path<(String, String)>,
) -> Result<Response, BillingError> {
    check(&who, Some(&tenant), Access::ManageMoney)?;
    known_tenant(&state, &tenant).await?;
    let invoice = lifecycle::finalize(
        &state.pool,
        &tenant,
        Month::parse(&period)?,
        &who.token_id,
        Utc::now(),
    )
    .await?;
    audit(&state.pool, &who, "finalize_invoice", Some(&tenant)).await?;
    Ok(Json(invoice).into_response())
}

#[derive(Deserialize, utoipa::ToSchema)]
pub struct VoidBody {
    reason: String,
}

#[utoipa::path(post, path = "/v1/tenants/{tenant}/invoices/{period}/void", params(("tenant" = String, Path), ("period" = String, Path, description = "YYYY-MM")), request_body = VoidBody,
    responses(
        (status = 200, description = "the voided invoice", body = crate::invoice::Invoice),
        (status = 401, description = "no or unknown token", body = crate::openapi::ErrorBody),
        (status = 403, description = "the role may not do this", body = crate::openapi::ErrorBody),
        (status = 404, description = "no such tenant, or not this caller's", body = crate::openapi::ErrorBody),
        (status = 409, description = "no finalized invoice for the month", body = crate::openapi::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn void_invoice(
    State(state): State<AppState>,
    who: Principal,
    Path((tenant, period)): Path<(String, String)>,
    Json(body): Json<VoidBody>,
) -> Result<Response, BillingError> {
    check(&who, Some(&tenant), Access::ManageMoney)?;
    known_tenant(&state, &tenant).await?;
    let invoice = lifecycle::void(
        &state.pool,
        &tenant,
        Month::parse(&period)?,
        &body.reason,
        &who.token_id,
    )
    .await?;
    audit(&state.pool, &who, "void_invoice", Some(&tenant)).await?;
    Ok(Json(invoice).into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ShadowQuery {
    /// YYYY-MM; the current month in the tenant's zone when absent.
    period: Option<String>,
    /// Share of peak usage to imagine moved off-peak, 0..1 (default 0.25).
    #[param(value_type = Option<String>)]
    shift: Option<Decimal>,
}

#[utoipa::path(get, path = "/v1/tenants/{tenant}/shadow-bill", params(("tenant" = String, Path), ShadowQuery),
    responses(
        (status = 200, description = "what the tenant would pay", body = crate::shadow::ShadowBill),
        (status = 401, description = "no or unknown token", body = crate::openapi::ErrorBody),
        (status = 403, description = "the role may not do this", body = crate::openapi::ErrorBody),
        (status = 404, description = "no such tenant, or not this caller's", body = crate::openapi::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn shadow_bill(
    State(state): State<AppState>,
    who: Principal,
    Path(tenant): Path<String>,
    Query(q): Query<ShadowQuery>,
) -> Result<Response, BillingError> {
    check(&who, Some(&tenant), Access::ReadMoney)?;
    let t = known_tenant(&state, &tenant).await?;
    let now = Utc::now();
    let month = match q.period {
        Some(p) => Month::parse(&p)?,
        None => Month::containing(now, t.time_zone),
    };
    let bill = shadow::shadow_bill(
        &state.pool,
        &t,
        month,
        q.shift.unwrap_or(Decimal::new(25, 2)),
        now,
    )
    .await?;
    audit(&state.pool, &who, "read_shadow_bill", Some(&tenant)).await?;
    Ok(Json(bill).into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    period: String,
    format: Option<String>,
    cursor: Option<String>,
    limit: Option<i64>,
}

/// Every tenant's invoice for a month, a page at a time (cursor = last tenant id).
#[utoipa::path(get, path = "/v1/invoices", params(ListQuery),
    responses(
        (status = 200, description = "a page of invoices (JSON, or CSV with format=csv and the next cursor in X-Next-Cursor)"),
        (status = 401, description = "no or unknown token", body = crate::openapi::ErrorBody),
        (status = 403, description = "the role may not do this", body = crate::openapi::ErrorBody),
        (status = 404, description = "no such tenant, or not this caller's", body = crate::openapi::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_invoices(
    State(state): State<AppState>,
    who: Principal,
    Query(q): Query<ListQuery>,
) -> Result<Response, BillingError> {
    check(&who, None, Access::ManageMoney)?;
    let month = Month::parse(&q.period)?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(BillingError::BadRequest(
            "limit must be between 1 and 1000".into(),
        ));
    }
    let page: Vec<(String,)> = sqlx::query_as(
        "SELECT tenant_id FROM tenants WHERE $1::text IS NULL OR tenant_id > $1 ORDER BY tenant_id LIMIT $2",
    )
    .bind(q.cursor.as_deref())
    .bind(limit)
    .fetch_all(&state.pool)
    .await?;
    let ids: Vec<String> = page.into_iter().map(|(t,)| t).collect();
    let invoices = lifecycle::current_many(&state.pool, month, &ids).await?;
    audit(&state.pool, &who, "list_invoices", None).await?;
    let next = (ids.len() as i64 == limit)
        .then(|| ids.last().cloned())
        .flatten();
    match q.format.as_deref().unwrap_or("json") {
        "json" => Ok(
            Json(serde_json::json!({"invoices": invoices, "next_cursor": next})).into_response(),
        ),
        "csv" => Ok(csv_response(export::invoices_csv(&invoices)?, next)),
        other => Err(BillingError::BadRequest(format!(
            "format {other:?}: use json or csv"
        ))),
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FocusQuery {
    period: String,
    /// csv (default) or parquet.
    format: Option<String>,
}

/// The FOCUS cost-and-usage dataset for a month, every tenant, as CSV.
#[utoipa::path(get, path = "/v1/exports/focus", params(FocusQuery),
    responses(
        (status = 200, description = "the FOCUS cost-and-usage dataset as CSV (or Parquet with format=parquet)", content_type = "text/csv"),
        (status = 401, description = "no or unknown token", body = crate::openapi::ErrorBody),
        (status = 403, description = "the role may not do this", body = crate::openapi::ErrorBody),
        (status = 404, description = "no such tenant, or not this caller's", body = crate::openapi::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn focus_export(
    State(state): State<AppState>,
    who: Principal,
    Query(q): Query<FocusQuery>,
) -> Result<Response, BillingError> {
    check(&who, None, Access::ManageMoney)?;
    let month = Month::parse(&q.period)?;
    let ids: Vec<String> = drafts::tenants(&state.pool, None)
        .await?
        .into_iter()
        .map(|t| t.tenant_id)
        .collect();
    let invoices = lifecycle::current_many(&state.pool, month, &ids).await?;
    audit(&state.pool, &who, "export_focus", None).await?;
    match q.format.as_deref().unwrap_or("csv") {
        "csv" => Ok(csv_response(export::focus_csv(&invoices)?, None)),
        "parquet" => Ok((
            [
                (header::CONTENT_TYPE, "application/vnd.apache.parquet"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"focus.parquet\"",
                ),
            ],
            export::focus_parquet(&invoices)?,
        )
            .into_response()),
        other => Err(BillingError::BadRequest(format!(
            "format {other:?}: use csv or parquet"
        ))),
    }
}

fn csv_response(body: String, next: Option<String>) -> Response {
    let mut res = ([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], body).into_response();
    if let Some(next) = next.and_then(|n| n.parse().ok()) {
        res.headers_mut().insert("x-next-cursor", next);
    }
    res
}

#[utoipa::path(get, path = "/v1/requests/{request_id}", params(("request_id" = String, Path, description = "the X-Request-Id, req_ + UUID")),
    responses(
        (status = 200, description = "the request and its invoice, without money", body = crate::lookup::Lookup),
        (status = 401, description = "no or unknown token", body = crate::openapi::ErrorBody),
        (status = 403, description = "the role may not do this", body = crate::openapi::ErrorBody),
        (status = 404, description = "no such tenant, or not this caller's", body = crate::openapi::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn lookup_request(
    State(state): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
) -> Result<Response, BillingError> {
    let id = lookup::parse_id(&id)?;
    let found = lookup::lookup(&state.pool, id)
        .await?
        .ok_or(BillingError::NotFound)?;
    if who.role == Role::TeamLead
        && who.tenant_id.as_deref() != Some(found.request.tenant_id.as_str())
    {
        return Err(BillingError::NotFound);
    }
    audit(
        &state.pool,
        &who,
        "lookup_request",
        Some(&found.request.tenant_id),
    )
    .await?;
    Ok(Json(found).into_response())
}

/// Loads a price book (YAML body).
#[utoipa::path(post, path = "/v1/price-books", request_body(content = String, content_type = "application/yaml", description = "a price book in YAML"),
    responses(
        (status = 200, description = "loaded"),
        (status = 401, description = "no or unknown token", body = crate::openapi::ErrorBody),
        (status = 403, description = "the role may not do this", body = crate::openapi::ErrorBody),
        (status = 404, description = "no such tenant, or not this caller's", body = crate::openapi::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn put_price_book(
    State(state): State<AppState>,
    who: Principal,
    body: String,
) -> Result<Response, BillingError> {
    check(&who, None, Access::ManageMoney)?;
    let book = PriceBook::from_yaml(&body)?;
    drafts::put_book(&state.pool, &book).await?;
    audit(&state.pool, &who, "load_price_book", None).await?;
    Ok(
        Json(serde_json::json!({"version": book.version, "effective_from": book.effective_from}))
            .into_response(),
    )
}
