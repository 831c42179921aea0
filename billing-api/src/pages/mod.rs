//! The pages: server-rendered HTML (maud templates compiled into the
//! binary), behind the same roles and the same service modules as the JSON
//! API. Sign in with a billing token; the session lives in Postgres and the
//! browser holds its id in an HttpOnly cookie ([`session`]). Every form
//! carries the session's CSRF token. Nothing is fetched from the network:
//! the stylesheet is inline and the charts are SVG drawn by the server
//! ([`chart`]); no page needs JavaScript.
//!
//! Layout:
//! - [`session`]: sign-in, sessions, CSRF
//! - [`layout`]: the page frame, stylesheet (with print rules) and error pages
//! - [`format`]: money, counts and shares for people
//! - [`chart`]: SVG charts
//! - [`shadow_page`], [`invoices_page`], [`lookup_page`], [`tokens_page`]: the pages

pub mod chart;
pub mod format;
pub mod invoices_page;
pub mod layout;
pub mod lookup_page;
pub mod session;
pub mod shadow_page;
pub mod tokens_page;

use axum::extract::rejection::{FormRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;

use crate::access::Role;
use crate::error::BillingError;
use crate::state::AppState;

/// Why a page could not be shown: not signed in (a redirect to the sign-in
/// page), or a [`BillingError`] with its status, as an HTML page.
#[derive(Debug)]
pub enum PageError {
    SignIn,
    Billing(BillingError),
}

impl From<BillingError> for PageError {
    fn from(e: BillingError) -> Self {
        match e {
            BillingError::Unauthenticated => Self::SignIn,
            e => Self::Billing(e),
        }
    }
}

macro_rules! page_error_from {
    ($($t:ty),*) => {$(
        impl From<$t> for PageError {
            fn from(e: $t) -> Self {
                Self::Billing(BillingError::from(e))
            }
        }
    )*};
}

page_error_from!(sqlx::Error, QueryRejection, PathRejection);

impl From<FormRejection> for PageError {
    fn from(e: FormRejection) -> Self {
        Self::Billing(BillingError::BadRequest(e.body_text()))
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        match self {
            Self::SignIn => Redirect::to("/sign-in").into_response(),
            Self::Billing(e) => layout::error_page(e),
        }
    }
}

/// A page's query string.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(PageError))]
pub struct Query<T>(pub T);

/// A page's path parameters.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(PageError))]
pub struct Path<T>(pub T);

/// A submitted form.
#[derive(FromRequest)]
#[from_request(via(axum::Form), rejection(PageError))]
pub struct Form<T>(pub T);

/// A form that carries only the CSRF token (and maybe a confirmation).
#[derive(Deserialize)]
pub struct CsrfForm {
    pub csrf: String,
    /// `on` when the confirmation box was ticked.
    pub confirm: Option<String>,
}

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
