//! Request lookup for support: paste an `X-Request-Id`, get the request's
//! usage record and the invoice it landed on. No money in the answer.

use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::error::BillingError;
use crate::invoice::Status;
use crate::period::Month;
use crate::store;

pub use crate::store::usage::RequestRecord;

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

/// The request and its invoice, if request_log still holds it.
pub async fn lookup(conn: &mut PgConnection, id: Uuid) -> Result<Option<Lookup>, BillingError> {
    let Some(request) = store::usage::request(conn, id).await? else {
        return Ok(None);
    };
    let tenant = store::tenants::get(conn, &request.tenant_id)
        .await?
        .ok_or(BillingError::NotFound)?;
    let month = Month::containing(request.started_at, tenant.time_zone);
    let invoice = match store::invoices::finalized(conn, &tenant.tenant_id, month).await? {
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
