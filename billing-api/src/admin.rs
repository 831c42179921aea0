//! The JSON API's administration handlers (finance): close a month, and
//! issue, list and revoke billing tokens. Each delegates to the service
//! modules the pages and the CLI use too.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use serde::Deserialize;

use crate::access::{audit, check, Access, Principal};
use crate::error::BillingError;
use crate::extract::{Json, Path};
use crate::period::Month;
use crate::state::AppState;
use crate::{lifecycle, tokens};

#[derive(Deserialize)]
pub struct PeriodPath {
    period: Month,
}

#[utoipa::path(post, path = "/v1/periods/{period}/close", params(("period" = Month, Path)),
    responses(
        (status = 200, description = "what closing did: the invoices it finalized, and those already finalized", body = lifecycle::CloseReport),
        (status = 403, description = "only finance closes a month", body = crate::error::ErrorBody),
        (status = 409, description = "the month has not ended for some tenant, or it cannot be rated", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn close_month(
    State(state): State<AppState>,
    who: Principal,
    Path(PeriodPath { period }): Path<PeriodPath>,
) -> Result<Response, BillingError> {
    check(&who, None, Access::ManageMoney)?;
    let report = lifecycle::close_month(&state.pool, period, &who.token_id, Utc::now()).await?;
    let detail = format!(
        "{period}: {} finalized, {} already",
        report.finalized.len(),
        report.already_finalized.len()
    );
    audit(
        &mut *state.pool.acquire().await?,
        &who,
        "close_month",
        None,
        Some(&detail),
    )
    .await?;
    Ok(Json(report).into_response())
}

#[utoipa::path(get, path = "/v1/tokens",
    responses(
        (status = 200, description = "every billing token (never the token itself)", body = Vec<crate::store::access::TokenInfo>),
        (status = 403, description = "only finance administers tokens", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_tokens(
    State(state): State<AppState>,
    who: Principal,
) -> Result<Response, BillingError> {
    Ok(Json(tokens::list(&state.pool, &who).await?).into_response())
}

#[utoipa::path(post, path = "/v1/tokens", request_body = tokens::IssueRequest,
    responses(
        (status = 200, description = "the token, shown this once", body = tokens::Issued),
        (status = 400, description = "a bad role or label, or a tenant missing or not allowed for the role", body = crate::error::ErrorBody),
        (status = 403, description = "only finance administers tokens", body = crate::error::ErrorBody),
        (status = 404, description = "the tenant_id names no tenant", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn issue_token(
    State(state): State<AppState>,
    who: Principal,
    Json(req): Json<tokens::IssueRequest>,
) -> Result<Response, BillingError> {
    Ok(Json(tokens::issue(&state.pool, &who, &req).await?).into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TokenPath {
    #[serde(deserialize_with = "crate::extract::text")]
    /// The token's id (its `token_id` in the list).
    // crate::params::TEXT_PATTERN: no NUL (a test holds this literal to it).
    #[param(pattern = "^[^\\u0000]*$")]
    token_id: String,
}

#[utoipa::path(post, path = "/v1/tokens/{token_id}/revoke", params(TokenPath),
    responses(
        (status = 200, description = "the revoked token; its sessions are ended", body = crate::store::access::TokenInfo),
        (status = 403, description = "only finance administers tokens", body = crate::error::ErrorBody),
        (status = 404, description = "no such token", body = crate::error::ErrorBody),
        (status = 409, description = "the last live finance token: issue another first (the message names how)", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn revoke_token(
    State(state): State<AppState>,
    who: Principal,
    Path(TokenPath { token_id }): Path<TokenPath>,
) -> Result<Response, BillingError> {
    Ok(Json(tokens::revoke(&state.pool, &who, &token_id).await?).into_response())
}
