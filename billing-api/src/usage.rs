//! `GET /v1/tenants/{tenant}/usage?from=…&to=…`: the tenant's hourly usage
//! rows in `[from, to)`, with totals. Numbers are integers; GPU time is a
//! decimal string.

use axum::extract::State;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::access::{audit, check, Access, Principal};
use crate::error::BillingError;
use crate::extract::{Json, Path, Query};
use crate::params::TenantId;
use crate::state::AppState;
use crate::store;

/// The longest range one call may ask for.
const MAX_RANGE_DAYS: i64 = 366;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct Range {
    /// RFC 3339, inclusive.
    #[param(format = DateTime, example = "2026-11-01T00:00:00Z")]
    from: String,
    /// RFC 3339, exclusive; after `from`, at most 366 days after it.
    #[param(format = DateTime, example = "2026-12-01T00:00:00Z")]
    to: String,
}

pub use crate::store::usage::HourRow;

#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
pub struct Totals {
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    #[serde(with = "rust_decimal::serde::str")]
    pub gpu_seconds: Decimal,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UsageResponse {
    pub tenant_id: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub hours: Vec<HourRow>,
    pub totals: Totals,
}

fn parse_time(name: &str, value: &str) -> Result<DateTime<Utc>, BillingError> {
    DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            BillingError::BadRequest(format!(
                "`{name}` must be an RFC 3339 time such as 2026-11-01T00:00:00Z: {e}"
            ))
        })
}

#[utoipa::path(get, path = "/v1/tenants/{tenant}/usage",
    params(("tenant" = TenantId, Path), Range),
    responses(
        (status = 200, description = "hourly usage rows and totals", body = UsageResponse),
        (status = 403, description = "the role may not read usage", body = crate::error::ErrorBody),
        (status = 404, description = "no such tenant, or not this caller's", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn tenant_usage(
    State(state): State<AppState>,
    who: Principal,
    Path(tenant): Path<TenantId>,
    Query(range): Query<Range>,
) -> Result<Json<UsageResponse>, BillingError> {
    let tenant = tenant.into_string();
    check(&who, Some(&tenant), Access::ReadMoney)?;
    let from = parse_time("from", &range.from)?;
    let to = parse_time("to", &range.to)?;
    if to <= from {
        return Err(BillingError::BadRequest("`to` must be after `from`".into()));
    }
    if (to - from).num_days() > MAX_RANGE_DAYS {
        return Err(BillingError::BadRequest(format!(
            "the range may span at most {MAX_RANGE_DAYS} days"
        )));
    }
    let mut conn = state.pool.acquire().await?;
    if store::tenants::get(&mut conn, &tenant).await?.is_none() {
        return Err(BillingError::NotFound);
    }
    let hours = store::usage::hours(&mut conn, &tenant, from, to).await?;
    let mut totals = Totals::default();
    for h in &hours {
        totals.requests += h.requests;
        totals.prompt_tokens += h.prompt_tokens;
        totals.cached_tokens += h.cached_tokens;
        totals.completion_tokens += h.completion_tokens;
        totals.gpu_seconds += h.gpu_seconds;
    }
    audit(&mut conn, &who, "read_usage", Some(&tenant), None).await?;
    Ok(Json(UsageResponse {
        tenant_id: tenant,
        from,
        to,
        hours,
        totals,
    }))
}
