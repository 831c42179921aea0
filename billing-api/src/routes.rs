//! The JSON API's handlers: extract, check the caller with
//! [`crate::access::check`], delegate to the service modules (which reach
//! Postgres only through [`crate::store`]), audit, answer.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use chrono::{NaiveDate, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::access::{audit, check, Access, Principal};
use crate::error::BillingError;
use crate::extract::{Json, Path, Query, Text};
use crate::params::{FocusFormat, InvoiceFormat, RequestId, Share, TenantId};
use crate::period::Month;
use crate::rating::PriceBook;
use crate::state::AppState;
use crate::tenant::Tenant;
use crate::{export, lifecycle, lookup, shadow, store};

/// `{tenant}/…/{period}` in a path.
#[derive(Deserialize)]
pub struct TenantMonth {
    tenant: TenantId,
    period: Month,
}

/// The tenant, or 404.
pub(crate) async fn known_tenant(
    conn: &mut sqlx::PgConnection,
    tenant: &str,
) -> Result<Tenant, BillingError> {
    store::tenants::get(conn, tenant)
        .await?
        .ok_or(BillingError::NotFound)
}

#[utoipa::path(get, path = "/v1/tenants/{tenant}/invoices/{period}", params(("tenant" = TenantId, Path), ("period" = Month, Path)),
    responses(
        (status = 200, description = "the finalized invoice, or a fresh draft", body = crate::invoice::Invoice),
        (status = 403, description = "the role may not read money", body = crate::error::ErrorBody),
        (status = 404, description = "no such tenant, or not this caller's", body = crate::error::ErrorBody),
        (status = 409, description = "no price book is in effect for the month, or usage of a model it does not price", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get_invoice(
    State(state): State<AppState>,
    who: Principal,
    Path(TenantMonth { tenant, period }): Path<TenantMonth>,
) -> Result<Response, BillingError> {
    let tenant = tenant.as_str();
    check(&who, Some(tenant), Access::ReadMoney)?;
    let mut conn = state.pool.acquire().await?;
    known_tenant(&mut conn, tenant).await?;
    let invoice = lifecycle::current(&mut conn, tenant, period).await?;
    audit(&mut conn, &who, "read_invoice", Some(tenant), None).await?;
    Ok(Json(invoice).into_response())
}

#[utoipa::path(post, path = "/v1/tenants/{tenant}/invoices/{period}/finalize", params(("tenant" = TenantId, Path), ("period" = Month, Path)),
    responses(
        (status = 200, description = "the finalized invoice (the same one when called again)", body = crate::invoice::Invoice),
        (status = 403, description = "only finance finalizes", body = crate::error::ErrorBody),
        (status = 404, description = "no such tenant, or not this caller's", body = crate::error::ErrorBody),
        (status = 409, description = "the month has not ended, or it cannot be rated (no price book, an unpriced model)", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn finalize_invoice(
    State(state): State<AppState>,
    who: Principal,
    Path(TenantMonth { tenant, period }): Path<TenantMonth>,
) -> Result<Response, BillingError> {
    let tenant = tenant.as_str();
    check(&who, Some(tenant), Access::ManageMoney)?;
    known_tenant(&mut *state.pool.acquire().await?, tenant).await?;
    let (invoice, _) =
        lifecycle::finalize(&state.pool, tenant, period, &who.token_id, Utc::now()).await?;
    audit(
        &mut *state.pool.acquire().await?,
        &who,
        "finalize_invoice",
        Some(tenant),
        None,
    )
    .await?;
    Ok(Json(invoice).into_response())
}

#[derive(Deserialize, utoipa::ToSchema)]
#[schema(example = json!({"reason": "wrong rate applied"}))]
pub struct VoidBody {
    /// Why the invoice is voided; not blank.
    #[serde(deserialize_with = "crate::extract::text")]
    #[schema(schema_with = void_reason_schema)]
    reason: String,
}

fn void_reason_schema() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
    crate::params::not_blank_schema("Why the invoice is voided; not blank.")
}

#[utoipa::path(post, path = "/v1/tenants/{tenant}/invoices/{period}/void", params(("tenant" = TenantId, Path), ("period" = Month, Path)), request_body = VoidBody,
    responses(
        (status = 200, description = "the voided invoice", body = crate::invoice::Invoice),
        (status = 403, description = "only finance voids", body = crate::error::ErrorBody),
        (status = 404, description = "no such tenant, or not this caller's", body = crate::error::ErrorBody),
        (status = 409, description = "no finalized invoice for the month", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn void_invoice(
    State(state): State<AppState>,
    who: Principal,
    Path(TenantMonth { tenant, period }): Path<TenantMonth>,
    Json(body): Json<VoidBody>,
) -> Result<Response, BillingError> {
    let tenant = tenant.as_str();
    check(&who, Some(tenant), Access::ManageMoney)?;
    let mut conn = state.pool.acquire().await?;
    known_tenant(&mut conn, tenant).await?;
    let invoice = lifecycle::void(&mut conn, tenant, period, &body.reason, &who.token_id).await?;
    audit(&mut conn, &who, "void_invoice", Some(tenant), None).await?;
    Ok(Json(invoice).into_response())
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"amount": "12500.00"}))]
pub struct BudgetBody {
    /// The month's budget in the billing currency, as decimal text (money
    /// is never a JSON number here): above 0, in cents at most, below
    /// 1,000,000,000,000.
    #[serde(deserialize_with = "crate::extract::text")]
    #[schema(schema_with = crate::budget::amount_schema)]
    amount: String,
}

/// A budget as set.
#[derive(Serialize, utoipa::ToSchema)]
pub struct BudgetSet {
    tenant_id: String,
    period: String,
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String)]
    amount: Decimal,
}

#[utoipa::path(put, path = "/v1/tenants/{tenant}/budgets/{period}", params(("tenant" = TenantId, Path), ("period" = Month, Path)), request_body = BudgetBody,
    responses(
        (status = 200, description = "the budget as set; the shadow bill measures the month against it", body = BudgetSet),
        (status = 403, description = "only finance sets budgets", body = crate::error::ErrorBody),
        (status = 404, description = "no such tenant, or not this caller's", body = crate::error::ErrorBody),
        (status = 409, description = "the month's invoice is finalized: its budget no longer changes", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn put_budget(
    State(state): State<AppState>,
    who: Principal,
    Path(TenantMonth { tenant, period }): Path<TenantMonth>,
    Json(body): Json<BudgetBody>,
) -> Result<Response, BillingError> {
    let tenant = tenant.as_str();
    check(&who, Some(tenant), Access::ManageMoney)?;
    let amount = crate::budget::parse_amount(&body.amount)?;
    let mut tx = state.pool.begin().await?;
    crate::budget::set(&mut tx, &who, tenant, period, amount).await?;
    tx.commit().await?;
    Ok(Json(BudgetSet {
        tenant_id: tenant.to_owned(),
        period: period.to_string(),
        amount,
    })
    .into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ShadowQuery {
    /// The month; the current month in the tenant's zone when absent.
    period: Option<Month>,
    /// Share of peak usage to imagine moved off-peak (default 0.25).
    shift: Option<Share>,
}

#[utoipa::path(get, path = "/v1/tenants/{tenant}/shadow-bill", params(("tenant" = TenantId, Path), ShadowQuery),
    responses(
        (status = 200, description = "what the tenant would pay", body = crate::shadow::ShadowBill),
        (status = 403, description = "the role may not read money", body = crate::error::ErrorBody),
        (status = 404, description = "no such tenant, or not this caller's", body = crate::error::ErrorBody),
        (status = 409, description = "no price book is in effect for the month, or usage of a model it does not price", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn shadow_bill(
    State(state): State<AppState>,
    who: Principal,
    Path(tenant): Path<TenantId>,
    Query(q): Query<ShadowQuery>,
) -> Result<Response, BillingError> {
    let tenant = tenant.as_str();
    check(&who, Some(tenant), Access::ReadMoney)?;
    let mut conn = state.pool.acquire().await?;
    let t = known_tenant(&mut conn, tenant).await?;
    let now = Utc::now();
    let month = q
        .period
        .unwrap_or_else(|| Month::containing(now, t.time_zone));
    let shift = q.shift.map_or(Decimal::new(25, 2), |s| s.0);
    let bill = shadow::shadow_bill(&mut conn, &t, month, shift, now).await?;
    audit(&mut conn, &who, "read_shadow_bill", Some(tenant), None).await?;
    Ok(Json(bill).into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The month.
    period: Month,
    /// `json` (default), or `csv` with the next cursor in `X-Next-Cursor`.
    format: Option<InvoiceFormat>,
    /// The last tenant id of the previous page (its `next_cursor`).
    cursor: Option<TenantId>,
    /// Invoices per page (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

/// A page of `GET /v1/invoices`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct InvoicePage {
    invoices: Vec<crate::invoice::Invoice>,
    /// The cursor of the next page; null on the last one.
    #[schema(value_type = Option<TenantId>)]
    next_cursor: Option<String>,
}

/// Every tenant's invoice for a month, a page at a time (cursor = last tenant id).
#[utoipa::path(get, path = "/v1/invoices", params(ListQuery),
    responses(
        (status = 200, description = "a page of invoices: JSON, or CSV with format=csv",
            headers(("X-Next-Cursor" = TenantId, description = "CSV only: the cursor of the next page, absent on the last one")),
            content(
                (InvoicePage = "application/json"),
                (String = "text/csv"),
            )),
        (status = 403, description = "only finance lists every tenant", body = crate::error::ErrorBody),
        (status = 409, description = "no price book is in effect for the month, or usage of a model it does not price", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_invoices(
    State(state): State<AppState>,
    who: Principal,
    Query(q): Query<ListQuery>,
) -> Result<Response, BillingError> {
    check(&who, None, Access::ManageMoney)?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(BillingError::BadRequest(
            "limit must be between 1 and 1000".into(),
        ));
    }
    let mut conn = state.pool.acquire().await?;
    let ids =
        store::tenants::page(&mut conn, q.cursor.as_ref().map(TenantId::as_str), limit).await?;
    let invoices = lifecycle::current_many(&mut conn, q.period, &ids).await?;
    audit(&mut conn, &who, "list_invoices", None, None).await?;
    let next = (ids.len() as i64 == limit)
        .then(|| ids.last().cloned())
        .flatten();
    match q.format.unwrap_or_default() {
        InvoiceFormat::Json => Ok(Json(InvoicePage {
            invoices,
            next_cursor: next,
        })
        .into_response()),
        InvoiceFormat::Csv => Ok(csv_response(export::invoices_csv(&invoices)?, next)),
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FocusQuery {
    /// The month.
    period: Month,
    /// `csv` (default) or `parquet`.
    format: Option<FocusFormat>,
}

/// The FOCUS cost-and-usage dataset for a month, every tenant, as CSV or Parquet.
#[utoipa::path(get, path = "/v1/exports/focus", params(FocusQuery),
    responses(
        (status = 200, description = "the FOCUS cost-and-usage dataset as CSV, or Parquet with format=parquet",
            content(
                (String = "text/csv"),
                (Vec<u8> = "application/vnd.apache.parquet"),
            )),
        (status = 403, description = "only finance exports", body = crate::error::ErrorBody),
        (status = 409, description = "no price book is in effect for the month, or usage of a model it does not price", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn focus_export(
    State(state): State<AppState>,
    who: Principal,
    Query(q): Query<FocusQuery>,
) -> Result<Response, BillingError> {
    check(&who, None, Access::ManageMoney)?;
    let mut conn = state.pool.acquire().await?;
    let tenants = store::tenants::list(&mut conn, None).await?;
    let ids: Vec<String> = tenants.iter().map(|t| t.tenant_id.clone()).collect();
    let invoices = lifecycle::current_many(&mut conn, q.period, &ids).await?;
    audit(&mut conn, &who, "export_focus", None, None).await?;
    match q.format.unwrap_or_default() {
        FocusFormat::Csv => Ok(csv_response(export::focus_csv(&invoices, &tenants)?, None)),
        FocusFormat::Parquet => Ok((
            [
                (header::CONTENT_TYPE, "application/vnd.apache.parquet"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"focus.parquet\"",
                ),
            ],
            export::focus_parquet(&invoices, &tenants)?,
        )
            .into_response()),
    }
}

fn csv_response(body: String, next: Option<String>) -> Response {
    let mut res = ([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], body).into_response();
    if let Some(next) = next.and_then(|n| n.parse().ok()) {
        res.headers_mut().insert("x-next-cursor", next);
    }
    res
}

#[utoipa::path(get, path = "/v1/requests/{request_id}", params(("request_id" = RequestId, Path)),
    responses(
        (status = 200, description = "the request and the invoice it was billed on, without money, from request_log or (past its retention) the archive", body = crate::lookup::Lookup),
        (status = 404, description = "no such request, or (for a team lead) another tenant's", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn lookup_request(
    State(state): State<AppState>,
    who: Principal,
    Path(RequestId(id)): Path<RequestId>,
) -> Result<Response, BillingError> {
    let mut conn = state.pool.acquire().await?;
    let found = lookup::lookup(&mut conn, state.archive.as_ref(), id)
        .await?
        .ok_or(BillingError::NotFound)?;
    check(&who, Some(&found.request.tenant_id), Access::LookupRequest)?;
    audit(
        &mut conn,
        &who,
        "lookup_request",
        Some(&found.request.tenant_id),
        None,
    )
    .await?;
    Ok(Json(found).into_response())
}

/// What `POST /v1/price-books` loaded.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LoadedBook {
    version: String,
    effective_from: NaiveDate,
}

/// Loads a price book (YAML body, of any content type; see `config/price-book.yaml`).
#[utoipa::path(post, path = "/v1/price-books", request_body(content = PriceBook, content_type = "application/yaml", description = "a price book in YAML"),
    responses(
        (status = 200, description = "loaded (replacing a book of the same version)", body = LoadedBook),
        (status = 403, description = "only finance loads price books", body = crate::error::ErrorBody),
        (status = 409, description = "a book of another version already takes effect on that day", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn put_price_book(
    State(state): State<AppState>,
    who: Principal,
    Text(body): Text,
) -> Result<Response, BillingError> {
    check(&who, None, Access::ManageMoney)?;
    let book = PriceBook::from_yaml(&body)?;
    let mut conn = state.pool.acquire().await?;
    store::price_books::put(&mut conn, &book).await?;
    audit(
        &mut conn,
        &who,
        "load_price_book",
        None,
        Some(&book.version),
    )
    .await?;
    Ok(Json(LoadedBook {
        version: book.version,
        effective_from: book.effective_from,
    })
    .into_response())
}
