//! The backfilled month: the latest calendar month that has ended in every
//! tenant's time zone, filled with a sample of the reference tenants'
//! traffic (crate `workload`), sent through the real pipeline — produced
//! to the topic as a gateway would, ingested exactly once, archived — and
//! then finalized, so the demo can print real invoices.
//!
//! A second run finds the month's invoices finalized and skips all of it;
//! a run interrupted half-way produces the same events again (the sample is
//! deterministic), which ingest drops as identical re-sends.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use billing_api::invoice::{Invoice, Status};
use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use chrono_tz::Tz;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use workload::fleet::Fleet;
use workload::generator::Config;
use workload::summary::Summary;
use workload::tenants::Tenant;
use workload::Generator;

use crate::client::Billing;

/// A month of every tenant's calendar, and the instants that lie inside it
/// in every tenant's zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Month {
    /// `YYYY-MM`, as invoices name it.
    pub period: String,
    /// The latest start of the month over the zones.
    pub from: DateTime<Utc>,
    /// The earliest end of the month over the zones.
    pub to: DateTime<Utc>,
}

fn start_of(year: i32, month: u32, zone: Tz) -> Option<DateTime<Utc>> {
    let day = NaiveDate::from_ymd_opt(year, month, 1)?.and_hms_opt(0, 0, 0)?;
    zone.from_local_datetime(&day)
        .earliest()
        .map(|t| t.with_timezone(&Utc))
}

fn next(year: i32, month: u32) -> (i32, u32) {
    if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    }
}

fn previous(year: i32, month: u32) -> (i32, u32) {
    if month == 1 {
        (year - 1, 12)
    } else {
        (year, month - 1)
    }
}

/// The latest month that has ended at `now` in every one of `zones`
/// (finalize refuses a month that has not ended in the tenant's zone).
pub fn latest_ended_month(now: DateTime<Utc>, zones: &[Tz]) -> Option<Month> {
    let (mut year, mut month) = previous(now.year(), now.month());
    loop {
        let (ny, nm) = next(year, month);
        let ends: Vec<DateTime<Utc>> = zones.iter().filter_map(|z| start_of(ny, nm, *z)).collect();
        if ends.len() == zones.len() && ends.iter().all(|end| *end <= now) {
            let starts: Vec<DateTime<Utc>> = zones
                .iter()
                .filter_map(|z| start_of(year, month, *z))
                .collect();
            return Some(Month {
                period: format!("{year:04}-{month:02}"),
                from: starts.into_iter().max()?,
                to: ends.into_iter().min()?,
            });
        }
        (year, month) = previous(year, month);
    }
}

/// What the backfill needs to know.
pub struct Backfill<'a> {
    pub billing: &'a Billing,
    pub brokers: String,
    pub topic: String,
    pub database_url: String,
    pub events: u64,
    /// Requests a replica runs at once (the GPU-time calibration).
    pub concurrency: u32,
    pub seed: u64,
}

/// What the backfill found or did, for the report.
pub struct Done {
    pub month: Month,
    /// What the sample holds, per tenant (what billing must show).
    pub expected: Summary,
    /// Each tenant's finalized invoice, in the order of the tenants.
    pub invoices: Vec<Invoice>,
    /// `None` when an earlier run had already finalized the month.
    pub took: Option<Duration>,
    /// Whether billing-api shows, for every tenant, exactly the sample's
    /// requests, tokens and GPU-seconds over the month.
    pub exact: bool,
}

impl Backfill<'_> {
    /// Fills, ingests, archives and finalizes the month, or finds it done.
    pub async fn run(&self) -> anyhow::Result<Done> {
        let tenants = Tenant::reference();
        let zones: Vec<Tz> = tenants.iter().map(|t| t.zone).collect();
        let month = latest_ended_month(Utc::now(), &zones).context("no month has ended")?;
        let sample = || {
            let mut config = Config::reference(self.seed, month.from, month.to, self.events);
            config.fleet = Fleet::with_concurrency(self.concurrency);
            Generator::new(config)
        };
        let expected = sample()?.into_summary();
        let mut invoices = Vec::new();
        for t in &tenants {
            invoices.push(self.billing.invoice(&t.name, &month.period).await?);
        }
        let (from, to) = (rfc3339(month.from), rfc3339(month.to));
        if invoices.iter().all(|i| i.status == Status::Finalized) {
            println!(
                "demo: {} is already finalized for every tenant (an earlier run backfilled it); skipping the backfill",
                month.period
            );
            let exact = self.ingested(&expected, &from, &to).await?.1;
            if !exact {
                println!(
                    "demo: (that month was backfilled with other DEMO_SEED / DEMO_BACKFILL_* settings than this run's; its invoices are shown as they were finalized)"
                );
            }
            return Ok(Done {
                month,
                expected,
                invoices,
                took: None,
                exact,
            });
        }
        let started = Instant::now();
        if !self.ingested(&expected, &from, &to).await?.1 {
            println!(
                "demo: backfilling {}: {} events of the five reference tenants, {} to {}, through the topic {}",
                month.period, self.events, from, to, self.topic
            );
            let archived_before = archived_rows(&self.database_url).await?;
            let produced = Instant::now();
            self.produce(sample()?).await?;
            println!(
                "demo: produced {} events in {:.1} s; waiting for ingest",
                self.events,
                produced.elapsed().as_secs_f64()
            );
            self.wait_ingested(&expected, &from, &to, produced).await?;
            self.wait_archived(archived_before).await?;
        }
        for (t, invoice) in tenants.iter().zip(invoices.iter_mut()) {
            if invoice.status != Status::Finalized {
                *invoice = self.billing.finalize(&t.name, &month.period).await?;
            }
        }
        let exact = self.ingested(&expected, &from, &to).await?.1;
        Ok(Done {
            month,
            expected,
            invoices,
            took: Some(started.elapsed()),
            exact,
        })
    }

    /// (requests billing shows over the tenants, whether every tenant's
    /// totals equal the sample's exactly).
    async fn ingested(
        &self,
        expected: &Summary,
        from: &str,
        to: &str,
    ) -> anyhow::Result<(u64, bool)> {
        let mut requests = 0u64;
        let mut all = true;
        for t in &expected.tenants {
            let billed = self.billing.usage(&t.tenant, from, to).await?;
            requests += u64::try_from(billed.requests).unwrap_or(0);
            let e = &t.totals;
            all &= u64::try_from(billed.requests).ok() == Some(e.requests)
                && u64::try_from(billed.prompt_tokens).ok() == Some(e.prompt_tokens)
                && u64::try_from(billed.cached_tokens).ok() == Some(e.cached_tokens)
                && u64::try_from(billed.completion_tokens).ok() == Some(e.completion_tokens)
                && billed.gpu_seconds == e.gpu_seconds;
        }
        Ok((requests, all))
    }

    async fn produce(&self, events: Generator) -> anyhow::Result<()> {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "20")
            .set("compression.type", "lz4")
            .set("queue.buffering.max.messages", "200000")
            .create()
            .with_context(|| format!("a producer for {}", self.brokers))?;
        let mut pending = Vec::with_capacity(50_000);
        let mut sent = 0u64;
        for event in events {
            let payload = event.to_json();
            loop {
                let record = FutureRecord::to(&self.topic)
                    .key(&event.tenant_id)
                    .payload(&payload);
                match producer.send_result(record) {
                    Ok(delivery) => break pending.push(delivery),
                    Err((
                        rdkafka::error::KafkaError::MessageProduction(
                            rdkafka::types::RDKafkaErrorCode::QueueFull,
                        ),
                        _,
                    )) => tokio::time::sleep(Duration::from_millis(5)).await,
                    Err((e, _)) => bail!("producing to {}: {e}", self.topic),
                }
            }
            sent += 1;
            if pending.len() == 50_000 {
                for d in pending.drain(..) {
                    d.await
                        .context("the producer went away")?
                        .map_err(|(e, _)| anyhow::anyhow!("the broker refused an event: {e}"))?;
                }
                if sent % 250_000 == 0 {
                    println!("demo:   {sent} events acknowledged by the broker");
                }
            }
        }
        for d in pending {
            d.await
                .context("the producer went away")?
                .map_err(|(e, _)| anyhow::anyhow!("the broker refused an event: {e}"))?;
        }
        Ok(())
    }

    async fn wait_ingested(
        &self,
        expected: &Summary,
        from: &str,
        to: &str,
        since: Instant,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(1_800);
        let mut last_print = Instant::now();
        loop {
            let (requests, exact) = self.ingested(expected, from, to).await?;
            if exact {
                println!(
                    "demo: ingested all {} events exactly once, {:.1} s after the first was produced",
                    self.events,
                    since.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            if requests > expected.total().requests {
                bail!("billing-api shows {requests} requests for the month, more than the {} produced", self.events);
            }
            if Instant::now() > deadline {
                bail!("ingest did not catch up within 30 minutes ({requests} of {} billed); see .stack/demo/ingest.log", self.events);
            }
            if last_print.elapsed() > Duration::from_secs(15) {
                println!("demo:   {requests} of {} billed so far", self.events);
                last_print = Instant::now();
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    async fn wait_archived(&self, before: i64) -> anyhow::Result<()> {
        let want = before + i64::try_from(self.events)?;
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let now = archived_rows(&self.database_url).await?;
            if now >= want {
                println!(
                    "demo: archived them to Parquet ({} rows in the manifest now)",
                    now
                );
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the archiver did not archive the backfill within 10 minutes ({now} of {want} rows); see .stack/demo/archiver.log");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Rows the archive manifest lists (the archiver's own record of what it wrote).
async fn archived_rows(database_url: &str) -> anyhow::Result<i64> {
    use sqlx::ConnectOptions;
    let options: sqlx::postgres::PgConnectOptions = database_url.parse()?;
    let mut conn = options
        .connect()
        .await
        .context("connecting to DATABASE_URL")?;
    let (rows,): (i64,) = sqlx::query_as(
        "SELECT coalesce(sum(rows), 0)::bigint FROM archive_manifest WHERE retired_at IS NULL",
    )
    .fetch_one(&mut conn)
    .await?;
    Ok(rows)
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().expect("time")
    }

    const ZONES: [Tz; 3] = [
        chrono_tz::America::New_York,
        chrono_tz::Europe::Berlin,
        chrono_tz::UTC,
    ];

    #[test]
    fn the_month_has_ended_in_every_zone() {
        // 21:00 UTC on 1 December: November has ended in New York too.
        let m = latest_ended_month(at("2026-12-01T21:00:00Z"), &ZONES).expect("month");
        assert_eq!(m.period, "2026-11");
        // Berlin's November began at 23:00 UTC on 31 October, New York's at 04:00 UTC
        // on 1 November (EDT); it ended at 23:00 UTC (Berlin) and 05:00 UTC (New York).
        assert_eq!(m.from, at("2026-11-01T04:00:00Z"));
        assert_eq!(m.to, at("2026-11-30T23:00:00Z"));
        // 02:00 UTC on 1 December: still November in New York, so October.
        let m = latest_ended_month(at("2026-12-01T02:00:00Z"), &ZONES).expect("month");
        assert_eq!(m.period, "2026-10");
        // January rolls back into the previous year.
        let m = latest_ended_month(at("2027-01-15T12:00:00Z"), &ZONES).expect("month");
        assert_eq!(m.period, "2026-12");
    }
}
