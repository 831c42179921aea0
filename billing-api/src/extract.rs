//! How requests become typed input: the crate's `Json`, `Query` and `Path`
//! extractors, the text body, and the NUL check. Each extractor is axum's,
//! declared with `rejection(BillingError)` (axum's `examples/error-handling`),
//! so malformed JSON, queries and paths are answered in the API's own error
//! shape through [`BillingError`]'s one mapping, never as axum's plain text.
//!
//! NUL characters: Postgres refuses them in `text`, so a NUL that reached a
//! query would be a 500. `serving::nul::reject_in_query` (layered on the
//! router) refuses one in the query string;
//! [`reject_nul`] turns away a request whose decoded path parameters
//! contain one (naming the parameter), before any handler runs; JSON string fields are read through [`text`], and the
//! price book checks its own strings.

use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::BillingError;

/// A JSON body (`Content-Type: application/json`), or a JSON response.
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(BillingError))]
pub struct Json<T>(pub T);

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// The query string, deserialized into `T`.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(BillingError))]
pub struct Query<T>(pub T);

/// The path parameters, deserialized into `T`.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(BillingError))]
pub struct Path<T>(pub T);

/// A UTF-8 body of any content type (the price book's YAML).
pub struct Text(pub String);

impl<S: Send + Sync> FromRequest<S> for Text {
    type Rejection = BillingError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(String::from_request(req, state).await?))
    }
}

/// Middleware (a route layer, so the route's parameters are known): a
/// request whose decoded path parameters hold a NUL gets 400.
pub async fn reject_nul(
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
    req: Request,
    next: Next,
) -> Response {
    match nul_param(params) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

fn nul_param(
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
) -> Result<(), BillingError> {
    if let Some((name, _)) = params?.iter().find(|(_, v)| v.contains('\0')) {
        return Err(BillingError::BadRequest(serving::nul_message(name)));
    }
    Ok(())
}

/// Reads a JSON string field that must not hold a NUL:
/// `#[serde(deserialize_with = "crate::extract::text")]`. The error names
/// the field (axum reports the JSON path).
pub fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.contains('\0') {
        return Err(serde::de::Error::custom(
            "contains a NUL character (U+0000), which is never valid here",
        ));
    }
    Ok(s)
}

/// 404 for a path the API does not have (the router's fallback).
pub async fn unknown_path(uri: axum::http::Uri) -> BillingError {
    BillingError::UnknownPath(uri.path().to_owned())
}

/// 405 for a method a path does not take; axum adds `Allow`.
pub async fn method_not_allowed(method: axum::http::Method) -> BillingError {
    BillingError::MethodNotAllowed(method.to_string())
}
