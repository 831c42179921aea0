//! Bearer tokens with roles. Tokens are stored as SHA-256 hashes; a token
//! is resolved per request (one indexed lookup) so revocation is immediate.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::error::BillingError;
use crate::service::AppState;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Finance,
    TeamLead,
    Support,
}

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct Principal {
    pub token_id: String,
    pub role: Role,
    /// Set for team leads: the only tenant they may see.
    pub tenant_id: Option<String>,
}

pub fn hash_token(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Upserts a token (given in the clear, stored hashed).
pub async fn put_token(
    pool: &PgPool,
    token_id: &str,
    token: &str,
    role: &str,
    tenant: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO billing_tokens (token_id, token_hash, role, tenant_id) VALUES ($1, $2, $3, $4)
         ON CONFLICT (token_id) DO UPDATE SET token_hash = EXCLUDED.token_hash,
             role = EXCLUDED.role, tenant_id = EXCLUDED.tenant_id, revoked_at = NULL",
    )
    .bind(token_id)
    .bind(hash_token(token).as_slice())
    .bind(role)
    .bind(tenant)
    .execute(pool)
    .await?;
    Ok(())
}

/// The token of an `Authorization: Bearer <token>` value; the scheme is
/// case-insensitive (RFC 9110 §11.1).
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = BillingError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .ok_or(BillingError::Unauthenticated)?;
        let row: Option<(String, String, Option<String>)> = sqlx::query_as(
            "SELECT token_id, role, tenant_id FROM billing_tokens
             WHERE token_hash = $1 AND revoked_at IS NULL",
        )
        .bind(hash_token(token).as_slice())
        .fetch_optional(&state.pool)
        .await?;
        let (token_id, role, tenant_id) = row.ok_or(BillingError::Unauthenticated)?;
        let role = match role.as_str() {
            "finance" => Role::Finance,
            "team_lead" => Role::TeamLead,
            "support" => Role::Support,
            _ => return Err(BillingError::Unauthenticated),
        };
        Ok(Self {
            token_id,
            role,
            tenant_id,
        })
    }
}

/// Records that `who` read money.
pub async fn audit(
    pool: &PgPool,
    who: &Principal,
    action: &str,
    tenant: Option<&str>,
) -> Result<(), sqlx::Error> {
    let role = match who.role {
        Role::Finance => "finance",
        Role::TeamLead => "team_lead",
        Role::Support => "support",
    };
    sqlx::query(
        "INSERT INTO audit_log (token_id, role, action, tenant_id) VALUES ($1, $2, $3, $4)",
    )
    .bind(&who.token_id)
    .bind(role)
    .bind(action)
    .bind(tenant)
    .execute(pool)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::bearer_token;

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
