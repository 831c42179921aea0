//! Budgets: finance sets a budget per tenant and month; the shadow bill
//! (page and API) shows the share used and warns at 80% and at 100%.

use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::PgConnection;

use crate::error::BillingError;
use crate::period::Month;
use crate::store;

/// How a month's spend stands against its budget.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct BudgetStatus {
    #[serde(with = "rust_decimal::serde::str")]
    pub amount: Decimal,
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

/// Parses a budget typed by a person (`12,500.00`), refusing anything but a
/// positive amount in cents.
pub fn parse_amount(text: &str) -> Result<Decimal, BillingError> {
    let cleaned: String = text.trim().trim_start_matches('$').replace(',', "");
    let amount: Decimal = cleaned.parse().map_err(|_| {
        BillingError::BadRequest(format!(
            "budget {text:?} must be an amount such as 12500.00"
        ))
    })?;
    if amount <= Decimal::ZERO || amount.scale() > 2 || amount > Decimal::from(1_000_000_000_000i64)
    {
        return Err(BillingError::BadRequest(format!(
            "budget {text:?} must be above 0, in cents at most"
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
        for bad in ["-1", "0", "1.001", "abc"] {
            assert!(parse_amount(bad).is_err(), "{bad}");
        }
    }
}
