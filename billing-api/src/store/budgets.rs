//! Monthly budgets per tenant in Postgres.

use rust_decimal::Decimal;
use sqlx::PgConnection;

use crate::error::BillingError;
use crate::period::Month;

/// The tenant's budget for `month`, if finance set one.
pub async fn get(
    conn: &mut PgConnection,
    tenant: &str,
    month: Month,
) -> Result<Option<Decimal>, BillingError> {
    let row: Option<(Decimal,)> =
        sqlx::query_as("SELECT amount FROM tenant_budgets WHERE tenant_id = $1 AND period = $2")
            .bind(tenant)
            .bind(month.to_string())
            .fetch_optional(&mut *conn)
            .await?;
    Ok(row.map(|(a,)| a))
}

/// Sets (or replaces) the tenant's budget for `month`.
pub async fn put(
    conn: &mut PgConnection,
    tenant: &str,
    month: Month,
    amount: Decimal,
    who: &str,
) -> Result<(), BillingError> {
    sqlx::query(
        "INSERT INTO tenant_budgets (tenant_id, period, amount, set_by) VALUES ($1, $2, $3, $4)
         ON CONFLICT (tenant_id, period) DO UPDATE SET amount = EXCLUDED.amount,
             set_by = EXCLUDED.set_by, set_at = now()",
    )
    .bind(tenant)
    .bind(month.to_string())
    .bind(amount)
    .bind(who)
    .execute(&mut *conn)
    .await?;
    Ok(())
}
