//! Stored usage as rating input: each tenant's usage in its window as
//! rating groups (peak/off-peak decided by the book), its dedicated pools,
//! and one tenant's month rated to lines.
//! Below both [`crate::drafts`] and [`crate::adjustments`], which need it
//! and must not need each other.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::error::BillingError;
use crate::rating::{rate, reserved_lines, Line, PriceBook, UsageGroup};
use crate::store::{self, usage::Window};
use crate::tenant::Tenant;

/// Each tenant's usage in its own window, summed per rating group.
pub async fn usage_groups(
    conn: &mut PgConnection,
    book: &PriceBook,
    windows: &[Window],
) -> Result<HashMap<String, Vec<UsageGroup>>, BillingError> {
    let (Some(from), Some(to)) = (
        windows.iter().map(|w| w.1).min(),
        windows.iter().map(|w| w.2).max(),
    ) else {
        return Ok(HashMap::new());
    };
    let off_peak = book.off_peak_hours(from, to)?;
    store::usage::groups(conn, windows, &off_peak).await
}

/// Each owner's dedicated pools in its own window (see
/// [`store::usage::reservations`]).
pub async fn reservations(
    conn: &mut PgConnection,
    book: &PriceBook,
    windows: &[Window],
) -> Result<HashMap<String, Vec<crate::rating::Reservation>>, BillingError> {
    let (Some(from), Some(to)) = (
        windows.iter().map(|w| w.1).min(),
        windows.iter().map(|w| w.2).max(),
    ) else {
        return Ok(HashMap::new());
    };
    let off_peak = book.off_peak_hours(from, to)?;
    store::usage::reservations(conn, windows, &off_peak).await
}

/// Rates one tenant's `[start, end)` as it stands now (adjustments, the
/// grace waiver): its usage lines, then its reserved-capacity lines and
/// their credits.
pub async fn charge_lines(
    conn: &mut PgConnection,
    book: &PriceBook,
    tenant: &Tenant,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> Result<Vec<Line>, BillingError> {
    let window = [(tenant.tenant_id.clone(), start, end)];
    let groups = usage_groups(conn, book, &window)
        .await?
        .remove(&tenant.tenant_id)
        .unwrap_or_default();
    let mut lines = rate(&groups, book, tenant.billing_mode)?;
    if let Some(pools) = reservations(conn, book, &window)
        .await?
        .remove(&tenant.tenant_id)
    {
        lines.extend(reserved_lines(
            &pools,
            book,
            tenant.billing_mode,
            tenant.priority,
        )?);
    }
    Ok(lines)
}
