//! [`Reporter`]: the loop that reads this gateway's simulated replicas
//! (and the HTTP upstreams it is elected for) every tick and at each hour
//! boundary, and appends their reports to the outbox.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use admission::upstream::Upstreams;
use chrono::{TimeDelta, Utc};
use engine::ReplicaGpuTime;
use metrics::counter;
use tokio::sync::watch;

use super::interval::{hour_of, interval_reports, Reading};
use super::remote;
use crate::metering::now_ms;
use crate::outbox::{Outbox, OutboxError};
use admission::cluster::Cluster;

/// Reports the replicas behind this gateway; see the `replica_reports`
/// module docs.
pub struct Reporter {
    engine: Arc<Upstreams>,
    outbox: Outbox,
    gateway_id: String,
    /// The simulated models this gateway serves (a model behind an HTTP
    /// upstream has no simulated replicas running).
    models: HashSet<String>,
    last: HashMap<String, Reading>,
    /// Replicas that died and were reported to the end.
    finished: HashSet<String>,
    /// The HTTP upstreams this gateway may be elected to report.
    remote: Vec<remote::RemoteReplicas>,
}

impl Reporter {
    /// Starts every simulated replica's clock and takes the first reading
    /// (nothing is reported for it: it is where the first interval starts).
    pub async fn start(
        engine: Arc<Upstreams>,
        outbox: Outbox,
        gateway_id: String,
        cluster: Cluster,
    ) -> Self {
        let models = engine
            .models()
            .iter()
            .filter(|m| !m.remote)
            .map(|m| m.name.clone())
            .collect();
        let remote = engine
            .remote()
            .iter()
            .map(|u| remote::RemoteReplicas::new(u.clone(), cluster.clone()))
            .collect();
        let mut reporter = Self {
            engine,
            outbox,
            gateway_id,
            models,
            last: HashMap::new(),
            finished: HashSet::new(),
            remote,
        };
        let at = now_ms();
        for r in reporter.readings().await {
            reporter
                .last
                .insert(r.replica_id, Reading { at, time: r.time });
        }
        reporter
    }

    async fn readings(&self) -> Vec<ReplicaGpuTime> {
        let mut all = self.engine.simulator().gpu_time().await;
        all.retain(|r| self.models.contains(&r.model) && !self.finished.contains(&r.replica_id));
        all
    }

    /// Appends the reports of every simulated replica covering the time
    /// since the last, then those of the `engine` binaries this gateway is
    /// elected for, and returns how many it appended.
    pub async fn report(&mut self) -> Result<usize, OutboxError> {
        let now = now_ms();
        let mut appended = 0;
        for r in self.readings().await {
            let to = Reading {
                at: now,
                time: r.time,
            };
            let Some(from) = self.last.insert(r.replica_id.clone(), to) else {
                // A replica first seen now starts its first interval here.
                continue;
            };
            for report in interval_reports(&self.gateway_id, &r, from, to) {
                self.outbox
                    .append(r.replica_id.clone(), report.to_json())
                    .await?;
                appended += 1;
            }
            if r.dead {
                self.finished.insert(r.replica_id);
            }
        }
        for remote in &mut self.remote {
            appended += remote.report(&self.outbox, &self.gateway_id).await?;
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
