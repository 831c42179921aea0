//! Reporting an `engine` binary's replicas from one gateway at a time.
//!
//! Several gateways stand in front of one `engine` binary; its replicas'
//! time must be billed once. Each upstream with `replica_reports: true`
//! has a hash in the shared Redis (`{prefix}replica-reports:{model}|{url}`)
//! holding its reporter (`owner`), a `version` bumped at every change, and
//! the `progress`: the engine instance and, per replica, the last reading
//! reported. At each tick a gateway
//!
//! 1. claims the hash ([`CLAIM`]) unless another gateway owns it and is
//!    alive (its liveness key, 15 s): so a killed reporter is replaced
//!    within 15 s and there is one reporter at a time;
//! 2. reads the engine's [`GET /v1/replicas/gpu-time`](engine::GPU_TIME_PATH)
//!    and computes the reports since the progress;
//! 3. moves the progress on ([`ADVANCE`]) only if it still owns the hash at
//!    the version it read — a gateway that lost the hash in between
//!    reports nothing;
//! 4. and only then appends the reports to its outbox.
//!
//! Every interval is therefore reported by the one gateway that advanced
//! past it: never twice. A reporter killed between 3 and 4 loses that one
//! interval; the next reporter goes on from where the progress says. A new
//! engine instance (its counters start again at zero) or a replica first
//! seen starts a new interval with nothing reported; a replica that died is
//! reported to its end, once. Redis keeps nothing on disk: if it restarts
//! empty, the interval in progress is lost, not doubled.
//!
//! While Redis is unreachable nothing is reported (another gateway may
//! still reach it); the time is reported at the next tick that reaches it.
//! A gateway without Redis (`GATEWAY_LIMITS=local`) is alone by
//! definition and keeps the progress in memory.

use std::collections::BTreeMap;
use std::sync::Arc;

use engine::upstream::http::HttpUpstream;
use engine::{BusyIdle, GpuTimeReadings, ReplicaGpuTime};
use metrics::counter;
use redis::Script;
use serde::{Deserialize, Serialize};

use super::{interval_reports, Reading};
use crate::cluster::Cluster;
use crate::metering::now_ms;
use crate::outbox::{Outbox, OutboxError};

/// Takes the hash unless another live gateway owns it.
/// KEYS[1] the hash; ARGV[1] this gateway, ARGV[2] the liveness key prefix.
/// Returns `{0, owner}` (someone else reports) or
/// `{1, previous owner, version, progress}`.
pub const CLAIM: &str = r"
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= ARGV[1] and redis.call('EXISTS', ARGV[2] .. owner) == 1 then
  return {0, owner}
end
if owner ~= ARGV[1] then
  redis.call('HSET', KEYS[1], 'owner', ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'version', 1)
end
return {1, owner or '', redis.call('HGET', KEYS[1], 'version'),
        redis.call('HGET', KEYS[1], 'progress') or ''}
";

/// Stores the new progress if this gateway still owns the hash at the
/// version it read. KEYS[1] the hash; ARGV[1] this gateway, ARGV[2] the
/// version read, ARGV[3] the new progress. Returns 1, or 0 if it lost it.
pub const ADVANCE: &str = r"
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], 'version') ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'progress', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'version', 1)
return 1
";

/// What has been reported of one engine: its instance and each replica's
/// last reported reading.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Progress {
    instance: String,
    replicas: BTreeMap<String, Mark>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Mark {
    at_ms: i64,
    time: BusyIdle,
    /// Died and reported to its end.
    finished: bool,
}

impl Mark {
    fn reading(self) -> Reading {
        Reading {
            at: chrono::DateTime::from_timestamp_millis(self.at_ms).unwrap_or_default(),
            time: self.time,
        }
    }
}

/// One `engine` binary behind an HTTP upstream, reported by the elected
/// gateway; see the module docs.
pub struct RemoteReplicas {
    upstream: Arc<HttpUpstream>,
    cluster: Cluster,
    key: String,
    /// The progress without Redis (a gateway on its own).
    alone: Progress,
    /// Whether this gateway reported at its last tick (to log changes).
    reporting: bool,
    claim: Script,
    advance: Script,
}

impl RemoteReplicas {
    pub fn new(upstream: Arc<HttpUpstream>, cluster: Cluster) -> Self {
        let key = cluster.key(&format!(
            "replica-reports:{}|{}",
            upstream.config.model, upstream.config.url
        ));
        Self {
            upstream,
            cluster,
            key,
            alone: Progress::default(),
            reporting: false,
            claim: Script::new(CLAIM),
            advance: Script::new(ADVANCE),
        }
    }

    /// One tick: if this gateway is the reporter, appends the reports since
    /// the progress and returns how many. A failure to reach Redis or the
    /// engine is logged and counted, and reports nothing.
    pub async fn report(&mut self, outbox: &Outbox, me: &str) -> Result<usize, OutboxError> {
        let reports = match self.advance_progress(me).await {
            Ok(reports) => reports,
            Err(detail) => {
                counter!("gateway_replica_report_errors_total", "model" => self.upstream.config.model.clone())
                    .increment(1);
                tracing::warn!(url = %self.upstream.config.url, %detail, "replica reports skipped this tick");
                return Ok(0);
            }
        };
        let mut appended = 0;
        for (replica, report) in reports {
            outbox.append(replica, report).await?;
            appended += 1;
        }
        Ok(appended)
    }

    /// Claims, reads, advances; the reports to append (replica id, JSON).
    async fn advance_progress(&mut self, me: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
        if !self.cluster.has_redis() {
            let readings = self.upstream.gpu_time().await.map_err(|e| e.to_string())?;
            let (next, reports) = self.next(&self.alone, &readings, me);
            self.alone = next;
            return Ok(reports);
        }
        let Some(mut conn) = self.cluster.conn() else {
            // Redis unreachable: whoever reaches it reports.
            self.reporting = false;
            return Ok(Vec::new());
        };
        let claimed: Vec<String> = self
            .claim
            .key(&self.key)
            .arg(me)
            .arg(self.cluster.alive_key(""))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| format!("claiming {}: {e}", self.key))?;
        let [won, previous, version, progress] = claimed.as_slice() else {
            if self.reporting {
                tracing::info!(url = %self.upstream.config.url, owner = ?claimed.get(1), "another gateway now reports this engine's replicas");
            }
            self.reporting = false;
            return Ok(Vec::new());
        };
        debug_assert_eq!(won, "1");
        if !self.reporting {
            tracing::info!(
                url = %self.upstream.config.url,
                model = %self.upstream.config.model,
                previous = %previous,
                "this gateway now reports the engine's replicas"
            );
            self.reporting = true;
        }
        let progress: Progress = if progress.is_empty() {
            Progress::default()
        } else {
            serde_json::from_str(progress).map_err(|e| format!("progress in {}: {e}", self.key))?
        };
        let readings = self.upstream.gpu_time().await.map_err(|e| e.to_string())?;
        let (next, reports) = self.next(&progress, &readings, me);
        let stored = serde_json::to_string(&next).unwrap_or_default();
        let advanced: i64 = self
            .advance
            .key(&self.key)
            .arg(me)
            .arg(version)
            .arg(stored)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| format!("advancing {}: {e}", self.key))?;
        if advanced != 1 {
            self.reporting = false;
            tracing::info!(url = %self.upstream.config.url, "another gateway took over this engine's replica reports");
            return Ok(Vec::new());
        }
        Ok(reports)
    }

    /// The progress after `readings` and the reports between the two.
    fn next(
        &self,
        progress: &Progress,
        readings: &GpuTimeReadings,
        me: &str,
    ) -> (Progress, Vec<(String, Vec<u8>)>) {
        let now = now_ms();
        let mark = |r: &ReplicaGpuTime| Mark {
            at_ms: now.timestamp_millis(),
            time: r.time,
            finished: r.dead,
        };
        let c = &self.upstream.config;
        let served = c.upstream_model.as_deref().unwrap_or(&c.model);
        let ours: Vec<&ReplicaGpuTime> = readings
            .replicas
            .iter()
            .filter(|r| r.model == served)
            .collect();
        if progress.instance != readings.instance {
            // A new engine (or the first reading): counters from zero here.
            return (
                Progress {
                    instance: readings.instance.clone(),
                    replicas: ours
                        .iter()
                        .map(|r| (r.replica_id.clone(), mark(r)))
                        .collect(),
                },
                Vec::new(),
            );
        }
        let mut next = progress.clone();
        let mut reports = Vec::new();
        for r in &ours {
            let to = mark(r);
            match next.replicas.insert(r.replica_id.clone(), to) {
                None => {}
                Some(from) if from.finished => {
                    next.replicas.insert(r.replica_id.clone(), from);
                }
                Some(from) => {
                    let billed = ReplicaGpuTime {
                        replica_id: self.billed_name(&r.replica_id, ours.len()),
                        model: c.model.clone(),
                        ..(*r).clone()
                    };
                    for report in interval_reports(me, &billed, from.reading(), to.reading()) {
                        reports.push((billed.replica_id.clone(), report.to_json()));
                    }
                }
            }
        }
        (next, reports)
    }

    /// The replica id its usage events carry: the configured `replica_id`
    /// when the engine runs one replica of the model (suffixed with the
    /// engine's own id when it runs several), else the engine's own.
    fn billed_name(&self, engine_replica: &str, replicas: usize) -> String {
        match (&self.upstream.config.replica_id, replicas) {
            (Some(name), 1) => name.clone(),
            (Some(name), _) => format!("{name}/{engine_replica}"),
            (None, _) => engine_replica.to_owned(),
        }
    }
}
