//! Request lookup for support: paste an `X-Request-Id`, get the request's
//! usage record and the invoice it landed on. No money in the answer.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::drafts;
use crate::error::BillingError;
use crate::invoice::Status;
use crate::period::Month;

#[derive(Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct RequestRecord {
    #[sqlx(skip)]
    pub request_id: String,
    pub tenant_id: String,
    pub api_key_id: String,
    pub model: String,
    pub model_version: String,
    pub priority: i16,
    pub started_at: DateTime<Utc>,
    pub first_token_at: Option<DateTime<Utc>>,
    pub finished_at: DateTime<Utc>,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    #[serde(with = "rust_decimal::serde::str")]
    pub gpu_seconds: Decimal,
    pub finish_reason: String,
    pub gateway_id: String,
    pub replica_id: String,
    pub stream: bool,
    pub ingested_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct InvoiceRef {
    pub period: String,
    pub status: Status,
    pub number: Option<i64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Lookup {
    pub request: RequestRecord,
    pub invoice: InvoiceRef,
}

pub async fn lookup(pool: &PgPool, id: Uuid) -> Result<Option<Lookup>, BillingError> {
    let record: Option<RequestRecord> = sqlx::query_as(
        "SELECT tenant_id, api_key_id, model, model_version, priority, started_at, first_token_at,
                finished_at, prompt_tokens, cached_tokens, completion_tokens, gpu_seconds,
                finish_reason, gateway_id, replica_id, stream, ingested_at
         FROM request_log WHERE request_id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?;
    let Some(mut request) = record else {
        return Ok(None);
    };
    request.request_id = format!("req_{id}");
    let ids = [request.tenant_id.clone()];
    let tenant = drafts::tenants(pool, Some(&ids))
        .await?
        .pop()
        .ok_or(BillingError::NotFound)?;
    let month = Month::containing(request.started_at, tenant.time_zone);
    let invoice = match crate::lifecycle::finalized(pool, &tenant.tenant_id, month).await? {
        Some(inv) => InvoiceRef {
            period: month.to_string(),
            status: inv.status,
            number: inv.number,
        },
        None => InvoiceRef {
            period: month.to_string(),
            status: Status::Draft,
            number: None,
        },
    };
    Ok(Some(Lookup { request, invoice }))
}
