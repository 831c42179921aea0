//! The fleet's capacity, stored in the batch transaction beside the usage
//! it accompanies: replica reports (busy and idle GPU time per replica and
//! interval) and the usage that ran on dedicated replicas.
//!
//! - A report is stored once under its `report_id` (`ON CONFLICT DO
//!   NOTHING`): a re-send adds nothing, and only reports actually inserted
//!   add to the hourly sums — the same rule as request rows and
//!   usage_hourly. A report whose id is stored with other figures is a
//!   `conflict` dead letter.
//! - A shared replica's idle time goes to `fleet_idle_hourly` (the idle
//!   overhead pool); a dedicated replica's busy, idle and lent time go to
//!   `dedicated_capacity_hourly` under its owner (the reserved-capacity
//!   line and its lent credit), never to the shared pool; a v1 report,
//!   which does not say what it lent, is counted there as such
//!   (`reports_without_lent`), and billing takes that hour's lent time from
//!   the events.
//! - Counted v2 events that ran on a dedicated replica add to
//!   `dedicated_usage_hourly` by (owner, tenant, model, priority, hour),
//!   with the other hourly rollups ([`crate::hourly`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::{PgConnection, Row};
use usage_contract::Violation;

use crate::batch::{Rejected, ReportCandidate};

/// What a batch's reports did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReportCounts {
    pub inserted: u64,
    pub duplicates: u64,
}

/// Stores the reports not stored yet and adds those to the hourly sums;
/// reports that cannot be counted are pushed to `rejected`.
pub async fn store_reports(
    conn: &mut PgConnection,
    reports: Vec<ReportCandidate>,
    known_tenants: &HashSet<String>,
    rejected: &mut Vec<Rejected>,
) -> Result<ReportCounts, sqlx::Error> {
    let mut counts = ReportCounts::default();
    // The first of each id in the batch; later ones meet it below.
    let mut firsts: Vec<ReportCandidate> = Vec::with_capacity(reports.len());
    let mut repeats = Vec::new();
    let mut seen = HashSet::new();
    for r in reports {
        if let Some(owner) = &r.report.dedicated_to {
            if !known_tenants.contains(owner) {
                let violation = Violation::UnknownTenant(owner.clone());
                rejected.push(reject(r, violation));
                continue;
            }
        }
        if seen.insert(r.report.report_id.clone()) {
            firsts.push(r);
        } else {
            repeats.push(r);
        }
    }
    if firsts.is_empty() {
        return Ok(counts);
    }
    let n = firsts.len();
    let mut cols = ReportColumns::with_capacity(n);
    for r in &firsts {
        cols.push(r);
    }
    let inserted: HashSet<String> = sqlx::query(
        "INSERT INTO replica_reports (report_id, replica_id, model, reporter_id, dedicated_to,
             gpus, hour, interval_start, interval_end, busy_gpu_seconds, idle_gpu_seconds,
             lent_gpu_seconds, kafka_partition, kafka_offset)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
             $6::integer[], $7::timestamptz[], $8::timestamptz[], $9::timestamptz[],
             $10::numeric[], $11::numeric[], $12::numeric[], $13::integer[], $14::bigint[])
         ON CONFLICT (report_id) DO NOTHING RETURNING report_id",
    )
    .bind(&cols.report_id)
    .bind(&cols.replica_id)
    .bind(&cols.model)
    .bind(&cols.reporter_id)
    .bind(&cols.dedicated_to)
    .bind(&cols.gpus)
    .bind(&cols.hour)
    .bind(&cols.interval_start)
    .bind(&cols.interval_end)
    .bind(&cols.busy)
    .bind(&cols.idle)
    .bind(&cols.lent)
    .bind(&cols.partition)
    .bind(&cols.offset)
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(|row| row.try_get::<String, _>(0))
    .collect::<Result<_, _>>()?;
    counts.inserted = inserted.len() as u64;

    // Everything not inserted now has a stored version: compare figures.
    let (counted, others): (Vec<_>, Vec<_>) = firsts
        .into_iter()
        .partition(|r| inserted.contains(&r.report.report_id));
    let others: Vec<_> = others.into_iter().chain(repeats).collect();
    if !others.is_empty() {
        let ids: Vec<&str> = others.iter().map(|r| r.report.report_id.as_str()).collect();
        type Figures = (Decimal, Decimal, Option<Decimal>, DateTime<Utc>);
        let stored: HashMap<String, Figures> = sqlx::query_as(
            "SELECT report_id, busy_gpu_seconds, idle_gpu_seconds, lent_gpu_seconds, interval_end
             FROM replica_reports WHERE report_id = ANY($1)",
        )
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(|(id, busy, idle, lent, end)| (id, (busy, idle, lent, end)))
        .collect();
        for r in others {
            let same = stored.get(&r.report.report_id).is_some_and(|s| {
                *s == (
                    r.report.busy_gpu_seconds,
                    r.report.idle_gpu_seconds,
                    r.report.lent_gpu_seconds,
                    r.report.interval_end,
                )
            });
            if same {
                counts.duplicates += 1;
            } else {
                rejected.push(reject(r, Violation::Conflict));
            }
        }
    }
    add_capacity(conn, &counted).await?;
    Ok(counts)
}

/// Adds inserted reports to fleet_idle_hourly (shared replicas) and
/// dedicated_capacity_hourly (dedicated ones), one sorted upsert each.
async fn add_capacity(
    conn: &mut PgConnection,
    reports: &[ReportCandidate],
) -> Result<(), sqlx::Error> {
    let mut idle: BTreeMap<DateTime<Utc>, Decimal> = BTreeMap::new();
    let mut dedicated: BTreeMap<(String, String, DateTime<Utc>), Dedicated> = BTreeMap::new();
    for r in reports {
        let r = &r.report;
        match &r.dedicated_to {
            None => *idle.entry(r.hour()).or_default() += r.idle_gpu_seconds,
            Some(owner) => {
                let sums = dedicated
                    .entry((owner.clone(), r.model.clone(), r.hour()))
                    .or_default();
                sums.busy += r.busy_gpu_seconds;
                sums.idle += r.idle_gpu_seconds;
                match r.lent_gpu_seconds {
                    Some(lent) => sums.lent += lent,
                    None => sums.without_lent += 1,
                }
            }
        }
    }
    if !idle.is_empty() {
        let (hours, seconds): (Vec<_>, Vec<_>) = idle.into_iter().unzip();
        sqlx::query(
            "INSERT INTO fleet_idle_hourly AS f (hour, gpu_seconds)
             SELECT * FROM UNNEST($1::timestamptz[], $2::numeric[])
             ON CONFLICT (hour) DO UPDATE SET gpu_seconds = f.gpu_seconds + EXCLUDED.gpu_seconds",
        )
        .bind(hours)
        .bind(seconds)
        .execute(&mut *conn)
        .await?;
    }
    if !dedicated.is_empty() {
        let n = dedicated.len();
        let (mut owner, mut model, mut hour) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut busy, mut idle, mut lent, mut without_lent) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for ((o, m, h), d) in dedicated {
            owner.push(o);
            model.push(m);
            hour.push(h);
            busy.push(d.busy);
            idle.push(d.idle);
            lent.push(d.lent);
            without_lent.push(d.without_lent);
        }
        sqlx::query(
            "INSERT INTO dedicated_capacity_hourly AS d (owner_id, model, hour,
                 busy_gpu_seconds, idle_gpu_seconds, lent_gpu_seconds, reports_without_lent)
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::timestamptz[], $4::numeric[],
                 $5::numeric[], $6::numeric[], $7::integer[])
             ON CONFLICT (owner_id, model, hour) DO UPDATE SET
                 busy_gpu_seconds = d.busy_gpu_seconds + EXCLUDED.busy_gpu_seconds,
                 idle_gpu_seconds = d.idle_gpu_seconds + EXCLUDED.idle_gpu_seconds,
                 lent_gpu_seconds = d.lent_gpu_seconds + EXCLUDED.lent_gpu_seconds,
                 reports_without_lent = d.reports_without_lent + EXCLUDED.reports_without_lent",
        )
        .bind(owner)
        .bind(model)
        .bind(hour)
        .bind(busy)
        .bind(idle)
        .bind(lent)
        .bind(without_lent)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// One owner's dedicated replicas of a model in one hour, as reported.
#[derive(Debug, Default)]
struct Dedicated {
    busy: Decimal,
    idle: Decimal,
    lent: Decimal,
    /// v1 reports, which do not say what they lent.
    without_lent: i32,
}

fn reject(r: ReportCandidate, violation: Violation) -> Rejected {
    Rejected {
        partition: r.partition,
        offset: r.offset,
        raw: r.raw,
        violation,
        request_id: None,
        tenant_id: r.report.dedicated_to.clone(),
        stored_version: None,
    }
}

/// Column-wise arrays for the reports' UNNEST.
struct ReportColumns<'a> {
    report_id: Vec<&'a str>,
    replica_id: Vec<&'a str>,
    model: Vec<&'a str>,
    reporter_id: Vec<&'a str>,
    dedicated_to: Vec<Option<&'a str>>,
    gpus: Vec<i32>,
    hour: Vec<DateTime<Utc>>,
    interval_start: Vec<DateTime<Utc>>,
    interval_end: Vec<DateTime<Utc>>,
    busy: Vec<Decimal>,
    idle: Vec<Decimal>,
    lent: Vec<Option<Decimal>>,
    partition: Vec<i32>,
    offset: Vec<i64>,
}

impl<'a> ReportColumns<'a> {
    fn with_capacity(n: usize) -> Self {
        Self {
            report_id: Vec::with_capacity(n),
            replica_id: Vec::with_capacity(n),
            model: Vec::with_capacity(n),
            reporter_id: Vec::with_capacity(n),
            dedicated_to: Vec::with_capacity(n),
            gpus: Vec::with_capacity(n),
            hour: Vec::with_capacity(n),
            interval_start: Vec::with_capacity(n),
            interval_end: Vec::with_capacity(n),
            busy: Vec::with_capacity(n),
            idle: Vec::with_capacity(n),
            lent: Vec::with_capacity(n),
            partition: Vec::with_capacity(n),
            offset: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, c: &'a ReportCandidate) {
        let r = &c.report;
        self.report_id.push(&r.report_id);
        self.replica_id.push(&r.replica_id);
        self.model.push(&r.model);
        self.reporter_id.push(&r.reporter_id);
        self.dedicated_to.push(r.dedicated_to.as_deref());
        self.gpus.push(i32::try_from(r.gpus).unwrap_or(i32::MAX));
        self.hour.push(r.hour());
        self.interval_start.push(r.interval_start);
        self.interval_end.push(r.interval_end);
        self.busy.push(r.busy_gpu_seconds);
        self.idle.push(r.idle_gpu_seconds);
        self.lent.push(r.lent_gpu_seconds);
        self.partition.push(c.partition);
        self.offset.push(c.offset);
    }
}
