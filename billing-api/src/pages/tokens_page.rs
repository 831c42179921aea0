//! Finance's token administration page: every token (never the token
//! itself), issue a token for a role and tenant (shown once), revoke one
//! (its sessions end at once). Through [`crate::tokens`], as the API and
//! the CLI, so every issue and revoke is audited.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;

use crate::access::{check, Access};
use crate::error::BillingError;
use crate::pages::layout::{html, page};
use crate::pages::session::PageUser;
use crate::pages::{CsrfForm, Form, PageError, Path};
use crate::params::TenantId;
use crate::state::AppState;
use crate::tokens::{self, IssueRequest};

pub async fn list(State(state): State<AppState>, user: PageUser) -> Result<Response, PageError> {
    render(&state, &user, None).await
}

async fn render(
    state: &AppState,
    user: &PageUser,
    issued: Option<tokens::Issued>,
) -> Result<Response, PageError> {
    check(&user.who, None, Access::AdministerTokens)?;
    let all = tokens::list(&state.pool, &user.who).await?;
    let body = html! {
        h1 { "Billing tokens" }
        @if let Some(i) = &issued {
            div.warn #issued {
                p { "Issued " strong { (i.token_id) } " (" (i.role) @if let Some(t) = &i.tenant_id { ", " (t) } "). Copy the token now; it is not shown again:" }
                p { code #new-token { (i.token) } }
            }
        }
        h2 { "Issue a token" }
        form method="post" action="/pages/tokens" {
            input type="hidden" name="csrf" value=(user.csrf);
            label { "Role " select name="role" { option value="team_lead" { "team lead" } option value="finance" { "finance" } option value="support" { "support" } } }
            " " label { "Tenant (team leads) " input type="text" name="tenant_id" size="20"; }
            " " label { "Label " input type="text" name="label" size="20"; }
            " " button type="submit" #issue { "Issue" }
        }
        h2 { "Tokens" }
        table #tokens {
            thead { tr { th { "Id" } th { "Role" } th { "Tenant" } th { "Label" } th { "Created (UTC)" } th { "State" } th {} } }
            tbody {
                @for t in &all {
                    tr data-token=(t.token_id) {
                        td { (t.token_id) } td { (t.role) } td { (t.tenant_id.as_deref().unwrap_or("")) } td { (t.label) }
                        td { (t.created_at.format("%Y-%m-%d %H:%M")) }
                        td { @if t.revoked_at.is_some() { "revoked" } @else { "live" } }
                        td {
                            @if t.revoked_at.is_none() {
                                form.inline method="post" action=(format!("/pages/tokens/{}/revoke", t.token_id)) {
                                    input type="hidden" name="csrf" value=(user.csrf);
                                    label { input type="checkbox" name="confirm"; " sure" }
                                    " " button type="submit" { "Revoke" }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html(
        StatusCode::OK,
        page(Some(user.signed()), "Tokens", body),
    ))
}

#[derive(Deserialize)]
pub struct IssueForm {
    csrf: String,
    role: String,
    tenant_id: Option<String>,
    label: Option<String>,
}

pub async fn issue(
    State(state): State<AppState>,
    user: PageUser,
    Form(form): Form<IssueForm>,
) -> Result<Response, PageError> {
    user.check_csrf(&form.csrf)?;
    let tenant_id = match form
        .tenant_id
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        Some(t) => Some(TenantId::parse(t).map_err(BillingError::BadRequest)?),
        None => None,
    };
    let label = form.label.unwrap_or_default();
    if label.contains('\0') || form.role.contains('\0') {
        return Err(BillingError::BadRequest(serving::nul_message("label")).into());
    }
    let issued = tokens::issue(
        &state.pool,
        &user.who,
        &IssueRequest {
            role: form.role,
            tenant_id,
            label,
        },
    )
    .await?;
    render(&state, &user, Some(issued)).await
}

#[derive(Deserialize)]
pub struct TokenPath {
    token_id: String,
}

pub async fn revoke(
    State(state): State<AppState>,
    user: PageUser,
    Path(TokenPath { token_id }): Path<TokenPath>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, PageError> {
    user.check_csrf(&form.csrf)?;
    if form.confirm.as_deref() != Some("on") {
        return Err(BillingError::BadRequest(
            "confirm: tick the box beside Revoke to go ahead".into(),
        )
        .into());
    }
    if token_id.contains('\0') {
        return Err(BillingError::BadRequest(serving::nul_message("token_id")).into());
    }
    tokens::revoke(&state.pool, &user.who, &token_id).await?;
    Ok(Redirect::to("/pages/tokens").into_response())
}
