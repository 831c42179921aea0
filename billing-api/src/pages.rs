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
//! - `routes`: the router, the start page, sign-in and sign-out
//! - `error`: [`PageError`], how a page fails
//! - `extract`: the pages' [`Query`], [`Path`] and [`Form`] extractors, and [`CsrfForm`]

pub mod chart;
mod error;
mod extract;
pub mod format;
pub mod invoices_page;
pub mod layout;
pub mod lookup_page;
mod routes;
pub mod session;
pub mod shadow_page;
pub mod tokens_page;

pub use error::PageError;
pub use extract::{CsrfForm, Form, Path, Query};
pub use routes::routes;
