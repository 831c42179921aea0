//! Replica reports: the busy and idle GPU time of the replicas this gateway
//! hosts (its simulated pools), written to the outbox as
//! [`ReplicaReport`]s and published beside the usage events.
//!
//! Idle time is nobody's request, and a dedicated replica's hours are its
//! owner's whether used or not, so neither can come from usage events.
//! The process that runs a replica is the one that knows its time: a
//! simulated pool lives inside its gateway, so each gateway reports its own
//! replicas — once per replica, never once per gateway in front of a shared
//! one (an HTTP upstream reports nothing here; its host would).
//!
//! Every [`GATEWAY_REPLICA_REPORT_SECS`](crate::config::GatewayConfig) and
//! at each UTC hour boundary the reporter asks every replica for its GPU
//! time so far and appends one report per replica with what changed since
//! the last report: busy (attributed to requests) and idle GPU-seconds, and
//! on a dedicated replica the part of busy that ran other tenants' work
//! (lent), in the engine's time, exact to the microsecond. A report never spans two
//! hours; a reading taken a few milliseconds past a boundary is counted in
//! the hour it began in, so the hours can be off by that much, never the
//! sum. The outbox makes each report durable before it is published and
//! the report id makes a re-send harmless. A graceful stop reports the last
//! interval; a gateway killed outright loses at most one interval of its
//! replicas' time, which died with it (`gateway_replica_report_seconds`
//! bounds it).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use engine::upstream::Upstreams;
use engine::BusyIdle;
use metrics::counter;
use tokio::sync::watch;
use usage_contract::replica_report::{RECORD_KIND, REPORT_VERSION};
use usage_contract::ReplicaReport;

use crate::metering::now_ms;
use crate::outbox::{Outbox, OutboxError};

/// What one replica had at the last report.
#[derive(Debug, Clone, Copy)]
struct Reported {
    at: DateTime<Utc>,
    time: BusyIdle,
}

/// Reports this gateway's simulated replicas; see the module docs.
pub struct Reporter {
    engine: Arc<Upstreams>,
    outbox: Outbox,
    gateway_id: String,
    /// The simulated models this gateway serves (a model behind an HTTP
    /// upstream has no simulated replicas running).
    models: HashSet<String>,
    last: HashMap<String, Reported>,
    /// Replicas that died and were reported to the end.
    finished: HashSet<String>,
}

impl Reporter {
    /// Starts every simulated replica's clock and takes the first reading
    /// (nothing is reported for it: it is where the first interval starts).
    pub async fn start(engine: Arc<Upstreams>, outbox: Outbox, gateway_id: String) -> Self {
        let models = engine
            .models()
            .iter()
            .filter(|m| !m.remote)
            .map(|m| m.name.clone())
            .collect();
        let mut reporter = Self {
            engine,
            outbox,
            gateway_id,
            models,
            last: HashMap::new(),
            finished: HashSet::new(),
        };
        let at = now_ms();
        for r in reporter.readings().await {
            reporter
                .last
                .insert(r.replica_id, Reported { at, time: r.time });
        }
        reporter
    }

    async fn readings(&self) -> Vec<engine::ReplicaGpuTime> {
        let mut all = self.engine.simulator().gpu_time().await;
        all.retain(|r| self.models.contains(&r.model) && !self.finished.contains(&r.replica_id));
        all
    }

    /// Appends one report per replica covering the time since the last,
    /// and returns how many it appended.
    pub async fn report(&mut self) -> Result<usize, OutboxError> {
        let now = now_ms();
        let mut appended = 0;
        for r in self.readings().await {
            let Some(last) = self.last.get(&r.replica_id).copied() else {
                // A replica first seen now starts its first interval here.
                self.last.insert(
                    r.replica_id.clone(),
                    Reported {
                        at: now,
                        time: r.time,
                    },
                );
                continue;
            };
            let hour_end = hour_of(last.at) + TimeDelta::hours(1);
            let report = ReplicaReport {
                record: RECORD_KIND.to_owned(),
                report_version: REPORT_VERSION,
                report_id: ReplicaReport::id_for(&self.gateway_id, &r.replica_id, last.at),
                replica_id: r.replica_id.clone(),
                model: r.model.clone(),
                reporter_id: self.gateway_id.clone(),
                dedicated_to: r.dedicated_to.clone(),
                gpus: r.gpus,
                interval_start: last.at,
                interval_end: now.min(hour_end),
                busy_gpu_seconds: micros(
                    r.time
                        .busy_gpu_micros
                        .saturating_sub(last.time.busy_gpu_micros),
                ),
                idle_gpu_seconds: micros(
                    r.time
                        .idle_gpu_micros
                        .saturating_sub(last.time.idle_gpu_micros),
                ),
                lent_gpu_seconds: Some(micros(
                    r.time
                        .lent_gpu_micros
                        .saturating_sub(last.time.lent_gpu_micros),
                )),
            };
            self.outbox
                .append(r.replica_id.clone(), report.to_json())
                .await?;
            appended += 1;
            self.last.insert(
                r.replica_id.clone(),
                Reported {
                    at: now,
                    time: r.time,
                },
            );
            if r.dead {
                self.finished.insert(r.replica_id);
            }
        }
        counter!("gateway_replica_reports_total").increment(appended as u64);
        Ok(appended)
    }

    /// Reports every `every` and at each hour boundary until `stop` turns
    /// true, then reports the last interval and returns.
    pub async fn run(mut self, every: Duration, mut stop: watch::Receiver<bool>) {
        loop {
            let now = Utc::now();
            let to_hour = (hour_of(now) + TimeDelta::hours(1) - now)
                .to_std()
                .unwrap_or_default();
            let wait = every.min(to_hour.max(Duration::from_millis(1)));
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stop.changed() => {}
            }
            if let Err(e) = self.report().await {
                tracing::error!(error = %e, "cannot write replica reports to the outbox");
            }
            if *stop.borrow() {
                return;
            }
        }
    }
}

fn hour_of(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(TimeDelta::hours(1)).unwrap_or(t)
}

/// Micro-GPU-seconds as the exact decimal the contract carries.
fn micros(n: u64) -> rust_decimal::Decimal {
    rust_decimal::Decimal::new(i64::try_from(n).unwrap_or(i64::MAX), 6)
}
