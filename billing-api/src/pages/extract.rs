//! What a page takes from a request: its query string, path parameters
//! and submitted form, each axum's extractor declared with
//! `rejection(PageError)` so a malformed one is answered as an HTML error
//! page, and [`CsrfForm`], the form that carries only the CSRF token.

use axum::extract::{FromRequest, FromRequestParts};
use serde::Deserialize;

use super::error::PageError;

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
