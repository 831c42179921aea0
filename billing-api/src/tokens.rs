//! Token administration, one service for the API, the pages and the CLI:
//! issue (a random token shown once, stored as its hash), list (never the
//! token), revoke (immediately, ending the token's page sessions). Every
//! issue and revoke is written to the audit log with who did it.
//!
//! Two rules keep finance from being locked out or let back in by
//! accident. The last live finance token is not revoked (409 naming the
//! way back, `billing-api token issue`, which needs only the database).
//! And the start-up finance token (`BILLING_BOOTSTRAP_FINANCE_TOKEN`) is
//! judged by its hash, never by its id ([`bootstrap`]): a token that was
//! revoked stays revoked across restarts, and a new value is a new token.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use utoipa::openapi::{RefOr, Schema};
use utoipa::PartialSchema;

use crate::access::{audit, check, Access, Principal, Role};
use crate::auth::hash_token;
use crate::error::BillingError;
use crate::params::TenantId;
use crate::store::{self, access::TokenInfo};

/// The longest label a token may have, in characters.
pub const LABEL_MAX_CHARS: usize = 200;

/// What finance asks for when issuing a token.
#[derive(Debug, Deserialize)]
pub struct IssueRequest {
    /// `finance`, `team_lead` or `support`.
    #[serde(deserialize_with = "crate::extract::text")]
    pub role: String,
    /// The tenant a team lead sees; absent for finance and support.
    pub tenant_id: Option<TenantId>,
    /// A label people recognise the token by (e.g. who holds it).
    #[serde(default, deserialize_with = "crate::extract::text")]
    pub label: String,
}

/// The document states what [`issue`] checks: the role is one of three, a
/// team lead's token names its tenant and no other role's does, the label
/// is at most [`LABEL_MAX_CHARS`] and holds no NUL. That the tenant exists
/// it cannot state (404).
impl utoipa::PartialSchema for IssueRequest {
    fn schema() -> RefOr<Schema> {
        let label = serde_json::json!({
            "type": "string",
            "maxLength": LABEL_MAX_CHARS,
            "pattern": crate::params::TEXT_PATTERN,
            "description": "A label people recognise the token by (e.g. who holds it)."
        });
        let schema = serde_json::json!({
            "description": "What finance asks for when issuing a token: a team lead's token is bound to the tenant it sees, finance's and support's to none.",
            "oneOf": [
                {
                    "type": "object",
                    "required": ["role"],
                    "properties": {
                        "role": {"type": "string", "enum": ["finance", "support"]},
                        "tenant_id": {"type": "null"},
                        "label": label,
                    }
                },
                {
                    "type": "object",
                    "required": ["role", "tenant_id"],
                    "properties": {
                        "role": {"type": "string", "enum": ["team_lead"]},
                        "tenant_id": {"$ref": "#/components/schemas/TenantId"},
                        "label": label,
                    }
                }
            ],
            "example": {"role": "team_lead", "tenant_id": crate::params::EXAMPLE_TENANT, "label": "p1 team lead"}
        });
        #[expect(
            clippy::expect_used,
            reason = "a constant schema, which the OpenAPI tests read"
        )]
        serde_json::from_value(schema).expect("a valid schema")
    }
}

impl utoipa::ToSchema for IssueRequest {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((TenantId::name().into_owned(), TenantId::schema()));
    }
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
    if req.label.chars().count() > LABEL_MAX_CHARS {
        return Err(BillingError::BadRequest(format!(
            "label: at most {LABEL_MAX_CHARS} characters"
        )));
    }
    let token = format!("mlb_{}", hex::encode(rand::random::<[u8; 24]>()));
    let token_id = format!("tok_{}", uuid::Uuid::now_v7().simple());
    let mut tx = pool.begin().await?;
    if let Some(t) = tenant {
        if store::tenants::get(&mut tx, t).await?.is_none() {
            return Err(BillingError::Missing(format!(
                "tenant_id: tenant {t:?} does not exist"
            )));
        }
    }
    let inserted = store::access::insert_token(
        &mut tx,
        &token_id,
        &hash_token(&token),
        role.as_str(),
        tenant,
        &req.label,
        Some(&who.token_id),
    )
    .await?;
    if !inserted {
        return Err(BillingError::Internal(format!(
            "a fresh token {token_id} collided with a stored one"
        )));
    }
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

/// Revokes a token and ends its sessions; the last live finance token is
/// refused (409), naming how to issue another.
pub async fn revoke(
    pool: &PgPool,
    who: &Principal,
    token_id: &str,
) -> Result<TokenInfo, BillingError> {
    check(who, None, Access::AdministerTokens)?;
    let mut tx = pool.begin().await?;
    let finance = store::access::lock_live_finance_tokens(&mut tx).await?;
    if finance == [token_id] {
        return Err(BillingError::Conflict(format!(
            "token {token_id} is the last live finance token; revoking it would leave no one \
             to administer billing. Issue another finance token first (POST /v1/tokens, or \
             `billing-api token issue --role finance` where billing-api reaches its database), \
             then revoke this one"
        )));
    }
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

/// What [`bootstrap`] found or did.
#[derive(Debug, PartialEq, Eq)]
pub enum Bootstrap {
    /// The token was new and is now a live finance token with this id.
    Registered(String),
    /// The token is already a live finance token with this id.
    Live(String),
    /// The token was revoked (this id); it stays revoked.
    Revoked(String),
}

/// The id of the first start-up finance token; a later, different value
/// gets an id of its own (`bootstrap-finance-<uuid>`).
pub const BOOTSTRAP_ID: &str = "bootstrap-finance";

/// Registers `token` (`BILLING_BOOTSTRAP_FINANCE_TOKEN`) as a finance token,
/// judged by its hash: a token stored before is left as it is, live or
/// revoked; a token stored under another role is refused (a configuration
/// error naming the setting); a new value is a new token, beside whatever
/// an earlier value registered (revoke that one if the value was rotated).
/// Safe when several replicas start at once: the insert does nothing if
/// the id or the hash is already there, and the hash is read again.
pub async fn bootstrap(pool: &PgPool, token: &str) -> Result<Bootstrap, BillingError> {
    let hash = hash_token(token);
    let mut conn = pool.acquire().await?;
    for id in [
        BOOTSTRAP_ID.to_owned(),
        format!("{BOOTSTRAP_ID}-{}", uuid::Uuid::now_v7().simple()),
    ] {
        if let Some(stored) = store::access::token_info_by_hash(&mut conn, &hash).await? {
            return judged(stored);
        }
        let inserted = store::access::insert_token(
            &mut conn,
            &id,
            &hash,
            Role::Finance.as_str(),
            None,
            "bootstrap",
            None,
        )
        .await?;
        if inserted {
            return Ok(Bootstrap::Registered(id));
        }
    }
    // Both ids were taken: the hash was stored meanwhile (another replica).
    match store::access::token_info_by_hash(&mut conn, &hash).await? {
        Some(stored) => judged(stored),
        None => Err(BillingError::Internal(
            "BILLING_BOOTSTRAP_FINANCE_TOKEN: could not register the token".into(),
        )),
    }
}

fn judged(stored: TokenInfo) -> Result<Bootstrap, BillingError> {
    if stored.role != Role::Finance.as_str() {
        return Err(BillingError::Config(format!(
            "BILLING_BOOTSTRAP_FINANCE_TOKEN is already the {} token {}; set a finance token of its own",
            stored.role, stored.token_id
        )));
    }
    Ok(match stored.revoked_at {
        Some(_) => Bootstrap::Revoked(stored.token_id),
        None => Bootstrap::Live(stored.token_id),
    })
}
