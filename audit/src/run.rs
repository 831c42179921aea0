//! One month's audit, end to end:
//!
//! 1. billing's invoices of the month: the finalized one per tenant, and
//!    for the rest a draft read under ingest's lock at one instant (the
//!    same boundary a finalization reads at);
//! 2. the archive must hold everything ingested before the latest of
//!    those instants (it waits up to `wait` for the archiver);
//! 3. one DataFusion scan of the month (all tenants: the overhead split
//!    needs everyone's GPU time), plus a scan of each earlier month that
//!    carries late usage, a late replica report or an adjustment line
//!    (found by probes that read only rows ingested after the first
//!    earlier invoice); such a month is scanned for every tenant;
//! 4. each invoice recomputed at its instant ([`crate::recompute`]) and
//!    compared ([`crate::compare`]).
//!
//! An earlier month with no usage or replica report ingested after its
//! live invoices and no adjustment line on this invoice has nothing to
//! adjust: its rows are exactly those its own invoices hold, which
//! auditing that month checks.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use archive::store::ArchiveStore;
use billing_api::period::{parse_zone, Month};
use billing_api::rating::{LineKind, PriceBook};
use billing_api::{drafts, store as billing};
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::PgPool;

use crate::compare::{differences, Difference};
use crate::error::AuditError;
use crate::inputs::{self, Issued};
use crate::recompute::{Sources, ADJUSTMENT_MONTHS};
use crate::scan::{self, ArchiveHour, ScanStats};

/// One invoice audited.
#[derive(Debug, Clone, Serialize)]
pub struct Checked {
    pub tenant_id: String,
    /// `finalized #N` or `draft`.
    pub invoice: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub billed_total: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub archive_total: Decimal,
    pub lines: usize,
    pub differences: usize,
}

/// What an audit found.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub invoices: Vec<Checked>,
    pub differences: Vec<Difference>,
    /// The scans together: files, bytes, requests, time.
    pub scan: ScanStats,
}

/// Billing's invoice of the month for one tenant, and the instant it holds usage up to.
struct Target {
    tenant_id: String,
    label: String,
    body: billing_api::invoice::InvoiceBody,
    at: DateTime<Utc>,
}

/// Audits `month` for the given tenants (all when `None`).
pub async fn month(
    pool: &PgPool,
    store: &ArchiveStore,
    month: Month,
    ids: Option<&[String]>,
    wait: Duration,
) -> Result<Outcome, AuditError> {
    let mut conn = pool.acquire().await?;
    let tenants = billing::tenants::list(&mut conn, ids).await?;
    if let Some(ids) = ids {
        if let Some(missing) = ids
            .iter()
            .find(|i| !tenants.iter().any(|t| &t.tenant_id == *i))
        {
            return Err(AuditError::Invalid(format!("unknown tenant {missing:?}")));
        }
    }
    let mut earliest = month;
    for _ in 0..ADJUSTMENT_MONTHS {
        earliest = earliest.prev();
    }
    let issued = inputs::issued(pool, &earliest.to_string(), &month.to_string()).await?;
    let targets = targets(pool, month, &tenants, &issued).await?;
    let mut instants: Vec<DateTime<Utc>> = issued
        .iter()
        .map(|i| i.finalized_at)
        .chain(targets.iter().map(|t| t.at))
        .collect();
    instants.sort();
    instants.dedup();

    // The month's books and budgets, and the earlier months' of the invoices.
    let book = billing::price_books::in_effect(&mut conn, month.first_day()).await?;
    let book_zone = parse_zone(&book.time_zone)?;
    let mut books: HashMap<String, PriceBook> = HashMap::from([(month.to_string(), book)]);
    let mut months: BTreeSet<Month> = BTreeSet::from([month]);
    for i in issued.iter().filter(|i| i.period < month.to_string()) {
        months.insert(Month::parse(&i.period)?);
    }
    for q in &months {
        if let std::collections::hash_map::Entry::Vacant(slot) = books.entry(q.to_string()) {
            slot.insert(billing::price_books::in_effect(&mut conn, q.first_day()).await?);
        }
    }
    let mut budgets: HashMap<(String, String), Decimal> = HashMap::new();
    for t in &tenants {
        for q in &months {
            if let Some(b) = billing::budgets::get(&mut conn, &t.tenant_id, *q).await? {
                budgets.insert((t.tenant_id.clone(), q.to_string()), b);
            }
        }
    }
    drop(conn);

    // What to scan: the month (every tenant's window and the book's), and
    // each earlier month some invoice's adjustments need in full.
    let mut ranges = vec![month.bounds(book_zone)];
    ranges.extend(tenants.iter().map(|t| month.bounds(t.time_zone)));
    let full = earlier_months_needed(pool, store, month, &tenants, &issued, &targets).await?;
    for q in &full {
        let book = books
            .get(q)
            .ok_or_else(|| AuditError::Invalid(format!("no price book loaded for {q}")))?;
        let zone = parse_zone(&book.time_zone)?;
        let q = Month::parse(q)?;
        ranges.push(q.bounds(zone));
        ranges.extend(tenants.iter().map(|t| q.bounds(t.time_zone)));
    }
    let ranges = merge(ranges);
    if let Some(latest) = targets.iter().map(|t| t.at).max() {
        wait_for_archive(pool, &ranges, latest, wait).await?;
    }
    let mut hours: Vec<ArchiveHour> = Vec::new();
    let mut stats = ScanStats::default();
    for (from, to) in &ranges {
        let (h, s) = scan::hours(pool, store, *from, *to, &instants).await?;
        hours.extend(h);
        stats.files += s.files;
        stats.bytes += s.bytes;
        stats.requests += s.requests;
        stats.elapsed += s.elapsed;
    }
    let (Some(from), Some(to)) = (
        ranges.iter().map(|r| r.0).min(),
        ranges.iter().map(|r| r.1).max(),
    ) else {
        return Ok(Outcome::default());
    };
    let reports = inputs::reports(pool, from, to, &instants).await?;
    let sources = Sources {
        hours: &hours,
        reports: &reports,
        instants: &instants,
        tenants: &tenants,
        books: &books,
        budgets: &budgets,
        issued: &issued,
        full_months: &full,
    };
    let mut outcome = Outcome {
        scan: stats,
        ..Outcome::default()
    };
    for t in &targets {
        let recomputed = sources.invoice(&t.tenant_id, month, t.at)?;
        let found = differences(&recomputed, &t.body, &t.label);
        outcome.invoices.push(Checked {
            tenant_id: t.tenant_id.clone(),
            invoice: t.label.clone(),
            billed_total: t.body.total,
            archive_total: recomputed.total,
            lines: t.body.lines.len(),
            differences: found.len(),
        });
        outcome.differences.extend(found);
    }
    Ok(outcome)
}

/// Billing's invoice of the month per tenant: the live finalized one, or
/// a draft read under ingest's lock (so it holds exactly the usage
/// ingested before the instant it returns).
async fn targets(
    pool: &PgPool,
    month: Month,
    tenants: &[billing_api::tenant::Tenant],
    issued: &[Issued],
) -> Result<Vec<Target>, AuditError> {
    let period = month.to_string();
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for t in tenants {
        match issued
            .iter()
            .find(|i| i.tenant_id == t.tenant_id && i.period == period && i.voided_at.is_none())
        {
            Some(i) => out.push(Target {
                tenant_id: t.tenant_id.clone(),
                label: format!("finalized #{}", i.number),
                body: i.body.clone(),
                at: i.finalized_at,
            }),
            None => missing.push(t.tenant_id.clone()),
        }
    }
    if !missing.is_empty() {
        let mut tx = pool.begin().await?;
        let at = billing::invoices::usage_boundary(&mut tx).await?;
        let bodies = drafts::drafts(&mut tx, month, Some(&missing)).await?;
        tx.commit().await?;
        out.extend(bodies.into_iter().map(|body| Target {
            tenant_id: body.head.tenant_id.clone(),
            label: "draft".into(),
            body,
            at,
        }));
    }
    out.sort_by(|a, b| a.tenant_id.cmp(&b.tenant_id));
    Ok(out)
}

/// The earlier months (`YYYY-MM`) whose rows must be scanned in full:
/// those with usage or a replica report ingested after one of the month's
/// live invoices, or an adjustment line on an audited invoice.
async fn earlier_months_needed(
    pool: &PgPool,
    store: &ArchiveStore,
    month: Month,
    tenants: &[billing_api::tenant::Tenant],
    issued: &[Issued],
    targets: &[Target],
) -> Result<HashSet<String>, AuditError> {
    let period = month.to_string();
    let mut needed: HashSet<String> = HashSet::new();
    for t in targets {
        for l in t
            .body
            .lines
            .iter()
            .filter(|l| l.kind == LineKind::Adjustment)
        {
            if let Some(q) = &l.adjusts {
                needed.insert(q.clone());
            }
        }
    }
    // The earlier invoices live at some target's instant, each with the
    // widest window a row of its month can fall in (any tenant's zone).
    let mut earlier: Vec<(&Issued, DateTime<Utc>, DateTime<Utc>)> = Vec::new();
    for t in targets {
        for i in issued
            .iter()
            .filter(|i| i.tenant_id == t.tenant_id && i.period < period && i.live_at(t.at))
        {
            let q = Month::parse(&i.period)?;
            let windows = tenants.iter().map(|x| q.bounds(x.time_zone));
            let (Some(s), Some(e)) = (
                windows.clone().map(|w| w.0).min(),
                windows.map(|w| w.1).max(),
            ) else {
                continue;
            };
            earlier.push((i, s, e));
        }
    }
    let (Some(after), Some(from), Some(to)) = (
        earlier.iter().map(|e| e.0.finalized_at).min(),
        earlier.iter().map(|e| e.1).min(),
        earlier.iter().map(|e| e.2).max(),
    ) else {
        return Ok(needed);
    };
    let mut late = scan::late(pool, store, from, to, after).await?;
    late.extend(
        inputs::late_reports(pool, from, to, after)
            .await?
            .into_iter()
            .map(|(hour, latest)| (String::new(), hour, latest)),
    );
    for (_, hour, latest) in late {
        for (i, s, e) in &earlier {
            if hour >= *s && hour < *e && latest >= i.finalized_at {
                needed.insert(i.period.clone());
            }
        }
    }
    Ok(needed)
}

/// Overlapping ranges merged, so no request is scanned twice.
fn merge(mut ranges: Vec<(DateTime<Utc>, DateTime<Utc>)>) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    ranges.sort();
    let mut out: Vec<(DateTime<Utc>, DateTime<Utc>)> = Vec::new();
    for (s, e) in ranges {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Waits until nothing ingested before `latest` in the ranges is still
/// queued for the archive, or fails after `wait`.
async fn wait_for_archive(
    pool: &PgPool,
    ranges: &[(DateTime<Utc>, DateTime<Utc>)],
    latest: DateTime<Utc>,
    wait: Duration,
) -> Result<(), AuditError> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let behind = inputs::not_yet_archived(pool, ranges, latest).await?;
        if behind == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(AuditError::ArchiveBehind(behind));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]
    use super::*;

    #[test]
    fn overlapping_ranges_are_scanned_once() {
        let t = |h: i64| DateTime::from_timestamp(h * 3600, 0).unwrap();
        assert_eq!(
            merge(vec![
                (t(5), t(9)),
                (t(0), t(3)),
                (t(2), t(6)),
                (t(10), t(11))
            ]),
            vec![(t(0), t(9)), (t(10), t(11))]
        );
    }
}
