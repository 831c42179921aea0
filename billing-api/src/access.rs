//! The role rules, in one place: every handler, JSON or page, asks here
//! before it reads or changes anything.
//!
//! - finance sees and manages every tenant, and administers tokens;
//! - a team lead sees only their own tenant's usage, invoices, shadow bill,
//!   budget and requests; another tenant's id is a 404, never a 403, so ids
//!   can't be probed;
//! - support looks up requests (any tenant) and sees no money.

use crate::error::BillingError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Finance,
    TeamLead,
    Support,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Finance => "finance",
            Self::TeamLead => "team_lead",
            Self::Support => "support",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "finance" => Some(Self::Finance),
            "team_lead" => Some(Self::TeamLead),
            "support" => Some(Self::Support),
            _ => None,
        }
    }
}

/// The authenticated caller (by bearer token or by a page session).
#[derive(Debug, Clone)]
pub struct Principal {
    pub token_id: String,
    pub role: Role,
    /// Set for team leads: the only tenant they may see.
    pub tenant_id: Option<String>,
}

/// What a caller wants to do.
#[derive(Debug, Clone, Copy)]
pub enum Access {
    /// Read a tenant's money (invoices, shadow bills, usage, budget).
    ReadMoney,
    /// Change or export money, read every tenant, load price books (finance only).
    ManageMoney,
    /// Issue, list and revoke tokens (finance only).
    AdministerTokens,
    /// Look up one request (no money): support, finance, and a team lead for
    /// their own tenant's requests.
    LookupRequest,
}

/// Whether `who` may do `access` on `tenant` (`None`: not about one tenant).
pub fn check(who: &Principal, tenant: Option<&str>, access: Access) -> Result<(), BillingError> {
    let own = match (tenant, who.tenant_id.as_deref()) {
        (Some(t), Some(mine)) => t == mine,
        _ => false,
    };
    match (who.role, access) {
        (Role::Finance, _) => Ok(()),
        (Role::Support, Access::LookupRequest) => Ok(()),
        (Role::Support, _) => Err(BillingError::Forbidden),
        // Another tenant's data does not exist for a team lead.
        (Role::TeamLead, _) if tenant.is_some() && !own => Err(BillingError::NotFound),
        (Role::TeamLead, Access::ReadMoney | Access::LookupRequest) if own => Ok(()),
        (Role::TeamLead, _) => Err(BillingError::Forbidden),
    }
}

/// Records that `who` read or changed money (`detail`: what beyond the tenant).
pub async fn audit(
    conn: &mut sqlx::PgConnection,
    who: &Principal,
    action: &str,
    tenant: Option<&str>,
    detail: Option<&str>,
) -> Result<(), BillingError> {
    crate::store::access::audit(
        conn,
        &who.token_id,
        who.role.as_str(),
        action,
        tenant,
        detail,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(role: Role, tenant: Option<&str>) -> Principal {
        Principal {
            token_id: "t".into(),
            role,
            tenant_id: tenant.map(str::to_owned),
        }
    }

    #[test]
    fn team_lead_cannot_see_other_tenant() {
        let lead = who(Role::TeamLead, Some("a"));
        assert!(check(&lead, Some("a"), Access::ReadMoney).is_ok());
        assert!(check(&lead, Some("a"), Access::LookupRequest).is_ok());
        for access in [
            Access::ReadMoney,
            Access::LookupRequest,
            Access::ManageMoney,
        ] {
            assert!(matches!(
                check(&lead, Some("b"), access),
                Err(BillingError::NotFound)
            ));
        }
        assert!(matches!(
            check(&lead, Some("a"), Access::ManageMoney),
            Err(BillingError::Forbidden)
        ));
        assert!(matches!(
            check(&lead, None, Access::AdministerTokens),
            Err(BillingError::Forbidden)
        ));
    }

    #[test]
    fn support_sees_requests_and_no_money() {
        let support = who(Role::Support, None);
        assert!(check(&support, Some("a"), Access::LookupRequest).is_ok());
        assert!(check(&support, Some("a"), Access::ReadMoney).is_err());
        assert!(check(&support, None, Access::AdministerTokens).is_err());
    }
}
