//! Billing tokens, browser sessions and the audit log in Postgres. Tokens
//! and session ids arrive here already hashed: nothing in the clear is
//! written or compared in SQL.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use crate::error::BillingError;

/// A live token's identity: `(token_id, role, tenant_id)`.
pub type TokenIdentity = (String, String, Option<String>);

/// Inserts a new token (its hash, role and tenant); `false` if its id or
/// its hash is already stored, which is left as it is (a revoked token is
/// never made live again).
pub async fn insert_token(
    conn: &mut PgConnection,
    token_id: &str,
    token_hash: &[u8; 32],
    role: &str,
    tenant: Option<&str>,
    label: &str,
    issued_by: Option<&str>,
) -> Result<bool, BillingError> {
    let inserted: Option<(String,)> = sqlx::query_as(
        "INSERT INTO billing_tokens (token_id, token_hash, role, tenant_id, label, issued_by)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT DO NOTHING
         RETURNING token_id",
    )
    .bind(token_id)
    .bind(token_hash.as_slice())
    .bind(role)
    .bind(tenant)
    .bind(label)
    .bind(issued_by)
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| match &e {
        sqlx::Error::Database(d) if d.constraint() == Some("billing_tokens_tenant_id_fkey") => {
            BillingError::Missing(format!(
                "tenant_id: tenant {:?} does not exist",
                tenant.unwrap_or("")
            ))
        }
        _ => e.into(),
    })?;
    Ok(inserted.is_some())
}

/// The token with this hash, live or revoked.
pub async fn token_info_by_hash(
    conn: &mut PgConnection,
    token_hash: &[u8; 32],
) -> Result<Option<TokenInfo>, BillingError> {
    Ok(sqlx::query_as(
        "SELECT token_id, role, tenant_id, label, issued_by, created_at, revoked_at
         FROM billing_tokens WHERE token_hash = $1",
    )
    .bind(token_hash.as_slice())
    .fetch_optional(&mut *conn)
    .await?)
}

/// The ids of the live finance tokens, locked until the transaction ends:
/// two revocations that would each leave the other's token as the last
/// one are decided one after the other.
pub async fn lock_live_finance_tokens(
    conn: &mut PgConnection,
) -> Result<Vec<String>, BillingError> {
    Ok(sqlx::query_scalar(
        "SELECT token_id FROM billing_tokens
         WHERE role = 'finance' AND revoked_at IS NULL
         ORDER BY token_id FOR UPDATE",
    )
    .fetch_all(&mut *conn)
    .await?)
}

/// The live token with this hash.
pub async fn token_by_hash(
    conn: &mut PgConnection,
    token_hash: &[u8; 32],
) -> Result<Option<TokenIdentity>, BillingError> {
    Ok(sqlx::query_as(
        "SELECT token_id, role, tenant_id FROM billing_tokens
         WHERE token_hash = $1 AND revoked_at IS NULL",
    )
    .bind(token_hash.as_slice())
    .fetch_optional(&mut *conn)
    .await?)
}

/// A token as finance lists it (never its hash).
#[derive(Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct TokenInfo {
    pub token_id: String,
    pub role: String,
    pub tenant_id: Option<String>,
    pub label: String,
    pub issued_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// Every token, newest first.
pub async fn list_tokens(conn: &mut PgConnection) -> Result<Vec<TokenInfo>, BillingError> {
    Ok(sqlx::query_as(
        "SELECT token_id, role, tenant_id, label, issued_by, created_at, revoked_at
         FROM billing_tokens ORDER BY created_at DESC, token_id",
    )
    .fetch_all(&mut *conn)
    .await?)
}

/// Revokes a token and ends its sessions; `None` if there is no such token.
pub async fn revoke_token(
    conn: &mut PgConnection,
    token_id: &str,
) -> Result<Option<TokenInfo>, BillingError> {
    sqlx::query("DELETE FROM billing_sessions WHERE token_id = $1")
        .bind(token_id)
        .execute(&mut *conn)
        .await?;
    Ok(sqlx::query_as(
        "UPDATE billing_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE token_id = $1
         RETURNING token_id, role, tenant_id, label, issued_by, created_at, revoked_at",
    )
    .bind(token_id)
    .fetch_optional(&mut *conn)
    .await?)
}

/// Starts a session for a token.
pub async fn create_session(
    conn: &mut PgConnection,
    session_hash: &[u8; 32],
    token_id: &str,
    expires_at: DateTime<Utc>,
) -> Result<(), BillingError> {
    sqlx::query(
        "INSERT INTO billing_sessions (session_hash, token_id, expires_at) VALUES ($1, $2, $3)",
    )
    .bind(session_hash.as_slice())
    .bind(token_id)
    .bind(expires_at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The live token behind a session that has not expired.
pub async fn session(
    conn: &mut PgConnection,
    session_hash: &[u8; 32],
    now: DateTime<Utc>,
) -> Result<Option<TokenIdentity>, BillingError> {
    Ok(sqlx::query_as(
        "SELECT t.token_id, t.role, t.tenant_id FROM billing_sessions s
         JOIN billing_tokens t USING (token_id)
         WHERE s.session_hash = $1 AND s.expires_at > $2 AND t.revoked_at IS NULL",
    )
    .bind(session_hash.as_slice())
    .bind(now)
    .fetch_optional(&mut *conn)
    .await?)
}

/// Ends a session (sign-out), and any expired ones on the way.
pub async fn end_session(
    conn: &mut PgConnection,
    session_hash: &[u8; 32],
    now: DateTime<Utc>,
) -> Result<(), BillingError> {
    sqlx::query("DELETE FROM billing_sessions WHERE session_hash = $1 OR expires_at <= $2")
        .bind(session_hash.as_slice())
        .bind(now)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Records that `token_id` (in `role`) did `action`.
pub async fn audit(
    conn: &mut PgConnection,
    token_id: &str,
    role: &str,
    action: &str,
    tenant: Option<&str>,
    detail: Option<&str>,
) -> Result<(), BillingError> {
    sqlx::query(
        "INSERT INTO audit_log (token_id, role, action, tenant_id, detail) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(token_id)
    .bind(role)
    .bind(action)
    .bind(tenant)
    .bind(detail)
    .execute(&mut *conn)
    .await?;
    Ok(())
}
