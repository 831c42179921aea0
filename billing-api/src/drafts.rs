//! Computing draft invoices from usage_hourly and the price book. One code
//! path serves one tenant or every tenant of a month: usage is summed in
//! Postgres per tenant × model × priority × peak/off-peak (the off-peak
//! test runs on each hour's local time in the book's zone, so DST days of
//! 23 and 25 hours fall where they should), then rated in Rust.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use sqlx::PgPool;

use crate::error::BillingError;
use crate::invoice::{InvoiceBody, InvoiceHead, UsageTotals};
use crate::period::{parse_zone, Month};
use crate::rating::{
    allocate, cents, rate, BillingMode, Line, LineKind, Overhead, PriceBook, UsageGroup,
};

/// What billing needs to know about a tenant.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub tenant_id: String,
    /// The tenant's name as people read it (the FOCUS billing account's name).
    pub display_name: String,
    pub billing_mode: BillingMode,
    pub shadow: bool,
    pub time_zone: Tz,
}

/// Tenants by id (all of them when `ids` is `None`), ordered by id.
pub async fn tenants(pool: &PgPool, ids: Option<&[String]>) -> Result<Vec<Tenant>, BillingError> {
    let rows: Vec<(String, String, String, bool, String)> = sqlx::query_as(
        "SELECT tenant_id, display_name, billing_mode, shadow, time_zone FROM tenants
         WHERE $1::text[] IS NULL OR tenant_id = ANY($1) ORDER BY tenant_id",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(tenant_id, display_name, mode, shadow, tz)| {
            Ok(Tenant {
                billing_mode: BillingMode::parse(&mode).ok_or_else(|| {
                    BillingError::Config(format!("tenant {tenant_id}: billing_mode {mode:?}"))
                })?,
                time_zone: parse_zone(&tz)?,
                tenant_id,
                display_name,
                shadow,
            })
        })
        .collect()
}

/// One page of tenant ids, in order, after `cursor` (from the first when `None`).
pub async fn tenant_page(
    pool: &PgPool,
    cursor: Option<&str>,
    limit: i64,
) -> Result<Vec<String>, BillingError> {
    let page: Vec<(String,)> = sqlx::query_as(
        "SELECT tenant_id FROM tenants WHERE $1::text IS NULL OR tenant_id > $1 ORDER BY tenant_id LIMIT $2",
    )
    .bind(cursor)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(page.into_iter().map(|(t,)| t).collect())
}

/// The book in effect on `day`: the latest whose effective date is not after it.
pub async fn book_for(pool: &PgPool, day: NaiveDate) -> Result<PriceBook, BillingError> {
    let row: Option<(sqlx::types::Json<PriceBook>,)> = sqlx::query_as(
        "SELECT body FROM price_books WHERE effective_from <= $1 ORDER BY effective_from DESC LIMIT 1",
    )
    .bind(day)
    .fetch_optional(pool)
    .await?;
    row.map(|(b,)| b.0).ok_or_else(|| {
        BillingError::Conflict(format!(
            "no price book is in effect on {day}; load one first"
        ))
    })
}

/// Stores a validated book (replacing one of the same version).
pub async fn put_book(pool: &PgPool, book: &PriceBook) -> Result<(), BillingError> {
    book.validate()?;
    sqlx::query(
        "INSERT INTO price_books (version, effective_from, body) VALUES ($1, $2, $3)
         ON CONFLICT (version) DO UPDATE SET effective_from = EXCLUDED.effective_from,
             body = EXCLUDED.body, loaded_at = now()",
    )
    .bind(&book.version)
    .bind(book.effective_from)
    .bind(sqlx::types::Json(book))
    .execute(pool)
    .await?;
    Ok(())
}

/// Each tenant's usage in its own `[start, end)`, summed per rating group.
pub async fn usage_groups(
    pool: &PgPool,
    book: &PriceBook,
    windows: &[(String, DateTime<Utc>, DateTime<Utc>)],
) -> Result<HashMap<String, Vec<UsageGroup>>, BillingError> {
    let ids: Vec<&str> = windows.iter().map(|w| w.0.as_str()).collect();
    let starts: Vec<DateTime<Utc>> = windows.iter().map(|w| w.1).collect();
    let ends: Vec<DateTime<Utc>> = windows.iter().map(|w| w.2).collect();
    let (Some(from), Some(to)) = (starts.iter().min().copied(), ends.iter().max().copied()) else {
        return Ok(HashMap::new());
    };
    // Off-peak is decided per hour in Rust (chrono-tz, exact across DST) and
    // handed over as a short list: no time-zone work per row in Postgres,
    // and small hash joins that parallel workers can share.
    let off_peak = book.off_peak_hours(from, to)?;
    type Row = (String, String, i16, bool, i64, i64, i64, i64, Decimal);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT u.tenant_id, u.model, u.priority, op.hour IS NOT NULL,
                sum(u.requests)::bigint, sum(u.prompt_tokens)::bigint, sum(u.cached_tokens)::bigint,
                sum(u.completion_tokens)::bigint, sum(u.gpu_seconds)
         FROM usage_hourly u
         JOIN UNNEST($1::text[], $2::timestamptz[], $3::timestamptz[]) AS w(tenant_id, s, e)
           ON w.tenant_id = u.tenant_id AND u.hour >= w.s AND u.hour < w.e
         LEFT JOIN UNNEST($4::timestamptz[]) AS op(hour) ON op.hour = u.hour
         WHERE u.hour >= $5 AND u.hour < $6
         GROUP BY 1, 2, 3, 4",
    )
    .bind(&ids)
    .bind(&starts)
    .bind(&ends)
    .bind(&off_peak)
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?;
    let mut out: HashMap<String, Vec<UsageGroup>> = HashMap::new();
    for (tenant, model, priority, off_peak, requests, prompt, cached, completion, gpu) in rows {
        out.entry(tenant).or_default().push(UsageGroup {
            model,
            priority,
            off_peak,
            requests,
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: completion,
            gpu_seconds: gpu,
        });
    }
    Ok(out)
}

/// Every tenant's share of the month's overhead pool (the month in the
/// book's zone), by billable GPU-seconds.
pub async fn overhead_shares(
    pool: &PgPool,
    book: &PriceBook,
    month: Month,
) -> Result<BTreeMap<String, Decimal>, BillingError> {
    let (start, end) = month.bounds(parse_zone(&book.time_zone)?);
    let weights: Vec<(String, Decimal)> = sqlx::query_as(
        "SELECT tenant_id, sum(gpu_seconds) FROM usage_hourly
         WHERE hour >= $1 AND hour < $2 GROUP BY tenant_id",
    )
    .bind(start)
    .bind(end)
    .fetch_all(pool)
    .await?;
    let pool_amount = match book.overhead {
        Overhead::FixedPerMonth(amount) => amount,
        Overhead::IdleGpuHourRate(rate) => {
            let (idle,): (Option<Decimal>,) = sqlx::query_as(
                "SELECT sum(gpu_seconds) FROM fleet_idle_hourly WHERE hour >= $1 AND hour < $2",
            )
            .bind(start)
            .bind(end)
            .fetch_one(pool)
            .await?;
            cents(idle.unwrap_or_default() * rate / Decimal::from(3600))
        }
    };
    Ok(allocate(pool_amount, &weights.into_iter().collect()))
}

/// Draft invoice bodies for `month`, for the given tenants (or all), by tenant id.
pub async fn drafts(
    pool: &PgPool,
    month: Month,
    ids: Option<&[String]>,
) -> Result<Vec<InvoiceBody>, BillingError> {
    let book = book_for(pool, month.first_day()).await?;
    let tenants = tenants(pool, ids).await?;
    let windows: Vec<(String, DateTime<Utc>, DateTime<Utc>)> = tenants
        .iter()
        .map(|t| {
            let (s, e) = month.bounds(t.time_zone);
            (t.tenant_id.clone(), s, e)
        })
        .collect();
    let mut groups = usage_groups(pool, &book, &windows).await?;
    let shares = overhead_shares(pool, &book, month).await?;
    let adjustments = crate::lifecycle::adjustments(pool, month, &tenants).await?;
    let mut out = Vec::with_capacity(tenants.len());
    for (t, (_, start, end)) in tenants.iter().zip(&windows) {
        let mine = groups.remove(&t.tenant_id).unwrap_or_default();
        let mut lines = rate(&mine, &book, t.billing_mode)?;
        if let Some(share) = shares.get(&t.tenant_id).filter(|s| !s.is_zero()) {
            lines.push(overhead_line(*share, month));
        }
        lines.extend(adjustments.get(&t.tenant_id).cloned().unwrap_or_default());
        let usage = totals(&mine);
        let head = InvoiceHead {
            tenant_id: t.tenant_id.clone(),
            period: month.to_string(),
            period_start: *start,
            period_end: *end,
            time_zone: t.time_zone.name().to_owned(),
            currency: book.currency.clone(),
            price_book: book.version.clone(),
            billing_mode: t.billing_mode,
            shadow: t.shadow,
        };
        out.push(InvoiceBody::new(head, usage, lines));
    }
    Ok(out)
}

/// Rates one tenant's usage for `month` as it stands now (for adjustments).
pub async fn usage_lines(
    pool: &PgPool,
    month: Month,
    tenant: &Tenant,
) -> Result<Vec<Line>, BillingError> {
    let book = book_for(pool, month.first_day()).await?;
    let (s, e) = month.bounds(tenant.time_zone);
    let mut groups = usage_groups(pool, &book, &[(tenant.tenant_id.clone(), s, e)]).await?;
    Ok(rate(
        &groups.remove(&tenant.tenant_id).unwrap_or_default(),
        &book,
        tenant.billing_mode,
    )?)
}

fn overhead_line(share: Decimal, month: Month) -> Line {
    Line {
        kind: LineKind::Overhead,
        description: format!("shared overhead for {month} (share of billable GPU-seconds)"),
        model: None,
        priority: None,
        off_peak: None,
        unit: "-".into(),
        quantity: Decimal::ONE,
        unit_price: share,
        per: 1,
        amount: share,
        adjusts: None,
    }
}

fn totals(groups: &[UsageGroup]) -> UsageTotals {
    let mut t = UsageTotals::default();
    for g in groups {
        t.requests += g.requests;
        t.prompt_tokens += g.prompt_tokens;
        t.cached_tokens += g.cached_tokens;
        t.completion_tokens += g.completion_tokens;
        t.gpu_seconds += g.gpu_seconds;
    }
    t
}
