//! Support's request lookup: paste an `X-Request-Id`, see the stored
//! record and the invoice it was billed on (no money). A team lead may look
//! up only their own tenant's requests; another tenant's is a 404.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use maud::html;
use serde::Deserialize;

use crate::access::{audit, check, Access};
use crate::error::BillingError;
use crate::lookup;
use crate::pages::format::count;
use crate::pages::layout::{html, page};
use crate::pages::session::PageUser;
use crate::pages::{PageError, Query};
use crate::params::RequestId;
use crate::state::AppState;

#[derive(Deserialize)]
pub struct LookupQuery {
    request_id: Option<String>,
}

pub async fn show(
    State(state): State<AppState>,
    user: PageUser,
    Query(q): Query<LookupQuery>,
) -> Result<Response, PageError> {
    let asked = q
        .request_id
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let found = match asked {
        None => None,
        Some(text) => {
            let RequestId(id) = RequestId::parse(text).map_err(BillingError::BadRequest)?;
            let mut conn = state.pool.acquire().await?;
            let found = lookup::lookup(&mut conn, state.archive.as_ref(), id)
                .await?
                .ok_or(BillingError::NotFound)?;
            check(
                &user.who,
                Some(&found.request.tenant_id),
                Access::LookupRequest,
            )?;
            audit(
                &mut conn,
                &user.who,
                "lookup_request",
                Some(&found.request.tenant_id),
                None,
            )
            .await?;
            Some(found)
        }
    };
    let body = html! {
        h1 { "Request lookup" }
        form method="get" {
            label { "X-Request-Id " input type="text" name="request_id" size="48" value=(asked.unwrap_or("")) placeholder="req_…"; }
            " " button type="submit" { "Look up" }
        }
        @if let Some(f) = &found {
            @let r = &f.request;
            h2 { (r.request_id) }
            table #request {
                tr { th { "Tenant" } td #tenant { (r.tenant_id) } }
                tr { th { "API key" } td { (r.api_key_id) } }
                tr { th { "Model" } td { (r.model) " (" (r.model_version) "), priority " (r.priority) } }
                tr { th { "Started (UTC)" } td { (r.started_at.to_rfc3339()) } }
                tr { th { "Finished (UTC)" } td { (r.finished_at.to_rfc3339()) } }
                tr { th { "Tokens" } td { (count(r.prompt_tokens)) " prompt (" (count(r.cached_tokens)) " cached), " (count(r.completion_tokens)) " completion" } }
                tr { th { "GPU-seconds" } td { (r.gpu_seconds) } }
                tr { th { "Finish reason" } td { (r.finish_reason) } }
                tr { th { "Replica · gateway" } td { (r.replica_id) " · " (r.gateway_id) } }
                tr { th { "Invoice" } td #invoice { (f.invoice.period) " · " (format!("{:?}", f.invoice.status).to_lowercase())
                    @if let Some(n) = f.invoice.number { " · no. " (n) }
                    @if let Some(m) = &f.invoice.adjusts { " · as an adjustment for " (m) " (it arrived after " (m) " was finalized)" } } }
                tr { th { "Found in" } td #source { @match f.source { lookup::Source::RequestLog => "request_log (the last 30 days)", lookup::Source::Archive => "the archive" } } }
            }
        }
    };
    Ok(html(
        StatusCode::OK,
        page(Some(user.signed()), "Request lookup", body),
    ))
}
