//! Page sessions: signing in with a billing token starts a server-side
//! session; the browser holds only its id, in an `HttpOnly`,
//! `SameSite=Strict` cookie (`Secure` with `BILLING_SECURE_COOKIES`).
//! Postgres holds the id's SHA-256 hash, the token it was opened with and
//! its expiry (`BILLING_SESSION_MINUTES`). A session ends at its expiry, at
//! sign-out, or when its token is revoked (revocation deletes the token's
//! sessions, and a session resolves only through a live token).
//!
//! CSRF: every form carries a token derived from the session id
//! (`SHA-256("csrf:" + id)`), which a page from another origin cannot read
//! (the cookie is `HttpOnly` and never sent cross-site); every POST checks
//! it. Nothing extra is stored.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use chrono::Utc;
use sha2::{Digest, Sha256};

use crate::access::Principal;
use crate::auth::{hash_token, principal};
use crate::error::BillingError;
use crate::pages::layout::Signed;
use crate::pages::PageError;
use crate::state::AppState;
use crate::store;

pub const COOKIE: &str = "meterline_session";

/// A signed-in page user.
#[derive(Debug, Clone)]
pub struct PageUser {
    pub who: Principal,
    /// The CSRF token this session's forms carry.
    pub csrf: String,
    session_id: String,
}

impl PageUser {
    /// Who the page header shows.
    pub fn signed(&self) -> Signed<'_> {
        Signed {
            who: &self.who,
            csrf: &self.csrf,
        }
    }

    /// Refuses a form whose CSRF token is not this session's.
    pub fn check_csrf(&self, given: &str) -> Result<(), PageError> {
        // Hashes compared, so the time taken says nothing about the token.
        if hash_token(given) == hash_token(&self.csrf) {
            Ok(())
        } else {
            Err(BillingError::CsrfMismatch.into())
        }
    }

    pub fn session_hash(&self) -> [u8; 32] {
        hash_token(&self.session_id)
    }
}

fn csrf_of(session_id: &str) -> String {
    hex::encode(Sha256::digest(format!("csrf:{session_id}").as_bytes()))
}

/// The session id in a request's `Cookie` header, if any.
fn session_cookie(parts: &Parts) -> Option<String> {
    parts
        .headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

impl FromRequestParts<AppState> for PageUser {
    type Rejection = PageError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let id = session_cookie(parts).ok_or(PageError::SignIn)?;
        let mut conn = state.pool.acquire().await.map_err(BillingError::from)?;
        let who = store::access::session(&mut conn, &hash_token(&id), Utc::now())
            .await?
            .and_then(principal)
            .ok_or(PageError::SignIn)?;
        Ok(Self {
            who,
            csrf: csrf_of(&id),
            session_id: id,
        })
    }
}

/// Starts a session for a live token given in the clear: the `Set-Cookie`
/// value, or `None` if the token is not a live one.
pub async fn sign_in(state: &AppState, token: &str) -> Result<Option<String>, BillingError> {
    let Some(who) = crate::auth::resolve_token(state, token).await? else {
        return Ok(None);
    };
    let id = hex::encode(rand::random::<[u8; 32]>());
    let lifetime = chrono::Duration::from_std(state.session_lifetime)
        .map_err(|e| BillingError::Config(format!("session lifetime: {e}")))?;
    let mut conn = state.pool.acquire().await?;
    store::access::create_session(
        &mut conn,
        &hash_token(&id),
        &who.token_id,
        Utc::now() + lifetime,
    )
    .await?;
    crate::access::audit(&mut conn, &who, "sign_in", who.tenant_id.as_deref(), None).await?;
    Ok(Some(cookie(state, &id, state.session_lifetime.as_secs())))
}

/// Ends the user's session; the `Set-Cookie` value that clears it.
pub async fn sign_out(state: &AppState, user: &PageUser) -> Result<String, BillingError> {
    let mut conn = state.pool.acquire().await?;
    store::access::end_session(&mut conn, &user.session_hash(), Utc::now()).await?;
    Ok(cookie(state, "", 0))
}

fn cookie(state: &AppState, value: &str, max_age: u64) -> String {
    let secure = if state.secure_cookies { "; Secure" } else { "" };
    format!("{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}")
}
