//! The pages' router ([`routes`]) and the handlers that are no page of
//! their own: the start page's redirect by role, sign-in and sign-out.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;

use super::error::PageError;
use super::extract::{CsrfForm, Form};
use super::{invoices_page, layout, lookup_page, session, shadow_page, tokens_page};
use crate::access::Role;
use crate::state::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(home))
        .route("/sign-in", get(sign_in_page).post(sign_in))
        .route("/sign-out", post(sign_out))
        .route(
            "/pages/tenants/{tenant}/shadow-bill",
            get(shadow_page::show),
        )
        .route(
            "/pages/tenants/{tenant}/budget",
            post(shadow_page::set_budget),
        )
        .route("/pages/invoices", get(invoices_page::list))
        .route(
            "/pages/tenants/{tenant}/invoices/{period}",
            get(invoices_page::one),
        )
        .route(
            "/pages/tenants/{tenant}/invoices/{period}/print",
            get(invoices_page::print),
        )
        .route(
            "/pages/tenants/{tenant}/invoices/{period}/finalize",
            post(invoices_page::finalize),
        )
        .route(
            "/pages/tenants/{tenant}/invoices/{period}/void",
            post(invoices_page::void),
        )
        .route("/pages/periods/{period}/close", post(invoices_page::close))
        .route(
            "/pages/exports/{period}/{format}",
            get(invoices_page::export),
        )
        .route("/pages/lookup", get(lookup_page::show))
        .route(
            "/pages/tokens",
            get(tokens_page::list).post(tokens_page::issue),
        )
        .route("/pages/tokens/{token_id}/revoke", post(tokens_page::revoke))
}

/// Where a signed-in user starts: their role's page.
async fn home(user: Result<session::PageUser, PageError>) -> Response {
    let Ok(user) = user else {
        return Redirect::to("/sign-in").into_response();
    };
    let to = match (user.who.role, user.who.tenant_id.as_deref()) {
        (Role::TeamLead, Some(t)) => format!("/pages/tenants/{t}/shadow-bill"),
        (Role::Finance, _) => "/pages/invoices".to_owned(),
        (Role::Support | Role::TeamLead, _) => "/pages/lookup".to_owned(),
    };
    Redirect::to(&to).into_response()
}

async fn sign_in_page() -> Response {
    layout::sign_in(None, StatusCode::OK)
}

#[derive(Deserialize)]
struct SignIn {
    token: String,
}

async fn sign_in(State(state): State<AppState>, Form(form): Form<SignIn>) -> Response {
    match session::sign_in(&state, form.token.trim()).await {
        Ok(Some(cookie)) => ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response(),
        Ok(None) => layout::sign_in(
            Some("That token is not a live billing token."),
            StatusCode::UNAUTHORIZED,
        ),
        Err(e) => PageError::from(e).into_response(),
    }
}

async fn sign_out(
    State(state): State<AppState>,
    user: session::PageUser,
    Form(form): Form<CsrfForm>,
) -> Result<Response, PageError> {
    user.check_csrf(&form.csrf)?;
    let cookie = session::sign_out(&state, &user).await?;
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/sign-in")).into_response())
}
