//! Authentication: who is calling. The JSON API takes `Authorization:
//! Bearer <token>`; the pages take a session cookie (see [`crate::pages::session`]).
//! A request with more than one `Authorization` header is refused (400)
//! rather than judged by one of them: a proxy that appends a header, or
//! reads the last one, must not decide whose access a request gets.
//! Tokens are stored as SHA-256 hashes and resolved per request (one
//! indexed lookup), so revocation is immediate. What a caller may do is
//! [`crate::access`]'s business.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::access::{Principal, Role};
use crate::error::BillingError;
use crate::state::AppState;
use crate::store;

pub fn hash_token(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The value of the request's one `Authorization` header (`None` without
/// one, or with one that is not visible ASCII); more than one is an error.
pub fn authorization(headers: &HeaderMap) -> Result<Option<&str>, BillingError> {
    let value = serving::headers::single(headers, "Authorization")
        .map_err(|serving::headers::Repeated(name)| BillingError::RepeatedHeader(name))?;
    Ok(value.and_then(|v| v.to_str().ok()))
}

/// A stored identity as a [`Principal`] (an unknown role is no identity).
pub fn principal(identity: store::access::TokenIdentity) -> Option<Principal> {
    let (token_id, role, tenant_id) = identity;
    Some(Principal {
        token_id,
        role: Role::parse(&role)?,
        tenant_id,
    })
}

/// The caller of a token given in the clear, if it is live.
pub async fn resolve_token(
    state: &AppState,
    token: &str,
) -> Result<Option<Principal>, BillingError> {
    let mut conn = state.pool.acquire().await?;
    Ok(store::access::token_by_hash(&mut conn, &hash_token(token))
        .await?
        .and_then(principal))
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = BillingError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = authorization(&parts.headers)?
            .and_then(serving::headers::bearer)
            .ok_or(BillingError::Unauthenticated)?;
        resolve_token(state, token)
            .await?
            .ok_or(BillingError::Unauthenticated)
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{header, HeaderMap, HeaderValue};

    use super::authorization;
    use crate::error::BillingError;
    use serving::headers::bearer as bearer_token;

    #[test]
    fn a_second_authorization_header_is_refused_naming_it() {
        let mut headers = HeaderMap::new();
        assert_eq!(authorization(&headers).ok(), Some(None));
        headers.append(header::AUTHORIZATION, HeaderValue::from_static("Bearer a"));
        assert_eq!(authorization(&headers).ok(), Some(Some("Bearer a")));
        headers.append(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic Yjpj"),
        );
        let err = authorization(&headers).unwrap_err();
        assert!(matches!(err, BillingError::RepeatedHeader("Authorization")));
        assert_eq!(err.status_code(), 400);
        assert!(err.to_string().contains("Authorization"), "{err}");
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for value in ["Bearer abc", "bearer abc", "BEARER abc", "bEaReR   abc "] {
            assert_eq!(bearer_token(value), Some("abc"), "{value}");
        }
        for value in ["Basic abc", "Bearer", "Bearer ", "Bearerabc", "abc"] {
            assert_eq!(bearer_token(value), None, "{value}");
        }
    }
}
