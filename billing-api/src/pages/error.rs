//! [`PageError`], what every page handler and page extractor fails with:
//! a redirect to sign in, or a [`BillingError`] shown as an HTML error page
//! (never the API's JSON). Its own module so the extractors, the session
//! and the handlers all import it from one place.

use axum::extract::rejection::{FormRejection, PathRejection, QueryRejection};
use axum::response::{IntoResponse, Redirect, Response};

use super::layout;
use crate::error::BillingError;

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
