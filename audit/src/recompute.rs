//! An invoice recomputed from the archive's scan and the replica reports,
//! with billing's rating, as billing would have computed it at a given
//! instant (a finalization's `finalized_at`, or the audit's own reading of
//! a draft): usage and off-peak discount lines, reserved capacity and its
//! credits, the grace waiver, the overhead share, and adjustments for
//! late usage and late replica reports of earlier finalized months — each
//! from the rows ingested before that instant.

use std::collections::{BTreeMap, HashMap, HashSet};

use billing_api::drafts::{overhead_line, totals};
use billing_api::grace;
use billing_api::invoice::{InvoiceBody, InvoiceHead};
use billing_api::period::{parse_zone, Month};
use billing_api::rating::{
    allocate, cents, rate, reserved_lines, Line, LineKind, Overhead, PriceBook, Reservation,
    UsageGroup,
};
use billing_api::tenant::Tenant;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;

use crate::error::AuditError;
use crate::inputs::{Issued, ReportHour};
use crate::scan::ArchiveHour;

/// How far back late rows are billed as adjustments (billing's rule).
pub const ADJUSTMENT_MONTHS: usize = 12;

/// Everything an invoice is recomputed from.
pub struct Sources<'a> {
    pub hours: &'a [ArchiveHour],
    pub reports: &'a [ReportHour],
    /// The instants the scan classified rows against (sorted, distinct).
    pub instants: &'a [DateTime<Utc>],
    pub tenants: &'a [Tenant],
    /// The price book in effect for each month (`YYYY-MM`).
    pub books: &'a HashMap<String, PriceBook>,
    /// Budgets by (tenant, `YYYY-MM`).
    pub budgets: &'a HashMap<(String, String), Decimal>,
    /// Every invoice issued in the months concerned.
    pub issued: &'a [Issued],
    /// The earlier months (`YYYY-MM`) scanned in full, every tenant's
    /// window and the book's; an earlier month not among them has nothing
    /// to adjust (see [`crate::run`]).
    pub full_months: &'a HashSet<String>,
}

/// Which rows of a tenant's usage a sum takes.
#[derive(Clone, Copy)]
enum Rows {
    /// All of its usage.
    All,
    /// Only what it ran on its own dedicated replicas.
    OwnDedicated,
}

impl Sources<'_> {
    /// The instant's position in the scan's instants.
    fn class_limit(&self, at: DateTime<Utc>) -> Result<usize, AuditError> {
        self.instants
            .binary_search(&at)
            .map_err(|_| AuditError::Invalid(format!("{at} is not one of the scan's instants")))
    }

    fn book(&self, month: Month) -> Result<&PriceBook, AuditError> {
        self.books
            .get(&month.to_string())
            .ok_or_else(|| AuditError::Invalid(format!("no price book loaded for {month}")))
    }

    fn budget(&self, tenant: &str, month: Month) -> Option<Decimal> {
        self.budgets
            .get(&(tenant.to_owned(), month.to_string()))
            .copied()
    }

    /// A tenant's usage in `[from, to)` (by hour started), visible at
    /// class limit `k`, in rating groups.
    fn groups(
        &self,
        tenant: &str,
        rows: Rows,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        k: usize,
        book: &PriceBook,
    ) -> Result<Vec<UsageGroup>, AuditError> {
        let off_peak: HashSet<DateTime<Utc>> = book.off_peak_hours(from, to)?.into_iter().collect();
        let mut sums: BTreeMap<(String, i16, bool), UsageGroup> = BTreeMap::new();
        for h in self.hours.iter().filter(|h| {
            h.tenant_id == tenant
                && h.class <= k
                && h.hour >= from
                && h.hour < to
                && match rows {
                    Rows::All => true,
                    Rows::OwnDedicated => h.dedicated_to.as_deref() == Some(tenant),
                }
        }) {
            let op = off_peak.contains(&h.hour);
            let g = sums
                .entry((h.model.clone(), h.priority, op))
                .or_insert_with(|| UsageGroup {
                    model: h.model.clone(),
                    priority: h.priority,
                    off_peak: op,
                    requests: 0,
                    prompt_tokens: 0,
                    cached_tokens: 0,
                    completion_tokens: 0,
                    gpu_seconds: Decimal::ZERO,
                });
            g.requests += h.requests;
            g.prompt_tokens += h.prompt_tokens;
            g.cached_tokens += h.cached_tokens;
            g.completion_tokens += h.completion_tokens;
            g.gpu_seconds += h.gpu_seconds;
        }
        Ok(sums.into_values().collect())
    }

    /// An owner's dedicated pools in `[from, to)` at class limit `k`:
    /// capacity and what others ran there (lent) from the reports, its own
    /// usage from the archive — and for an hour holding a v1 report, what
    /// others ran there from the archive too.
    fn reservations(
        &self,
        owner: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        k: usize,
        book: &PriceBook,
    ) -> Result<Vec<Reservation>, AuditError> {
        let mut pools: BTreeMap<String, Reservation> = BTreeMap::new();
        fn pool<'p>(
            pools: &'p mut BTreeMap<String, Reservation>,
            model: &str,
        ) -> &'p mut Reservation {
            pools
                .entry(model.to_owned())
                .or_insert_with(|| Reservation {
                    model: model.to_owned(),
                    ..Reservation::default()
                })
        }
        // Per (model, hour) with reports: whether one of them is v1, which
        // does not say what it lent; such an hour's lent time comes from
        // the events that ended there (billing's rule).
        let mut v1_hours: BTreeMap<(&str, DateTime<Utc>), bool> = BTreeMap::new();
        for r in self.reports.iter().filter(|r| {
            r.dedicated_to.as_deref() == Some(owner)
                && r.class <= k
                && r.hour >= from
                && r.hour < to
        }) {
            let p = pool(&mut pools, &r.model);
            p.reserved_gpu_seconds += r.busy_gpu_seconds + r.idle_gpu_seconds;
            p.lent_gpu_seconds += r.lent_gpu_seconds;
            *v1_hours.entry((r.model.as_str(), r.hour)).or_default() |= r.without_lent > 0;
        }
        for ((model, hour), _) in v1_hours.iter().filter(|(_, v1)| **v1) {
            // The v2 reports' lent time of a v1 hour is not used.
            let v2_lent: Decimal = self
                .reports
                .iter()
                .filter(|r| {
                    r.dedicated_to.as_deref() == Some(owner)
                        && r.class <= k
                        && r.hour == *hour
                        && r.model == *model
                })
                .map(|r| r.lent_gpu_seconds)
                .sum();
            let from_events: Decimal = self
                .hours
                .iter()
                .filter(|h| {
                    h.dedicated_to.as_deref() == Some(owner)
                        && h.tenant_id != owner
                        && h.class <= k
                        && h.hour == *hour
                        && h.model == *model
                })
                .map(|h| h.gpu_seconds)
                .sum();
            pool(&mut pools, model).lent_gpu_seconds += from_events - v2_lent;
        }
        for g in self.groups(owner, Rows::OwnDedicated, from, to, k, book)? {
            pool(&mut pools, &g.model).own_usage.push(g);
        }
        Ok(pools.into_values().collect())
    }

    /// Usage lines, then reserved-capacity lines, of `[from, to)`.
    fn rated(
        &self,
        t: &Tenant,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        k: usize,
        book: &PriceBook,
    ) -> Result<(Vec<UsageGroup>, Vec<Line>), AuditError> {
        let groups = self.groups(&t.tenant_id, Rows::All, from, to, k, book)?;
        let mut lines = rate(&groups, book, t.billing_mode)?;
        let pools = self.reservations(&t.tenant_id, from, to, k, book)?;
        if !pools.is_empty() {
            lines.extend(reserved_lines(&pools, book, t.billing_mode, t.priority)?);
        }
        Ok((groups, lines))
    }

    /// The grace waiver of a tenant's month whose budgeted charges are
    /// `total` (billing's rule, [`grace`]).
    fn waiver(
        &self,
        t: &Tenant,
        month: Month,
        k: usize,
        total: Decimal,
    ) -> Result<Option<Line>, AuditError> {
        let Some(period) = grace::period(t) else {
            return Ok(None);
        };
        let (start, end) = month.bounds(t.time_zone);
        let Some((from, to)) = grace::overlap(&period, start, end) else {
            return Ok(None);
        };
        let Some(budget) = self.budget(&t.tenant_id, month) else {
            return Ok(None);
        };
        let book = self.book(month)?;
        let charges = |until: DateTime<Utc>| -> Result<Decimal, AuditError> {
            Ok(grace::budgeted(&self.rated(t, start, until, k, book)?.1))
        };
        let before = if from == start {
            Decimal::ZERO
        } else {
            charges(from)?
        };
        let through = if to == end { total } else { charges(to)? };
        Ok(grace::waiver_line(
            &period,
            book,
            month,
            budget,
            grace::waived(budget, before, through, total),
        ))
    }

    /// What a month charges at class limit `k`: usage, reserved capacity
    /// and credits, less its waiver — what its adjustments are measured by
    /// (billing's rule, [`billing_api::adjustments`]; the overhead split of
    /// a finalized month is final).
    fn net(&self, t: &Tenant, month: Month, k: usize) -> Result<Decimal, AuditError> {
        let (start, end) = month.bounds(t.time_zone);
        let book = self.book(month)?;
        let (_, lines) = self.rated(t, start, end, k, book)?;
        let charges = grace::budgeted(&lines);
        let waived = self
            .waiver(t, month, k, charges)?
            .map_or(Decimal::ZERO, |l| -l.amount);
        Ok(charges - waived)
    }

    /// A tenant's share of the month's overhead pool at class limit `k`.
    fn overhead_share(
        &self,
        tenant: &str,
        month: Month,
        k: usize,
        book: &PriceBook,
    ) -> Result<Decimal, AuditError> {
        let (start, end) = month.bounds(parse_zone(&book.time_zone)?);
        let mut weights: BTreeMap<String, Decimal> = BTreeMap::new();
        for h in self
            .hours
            .iter()
            .filter(|h| h.class <= k && h.hour >= start && h.hour < end)
        {
            *weights.entry(h.tenant_id.clone()).or_default() += h.gpu_seconds;
        }
        let pool = match book.overhead {
            Overhead::FixedPerMonth(amount) => amount,
            Overhead::IdleGpuHourRate(per_hour) => {
                let idle: Decimal = self
                    .reports
                    .iter()
                    .filter(|r| {
                        r.dedicated_to.is_none() && r.class <= k && r.hour >= start && r.hour < end
                    })
                    .map(|r| r.idle_gpu_seconds)
                    .sum();
                cents(idle * per_hour / Decimal::from(3600))
            }
        };
        Ok(allocate(pool, &weights)
            .get(tenant)
            .copied()
            .unwrap_or_default())
    }

    /// The adjustment lines on a tenant's invoice for `month` read at `at`:
    /// for each earlier month whose invoice was live then, what the rows
    /// ingested before `at` bill for it less what was billed for it (its
    /// invoice and the adjustments for it on invoices live at `at`).
    fn adjustments(
        &self,
        t: &Tenant,
        month: Month,
        at: DateTime<Utc>,
        k: usize,
    ) -> Result<Vec<Line>, AuditError> {
        let mut earliest = month;
        for _ in 0..ADJUSTMENT_MONTHS {
            earliest = earliest.prev();
        }
        let (earliest, month_text) = (earliest.to_string(), month.to_string());
        let mut live: Vec<&Issued> = self
            .issued
            .iter()
            .filter(|i| {
                i.tenant_id == t.tenant_id
                    && i.period >= earliest
                    && i.period < month_text
                    && i.live_at(at)
            })
            .collect();
        live.sort_by(|a, b| a.period.cmp(&b.period));
        let mut billed: HashMap<&str, Decimal> = HashMap::new();
        for i in &live {
            *billed.entry(i.period.as_str()).or_default() +=
                billing_api::adjustments::charged(&i.body);
            for l in i
                .body
                .lines
                .iter()
                .filter(|l| l.kind == LineKind::Adjustment)
            {
                if let Some(q) = &l.adjusts {
                    *billed.entry(q.as_str()).or_default() += l.amount;
                }
            }
        }
        let mut out = Vec::new();
        for i in live.iter().filter(|i| self.full_months.contains(&i.period)) {
            let q = Month::parse(&i.period)?;
            let delta =
                self.net(t, q, k)? - billed.get(i.period.as_str()).copied().unwrap_or_default();
            if !delta.is_zero() {
                out.push(billing_api::adjustments::adjustment_line(&i.period, delta));
            }
        }
        Ok(out)
    }

    /// The tenant's invoice for `month` as billing computes it at `at`.
    pub fn invoice(
        &self,
        tenant: &str,
        month: Month,
        at: DateTime<Utc>,
    ) -> Result<InvoiceBody, AuditError> {
        let t = self
            .tenants
            .iter()
            .find(|t| t.tenant_id == tenant)
            .ok_or_else(|| AuditError::Invalid(format!("unknown tenant {tenant:?}")))?;
        let k = self.class_limit(at)?;
        let book = self.book(month)?;
        let (start, end) = month.bounds(t.time_zone);
        let (groups, mut lines) = self.rated(t, start, end, k, book)?;
        if let Some(w) = self.waiver(t, month, k, grace::budgeted(&lines))? {
            lines.push(w);
        }
        let share = self.overhead_share(tenant, month, k, book)?;
        if !share.is_zero() {
            lines.push(overhead_line(share, month));
        }
        lines.extend(self.adjustments(t, month, at, k)?);
        let head = InvoiceHead {
            tenant_id: t.tenant_id.clone(),
            period: month.to_string(),
            period_start: start,
            period_end: end,
            time_zone: t.time_zone.name().to_owned(),
            currency: book.currency.clone(),
            price_book: book.version.clone(),
            billing_mode: t.billing_mode,
            shadow: t.shadow,
        };
        Ok(InvoiceBody::new(head, totals(&groups), lines))
    }
}
