//! Token administration, one service for the API, the pages and the CLI:
//! issue (a random token shown once, stored as its hash), list (never the
//! token), revoke (immediately, ending the token's page sessions). Every
//! issue and revoke is written to the audit log with who did it.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::access::{audit, check, Access, Principal, Role};
use crate::auth::hash_token;
use crate::error::BillingError;
use crate::params::TenantId;
use crate::store::{self, access::TokenInfo};

/// What finance asks for when issuing a token.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct IssueRequest {
    /// `finance`, `team_lead` or `support`.
    #[serde(deserialize_with = "crate::extract::text")]
    pub role: String,
    /// The tenant a team lead sees; absent for finance and support.
    #[schema(value_type = Option<TenantId>)]
    pub tenant_id: Option<TenantId>,
    /// A label people recognise the token by (e.g. who holds it).
    #[serde(default, deserialize_with = "crate::extract::text")]
    pub label: String,
}

/// A token just issued: the only time the token itself is shown.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Issued {
    pub token_id: String,
    /// The bearer token; store it now, it is never shown again.
    pub token: String,
    pub role: String,
    pub tenant_id: Option<String>,
}

/// Issues a token for a role (and tenant, for a team lead).
pub async fn issue(
    pool: &PgPool,
    who: &Principal,
    req: &IssueRequest,
) -> Result<Issued, BillingError> {
    check(who, None, Access::AdministerTokens)?;
    let role = Role::parse(&req.role).ok_or_else(|| {
        BillingError::BadRequest(format!(
            "role {:?} must be finance, team_lead or support",
            req.role
        ))
    })?;
    let tenant = req.tenant_id.as_ref().map(TenantId::as_str);
    match (role, tenant) {
        (Role::TeamLead, None) => {
            return Err(BillingError::BadRequest(
                "tenant_id: a team lead's token needs the tenant it sees".into(),
            ))
        }
        (Role::Finance | Role::Support, Some(_)) => {
            return Err(BillingError::BadRequest(
                "tenant_id: only a team lead's token is bound to a tenant".into(),
            ))
        }
        _ => {}
    }
    if req.label.chars().count() > 200 {
        return Err(BillingError::BadRequest(
            "label: at most 200 characters".into(),
        ));
    }
    let token = format!("mlb_{}", hex::encode(rand::random::<[u8; 24]>()));
    let token_id = format!("tok_{}", uuid::Uuid::now_v7().simple());
    let mut tx = pool.begin().await?;
    if let Some(t) = tenant {
        if store::tenants::get(&mut tx, t).await?.is_none() {
            return Err(BillingError::BadRequest(format!(
                "tenant_id: tenant {t:?} does not exist"
            )));
        }
    }
    store::access::put_token(
        &mut tx,
        &token_id,
        &hash_token(&token),
        role.as_str(),
        tenant,
        &req.label,
        Some(&who.token_id),
    )
    .await?;
    audit(&mut tx, who, "issue_token", tenant, Some(&token_id)).await?;
    tx.commit().await?;
    Ok(Issued {
        token_id,
        token,
        role: role.as_str().to_owned(),
        tenant_id: tenant.map(str::to_owned),
    })
}

/// Every token (never the token itself).
pub async fn list(pool: &PgPool, who: &Principal) -> Result<Vec<TokenInfo>, BillingError> {
    check(who, None, Access::AdministerTokens)?;
    let mut conn = pool.acquire().await?;
    let tokens = store::access::list_tokens(&mut conn).await?;
    audit(&mut conn, who, "list_tokens", None, None).await?;
    Ok(tokens)
}

/// Revokes a token and ends its sessions.
pub async fn revoke(
    pool: &PgPool,
    who: &Principal,
    token_id: &str,
) -> Result<TokenInfo, BillingError> {
    check(who, None, Access::AdministerTokens)?;
    let mut tx = pool.begin().await?;
    let info = store::access::revoke_token(&mut tx, token_id)
        .await?
        .ok_or(BillingError::NotFound)?;
    audit(
        &mut tx,
        who,
        "revoke_token",
        info.tenant_id.as_deref(),
        Some(token_id),
    )
    .await?;
    tx.commit().await?;
    Ok(info)
}
