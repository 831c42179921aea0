//! Budgets: finance sets a budget per tenant and month (page or API, each
//! change in the audit log); the shadow bill (page and API) shows the
//! share used and warns at 80% and at 100%. A budget covers the budgeted
//! charges — usage net of off-peak discounts and reserved capacity net of
//! its credits, not the overhead share or adjustments for earlier months —
//! which is also what a grace period measures ([`crate::grace`]). The
//! budget of a month whose invoice is finalized is history: changing it is
//! refused (it would change what that invoice's grace waiver meant).

use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::PgConnection;

use crate::access::{audit, Principal};
use crate::error::BillingError;
use crate::period::Month;
use crate::store;

/// How a month's spend stands against its budget.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct BudgetStatus {
    #[serde(with = "rust_decimal::serde::str")]
    pub amount: Decimal,
    /// The budgeted charges so far (before any grace waiver).
    #[serde(with = "rust_decimal::serde::str")]
    pub spent: Decimal,
    /// Spend so far over the budget (0.8 = 80%), to four decimals.
    #[serde(with = "rust_decimal::serde::str")]
    pub share_used: Decimal,
    /// `ok`, `warning` (80% or more) or `exceeded` (100% or more).
    pub level: &'static str,
}

/// The status of `spent` against a budget of `amount`.
pub fn status(amount: Decimal, spent: Decimal) -> BudgetStatus {
    let share_used = if amount.is_zero() {
        Decimal::ZERO
    } else {
        (spent / amount).round_dp(4)
    };
    let level = if spent >= amount {
        "exceeded"
    } else if spent * Decimal::from(5) >= amount * Decimal::from(4) {
        "warning"
    } else {
        "ok"
    };
    BudgetStatus {
        amount,
        spent,
        share_used,
        level,
    }
}

/// The tenant's budget status for `month`, if it has a budget.
pub async fn for_month(
    conn: &mut PgConnection,
    tenant: &str,
    month: Month,
    spent: Decimal,
) -> Result<Option<BudgetStatus>, BillingError> {
    Ok(store::budgets::get(conn, tenant, month)
        .await?
        .map(|amount| status(amount, spent)))
}

/// Sets (or replaces) the tenant's budget for `month`, on the caller's
/// transaction, and records it in the audit log. The tenant must exist
/// (404) and the month's invoice must not be finalized (409). It takes the
/// finalization lock, so a finalization running meanwhile computes its
/// grace waiver on the budget before or after, never between.
pub async fn set(
    conn: &mut PgConnection,
    who: &Principal,
    tenant: &str,
    month: Month,
    amount: Decimal,
) -> Result<(), BillingError> {
    store::tenants::get(conn, tenant)
        .await?
        .ok_or(BillingError::NotFound)?;
    store::invoices::lock_for_finalize(conn).await?;
    if let Some(done) = store::invoices::finalized(conn, tenant, month).await? {
        return Err(BillingError::Conflict(format!(
            "the {month} invoice of {tenant} is finalized (number {}); its budget can no \
             longer change",
            done.number.unwrap_or_default()
        )));
    }
    store::budgets::put(conn, tenant, month, amount, &who.token_id).await?;
    audit(
        conn,
        who,
        "set_budget",
        Some(tenant),
        Some(&format!("{month}: {amount}")),
    )
    .await
}

/// The largest budget: what `tenant_budgets.amount` (`numeric(14, 2)`) holds.
fn max_amount() -> Decimal {
    Decimal::new(99_999_999_999_999, 2)
}

/// A budget as the API documents it: above 0, in cents at most, below
/// 1,000,000,000,000 (`parse_amount` also takes a leading `$` and thousands
/// commas, as the page's form does).
pub const AMOUNT_PATTERN: &str = "^([1-9][0-9]{0,11}(\\.[0-9]{1,2})?|0\\.(0[1-9]|[1-9][0-9]?))$";

/// [`AMOUNT_PATTERN`] as the OpenAPI document gives a budget's amount.
pub fn amount_schema() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .pattern(Some(AMOUNT_PATTERN))
        .description(Some(
            "The month's budget in the billing currency, as decimal text (money is never a JSON number here): above 0, in cents at most, below 1000000000000.",
        ))
        .into()
}

/// Parses a budget typed by a person (`12,500.00`), refusing anything but a
/// positive amount in cents.
pub fn parse_amount(text: &str) -> Result<Decimal, BillingError> {
    let cleaned: String = text.trim().trim_start_matches('$').replace(',', "");
    let amount: Decimal = cleaned.parse().map_err(|_| {
        BillingError::BadRequest(format!(
            "budget {text:?} must be an amount such as 12500.00"
        ))
    })?;
    if amount <= Decimal::ZERO || amount.scale() > 2 || amount > max_amount() {
        return Err(BillingError::BadRequest(format!(
            "budget {text:?} must be above 0, in cents at most, and at most {}",
            max_amount()
        )));
    }
    Ok(amount)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rust_decimal_macros::dec;

    #[test]
    fn warnings_at_80_and_100_percent() {
        assert_eq!(status(dec!(100), dec!(79.99)).level, "ok");
        assert_eq!(status(dec!(100), dec!(80)).level, "warning");
        assert_eq!(status(dec!(100), dec!(100)).level, "exceeded");
        assert_eq!(status(dec!(100), dec!(80)).share_used, dec!(0.8));
        assert!(parse_amount("12,500.00").is_ok());
        // What the documented pattern admits, parse_amount takes; "0" and
        // amounts past what the column holds it refuses, and so does the
        // pattern.
        let pattern = regex::Regex::new(AMOUNT_PATTERN).unwrap();
        assert_eq!(max_amount().to_string(), "999999999999.99");
        for ok in ["1", "0.01", "0.1", "0.10", "12500.00", "999999999999.99"] {
            assert!(pattern.is_match(ok) && parse_amount(ok).is_ok(), "{ok}");
        }
        for bad in [
            "0",
            "0.0",
            "0.00",
            "1000000000000",
            "1000000000000.00",
            "1.001",
        ] {
            assert!(
                !pattern.is_match(bad) && parse_amount(bad).is_err(),
                "{bad}"
            );
        }
        assert!(!pattern.is_match("01"), "one spelling of each amount");
    }
}
