//! Request lookup for support: paste an `X-Request-Id`, get the request's
//! usage record and the invoice it was billed on, at any age. No money in
//! the answer.
//!
//! **Where the record comes from.** request_log while it holds the request
//! (its last 30 days), the Parquet archive after that (the archive holds
//! every billed request, forever; `archive::reader::lookup` narrows the
//! files by the time inside the id). Both give the same record; `source`
//! says which answered.
//!
//! **Which invoice.** A request is billed on its own month's invoice (the
//! month in the tenant's zone) unless it was ingested after that invoice
//! was finalized: then it is billed as an adjustment, on the first invoice
//! of a later month finalized after it was ingested — or, while none is,
//! on the draft of the first later month not yet finalized (every later
//! draft shows the adjustment until one is finalized). `adjusts` names the
//! request's own month in that case.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
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
    /// When the request is billed as late usage: its own month, which this
    /// invoice's adjustment line bills.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adjusts: Option<String>,
}

/// Which store answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    RequestLog,
    Archive,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Lookup {
    pub request: RequestRecord,
    pub invoice: InvoiceRef,
    pub source: Source,
}

/// Where lookups find requests older than request_log's retention.
#[derive(Clone)]
pub struct Archive {
    /// The database holding the archive's manifest.
    pub pool: PgPool,
    pub store: std::sync::Arc<archive::store::ArchiveStore>,
}

/// The request and the invoice it was billed on, if request_log or the
/// archive holds it.
pub async fn lookup(
    conn: &mut PgConnection,
    archive: Option<&Archive>,
    id: Uuid,
) -> Result<Option<Lookup>, BillingError> {
    let (request, source) = match store::usage::request(conn, id).await? {
        Some(r) => (r, Source::RequestLog),
        None => match archived(archive, id).await? {
            Some(r) => (r, Source::Archive),
            None => return Ok(None),
        },
    };
    let tenant = store::tenants::get(conn, &request.tenant_id)
        .await?
        .ok_or(BillingError::NotFound)?;
    let month = Month::containing(request.started_at, tenant.time_zone);
    let invoice = billed_on(conn, &tenant.tenant_id, month, request.ingested_at).await?;
    Ok(Some(Lookup {
        request,
        invoice,
        source,
    }))
}

/// The archived record of `id`, as request_log would give it.
async fn archived(
    archive: Option<&Archive>,
    id: Uuid,
) -> Result<Option<RequestRecord>, BillingError> {
    let (Some(a), Ok(rid)) = (archive, usage_contract::RequestId::from_uuid(id)) else {
        return Ok(None);
    };
    let Some(row) = archive::reader::lookup(&a.pool, &a.store, rid)
        .await
        .map_err(|e| BillingError::Internal(format!("archive lookup of {rid}: {e}")))?
    else {
        return Ok(None);
    };
    let e = row.event;
    Ok(Some(RequestRecord {
        request_id: e.request_id.to_string(),
        tenant_id: e.tenant_id,
        api_key_id: e.api_key_id,
        model: e.model,
        model_version: e.model_version,
        priority: e.priority,
        started_at: e.started_at,
        first_token_at: e.first_token_at,
        finished_at: e.finished_at,
        prompt_tokens: e.prompt_tokens,
        cached_tokens: e.cached_tokens,
        completion_tokens: e.completion_tokens,
        gpu_seconds: e.gpu_seconds,
        finish_reason: e.finish_reason.as_str().to_owned(),
        gateway_id: e.gateway_id,
        replica_id: e.replica_id,
        stream: e.stream,
        ingested_at: row.ingested_at,
    }))
}

/// The invoice a request of `month` ingested at `ingested_at` is billed on
/// (see the module docs).
async fn billed_on(
    conn: &mut PgConnection,
    tenant: &str,
    month: Month,
    ingested_at: DateTime<Utc>,
) -> Result<InvoiceRef, BillingError> {
    let own = store::invoices::finalized(conn, tenant, month).await?;
    match own {
        None => {
            return Ok(InvoiceRef {
                period: month.to_string(),
                status: Status::Draft,
                number: None,
                adjusts: None,
            })
        }
        Some(inv) if inv.finalized_at.is_none_or(|at| at >= ingested_at) => {
            return Ok(InvoiceRef {
                period: month.to_string(),
                status: inv.status,
                number: inv.number,
                adjusts: None,
            })
        }
        Some(_) => {}
    }
    let adjusts = Some(month.to_string());
    if let Some(inv) =
        store::invoices::first_finalized_after(conn, tenant, month, ingested_at).await?
    {
        return Ok(InvoiceRef {
            period: inv.body.head.period.clone(),
            status: inv.status,
            number: inv.number,
            adjusts,
        });
    }
    // No later invoice finalized since: the first later month still a draft.
    let done = store::invoices::finalized_periods_after(conn, tenant, month).await?;
    let mut draft = month.next();
    while done.contains(&draft.to_string()) {
        draft = draft.next();
    }
    Ok(InvoiceRef {
        period: draft.to_string(),
        status: Status::Draft,
        number: None,
        adjusts,
    })
}
