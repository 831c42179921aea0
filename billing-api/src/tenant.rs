//! What billing knows about a tenant: a type below every module that
//! reads tenants (drafts, shadow bills, exports, lookup, the pages), so
//! none of them imports another for it.

use chrono::NaiveDate;
use chrono_tz::Tz;

use crate::rating::BillingMode;

/// What billing needs to know about a tenant.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub tenant_id: String,
    /// The tenant's name as people read it (the FOCUS billing account's name).
    pub display_name: String,
    pub billing_mode: BillingMode,
    pub shadow: bool,
    pub time_zone: Tz,
    /// 1 lowest … 5 highest: its tier (prices its dedicated replicas).
    pub priority: i16,
    /// The first day of real chargeback (local), after its shadow month;
    /// its first 30 days are the grace period ([`crate::grace`]).
    pub chargeback_since: Option<NaiveDate>,
}
