//! Reporting an HTTP upstream's replicas from one gateway at a time.
//!
//! Several gateways stand in front of one upstream; its replicas' time
//! must be billed once. Where the time is read from (a [`Source`]):
//!
//! - an **`engine` binary** (`replica_reports: true`) serves every
//!   replica's busy, idle and lent GPU time since it started, at
//!   [`GET /v1/replicas/gpu-time`](engine::GPU_TIME_PATH);
//! - **any other upstream** (vLLM serves no GPU time) is one replica read
//!   from the gateways' shared GPU ledger ([`admission::gpu_ledger`], every
//!   gateway in front of it, on Redis's clock, since the ledger's epoch:
//!   when Redis first saw the replica): busy is what the ledger handed to
//!   requests that ended (their usage events' GPU time), lent the part of
//!   it other tenants ran on a `dedicated_to` replica, idle the time
//!   nothing ran plus what requests without a usage event held (see
//!   [`LedgerFigures`]). Without Redis, this gateway's own ledger, since
//!   the gateway started.
//!
//! Each upstream has a hash in the shared Redis
//! (`{prefix}replica-reports:{model}|{url}`) holding its reporter
//! (`owner`), a `version` bumped at every change, and the `progress`: the
//! source's instance and, per replica, the last reading reported. At each
//! tick a gateway
//!
//! 1. claims the hash ([`CLAIM`]) unless another gateway owns it and is
//!    alive (its liveness key, 15 s): so a killed reporter is replaced
//!    within 15 s and there is one reporter at a time;
//! 2. reads the source and computes the reports since the progress;
//! 3. moves the progress on ([`ADVANCE`]) only if it still owns the hash at
//!    the version it read — a gateway that lost the hash in between
//!    reports nothing;
//! 4. and only then appends the reports to its outbox.
//!
//! Every interval is therefore reported by the one gateway that advanced
//! past it: never twice. A reporter killed between 3 and 4 loses that one
//! interval; the next reporter goes on from where the progress says. The
//! reports name the source instance as their reporter (`engine-{instance}`
//! or `ledger-{epoch}`: which gateway carried a report is in its log), so
//! their ids depend on the interval alone, never on the gateway that sent
//! them.
//!
//! A new instance (an engine restarted, a ledger Redis lost: its counters
//! start again at zero) is reported from its start if it started less
//! than [`FIRST_INTERVAL_WITHIN`] ago in the current UTC hour: one report
//! from `started_at` per replica, whose id any repeat of it carries too
//! (ingest stores it once; a repeat with other figures is a `conflict`
//! dead letter). An instance found older than that (Redis lost the
//! progress, or no gateway reached the engine for that long) starts a new
//! interval with nothing reported, so the time since the last report is
//! lost rather than counted twice. A replica that died is reported to its
//! end, once. Redis keeps nothing on disk: if it restarts empty, the
//! interval in progress is lost, not doubled.
//!
//! While Redis is unreachable nothing is reported (another gateway may
//! still reach it); the time is reported at the next tick that reaches it.
//! (A vLLM request that started while Redis was unreachable is missing
//! from the shared ledger, so its time is reported as idle.) A gateway
//! without Redis (`GATEWAY_LIMITS=local`) is alone by definition and keeps
//! the progress in memory.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use admission::upstream::http::HttpUpstream;
use admission::upstream::RemoteModel;
use chrono::{DateTime, Utc};
use engine::{BusyIdle, GpuTimeReadings, ReplicaGpuTime};
use metrics::{counter, gauge};
use redis::Script;
use serde::{Deserialize, Serialize};

use super::interval::{hour_of, interval_reports, Reading};
use crate::metering::now_ms;
use crate::outbox::{Outbox, OutboxError};
use admission::cluster::Cluster;
use admission::gpu_ledger::RedisLedger;

/// A new engine instance that started less than this long ago (and in
/// the current UTC hour) is reported from its start; see the module docs.
pub const FIRST_INTERVAL_WITHIN: Duration = Duration::from_secs(600);

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
            at: DateTime::from_timestamp_millis(self.at_ms).unwrap_or_default(),
            time: self.time,
        }
    }
}

/// Where an HTTP upstream's GPU time is read from.
enum Source {
    /// The `engine` binary serves its replicas' (`replica_reports: true`).
    Engine,
    /// The gateways' shared GPU ledger in Redis: the replica's busy time
    /// over every gateway in front of it, since the ledger's epoch; idle
    /// is the rest of wall time × GPUs (vLLM serves no GPU time).
    SharedLedger(RedisLedger),
    /// This gateway's own ledger (no Redis: the gateway is alone), since
    /// the gateway started.
    OwnLedger {
        instance: String,
        started_at_ms: i64,
    },
}

impl Source {
    /// The first part of its reports' reporter id.
    fn name(&self) -> &'static str {
        match self {
            Self::Engine => "engine",
            Self::SharedLedger(_) | Self::OwnLedger { .. } => "ledger",
        }
    }
}

/// A GPU ledger's figures for one replica, GPU-µs since `started_at_ms`.
struct LedgerFigures {
    instance: String,
    started_at_ms: i64,
    elapsed_us: u64,
    /// Every interval with a request in flight, × GPUs.
    busy: u64,
    /// Handed to requests that ended: their usage events' GPU time.
    attributed: u64,
    /// Held by requests that ended without a usage event.
    reaped: u64,
    /// Of attributed, what other tenants ran on a dedicated replica.
    lent: u64,
}

impl LedgerFigures {
    /// As the replica's readings. Busy is what was attributed to requests
    /// that ended (so an interval's busy is its usage events' GPU time,
    /// and lent, settled in the same step, never exceeds it); idle is
    /// the time nothing ran, plus what requests without a usage event held
    /// (refused, or their gateway died): nobody's usage, the overhead
    /// pool's. Both only grow, and over any stretch that ends with nothing
    /// in flight busy + idle is the stretch × GPUs exactly.
    fn readings(&self, c: &RemoteModel) -> GpuTimeReadings {
        let gpus = u64::from(c.gpus.max(1));
        GpuTimeReadings {
            instance: self.instance.clone(),
            started_at_ms: self.started_at_ms,
            replicas: vec![ReplicaGpuTime {
                replica_id: c.replica().to_owned(),
                model: c.upstream_model.clone().unwrap_or_else(|| c.model.clone()),
                gpus: c.gpus,
                dedicated_to: c.dedicated_to.clone(),
                dead: false,
                time: BusyIdle {
                    busy_gpu_micros: self.attributed,
                    idle_gpu_micros: (self.elapsed_us * gpus).saturating_sub(self.busy)
                        + self.reaped,
                    lent_gpu_micros: self.lent.min(self.attributed),
                },
            }],
        }
    }
}

/// One HTTP upstream's replicas, reported by the elected gateway; see
/// the module docs.
pub struct RemoteReplicas {
    upstream: Arc<HttpUpstream>,
    source: Source,
    cluster: Cluster,
    key: String,
    /// The progress without Redis (a gateway on its own).
    alone: Progress,
    /// Whether this gateway reported at its last tick (logged when it
    /// changes, and on `/metrics` as `gateway_replica_reporter`).
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
        let source = if upstream.config.replica_reports {
            Source::Engine
        } else if cluster.has_redis() {
            Source::SharedLedger(RedisLedger::new(cluster.clone()))
        } else {
            let (elapsed_us, _) = upstream.ledger.elapsed_and_busy();
            let elapsed = i64::try_from(elapsed_us / 1_000).unwrap_or(0);
            Source::OwnLedger {
                instance: uuid::Uuid::now_v7().simple().to_string(),
                started_at_ms: now_ms().timestamp_millis() - elapsed,
            }
        };
        Self {
            upstream,
            source,
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

    /// A Redis call failed: the cluster goes local until a heartbeat
    /// succeeds; what to log.
    fn redis_failed(&self, doing: &str, e: &redis::RedisError) -> String {
        self.cluster.failed(e);
        format!("{doing} {}: {e}", self.key)
    }

    fn set_reporting(&mut self, reporting: bool) {
        self.reporting = reporting;
        let c = &self.upstream.config;
        gauge!("gateway_replica_reporter", "model" => c.model.clone(), "url" => c.url.clone())
            .set(if reporting { 1.0 } else { 0.0 });
    }

    /// The upstream's replicas' GPU time so far, from its source.
    async fn readings(&self) -> Result<GpuTimeReadings, String> {
        let c = &self.upstream.config;
        match &self.source {
            Source::Engine => self.upstream.gpu_time().await.map_err(|e| e.to_string()),
            Source::SharedLedger(redis) => {
                let r = redis
                    .reading(c.replica(), c.gpus)
                    .await
                    .ok_or_else(|| format!("reading the GPU ledger of {}", c.replica()))?;
                Ok(LedgerFigures {
                    instance: r.epoch_us.to_string(),
                    started_at_ms: r.epoch_us / 1_000,
                    elapsed_us: u64::try_from(r.now_us - r.epoch_us).unwrap_or(0),
                    busy: r.busy_gpu_micros,
                    attributed: r.attributed_gpu_micros,
                    reaped: r.reaped_gpu_micros,
                    lent: r.lent_gpu_micros,
                }
                .readings(c))
            }
            Source::OwnLedger {
                instance,
                started_at_ms,
            } => {
                let ledger = &self.upstream.ledger;
                let (elapsed_us, busy) = ledger.elapsed_and_busy();
                Ok(LedgerFigures {
                    instance: instance.clone(),
                    started_at_ms: *started_at_ms,
                    elapsed_us,
                    busy,
                    attributed: ledger.attributed_gpu_micros(),
                    reaped: 0,
                    lent: self
                        .upstream
                        .dedicated
                        .as_ref()
                        .map_or(0, |d| d.lent_gpu_micros()),
                }
                .readings(c))
            }
        }
    }

    /// Claims, reads, advances; the reports to append (replica id, JSON).
    async fn advance_progress(&mut self, me: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
        if !self.cluster.has_redis() {
            self.set_reporting(true);
            let readings = self.readings().await?;
            let (next, reports) = next(
                &self.upstream.config,
                &self.alone,
                &readings,
                now_ms(),
                self.source.name(),
            );
            self.alone = next;
            return Ok(reports);
        }
        let Some(mut conn) = self.cluster.conn() else {
            // Redis unreachable: whoever reaches it reports.
            self.set_reporting(false);
            return Ok(Vec::new());
        };
        let claimed: Vec<String> = self
            .claim
            .key(&self.key)
            .arg(me)
            .arg(self.cluster.alive_key(""))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.redis_failed("claiming", &e))?;
        let [won, previous, version, progress] = claimed.as_slice() else {
            if self.reporting {
                tracing::info!(url = %self.upstream.config.url, owner = ?claimed.get(1), "another gateway now reports this engine's replicas");
            }
            self.set_reporting(false);
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
            self.set_reporting(true);
        }
        // Progress that cannot be read (written by another version) is
        // started again, as if Redis had lost it: an interval lost, never
        // one counted twice, and no reporting stalled on it for good.
        let progress: Progress = serde_json::from_str(progress).unwrap_or_else(|e| {
            if !progress.is_empty() {
                tracing::error!(key = %self.key, error = %e, "unreadable replica report progress; starting again");
            }
            Progress::default()
        });
        let readings = self.readings().await?;
        let (next, reports) = next(
            &self.upstream.config,
            &progress,
            &readings,
            now_ms(),
            self.source.name(),
        );
        let stored = serde_json::to_string(&next).unwrap_or_default();
        let advanced: i64 = self
            .advance
            .key(&self.key)
            .arg(me)
            .arg(version)
            .arg(stored)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.redis_failed("advancing", &e))?;
        if advanced != 1 {
            self.set_reporting(false);
            tracing::info!(url = %self.upstream.config.url, "another gateway took over this engine's replica reports");
            return Ok(Vec::new());
        }
        Ok(reports)
    }
}

/// The progress after `readings` taken at `now`, and the reports between
/// the two (replica id, JSON), whose reporter is `{source}-{instance}`;
/// see the module docs.
fn next(
    config: &RemoteModel,
    progress: &Progress,
    readings: &GpuTimeReadings,
    now: DateTime<Utc>,
    source: &str,
) -> (Progress, Vec<(String, Vec<u8>)>) {
    let mark = |r: &ReplicaGpuTime| Mark {
        at_ms: now.timestamp_millis(),
        time: r.time,
        finished: r.dead,
    };
    let served = config.upstream_model.as_deref().unwrap_or(&config.model);
    let ours: Vec<&ReplicaGpuTime> = readings
        .replicas
        .iter()
        .filter(|r| r.model == served)
        .collect();
    let mut next = progress.clone();
    if progress.instance != readings.instance {
        // A new engine: its counters were zero at its start.
        next = Progress {
            instance: readings.instance.clone(),
            replicas: BTreeMap::new(),
        };
        let started = DateTime::from_timestamp_millis(readings.started_at_ms).unwrap_or(now);
        let recent = started <= now
            && (now - started)
                .to_std()
                .is_ok_and(|d| d <= FIRST_INTERVAL_WITHIN)
            && hour_of(started) == hour_of(now);
        if recent {
            for r in &ours {
                let start = Mark {
                    at_ms: readings.started_at_ms,
                    time: BusyIdle::default(),
                    finished: false,
                };
                next.replicas.insert(r.replica_id.clone(), start);
            }
        }
    }
    let reporter = format!("{source}-{}", readings.instance);
    let mut reports = Vec::new();
    for r in &ours {
        let to = mark(r);
        match next.replicas.insert(r.replica_id.clone(), to) {
            // First seen: its first interval starts here.
            None => {}
            Some(from) if from.finished => {
                next.replicas.insert(r.replica_id.clone(), from);
            }
            Some(from) => {
                let billed = ReplicaGpuTime {
                    replica_id: billed_name(config, &r.replica_id, ours.len()),
                    model: config.model.clone(),
                    ..(*r).clone()
                };
                for report in interval_reports(&reporter, &billed, from.reading(), to.reading()) {
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
fn billed_name(config: &RemoteModel, engine_replica: &str, replicas: usize) -> String {
    match (&config.replica_id, replicas) {
        (Some(name), 1) => name.clone(),
        (Some(name), _) => format!("{name}/{engine_replica}"),
        (None, _) => engine_replica.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rust_decimal::Decimal;
    use usage_contract::ReplicaReport;

    const T0: i64 = 1_800_000_000_000; // an hour boundary plus 0 ms
    const HOUR_MS: i64 = 3_600_000;

    fn config(replica_id: Option<&str>) -> RemoteModel {
        serde_json::from_value(serde_json::json!({
            "model": "m", "url": "http://e:1", "gpus": 1, "max_context": 1000,
            "identity_secret_env": "S", "replica_reports": true, "replica_id": replica_id,
        }))
        .unwrap()
    }

    fn replica(id: &str, model: &str, busy: u64, idle: u64, dead: bool) -> ReplicaGpuTime {
        ReplicaGpuTime {
            replica_id: id.into(),
            model: model.into(),
            gpus: 1,
            dedicated_to: None,
            dead,
            time: BusyIdle {
                busy_gpu_micros: busy,
                idle_gpu_micros: idle,
                lent_gpu_micros: 0,
            },
        }
    }

    fn readings(instance: &str, started_ms: i64, replicas: Vec<ReplicaGpuTime>) -> GpuTimeReadings {
        GpuTimeReadings {
            instance: instance.into(),
            started_at_ms: started_ms,
            replicas,
        }
    }

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(ms).unwrap()
    }

    fn parsed(reports: &[(String, Vec<u8>)]) -> Vec<ReplicaReport> {
        reports
            .iter()
            .map(|(_, json)| serde_json::from_slice(json).unwrap())
            .collect()
    }

    #[test]
    fn a_new_engine_is_reported_from_its_start_when_it_started_minutes_ago() {
        let read = readings(
            "i1",
            T0 + 1_000,
            vec![
                replica("m-r0", "m", 2_000_000, 3_000_000, false),
                replica("x-r0", "x", 9, 9, false),
            ],
        );
        let (progress, reports) = next(
            &config(None),
            &Progress::default(),
            &read,
            at(T0 + 6_000),
            "engine",
        );
        let reports = parsed(&reports);
        assert_eq!(reports.len(), 1, "only the upstream's own model");
        let r = &reports[0];
        assert_eq!(
            (r.interval_start, r.interval_end),
            (at(T0 + 1_000), at(T0 + 6_000))
        );
        assert_eq!(r.busy_gpu_seconds, Decimal::new(2, 0));
        assert_eq!(r.idle_gpu_seconds, Decimal::new(3, 0));
        assert_eq!(r.reporter_id, "engine-i1");
        assert_eq!(
            r.report_id,
            ReplicaReport::id_for("engine-i1", "m-r0", at(T0 + 1_000))
        );
        assert_eq!(progress.replicas["m-r0"].at_ms, T0 + 6_000);
        // The same readings again from an empty progress (Redis lost it):
        // the same report id, which ingest stores once.
        let (_, again) = next(
            &config(None),
            &Progress::default(),
            &read,
            at(T0 + 7_000),
            "engine",
        );
        assert_eq!(parsed(&again)[0].report_id, r.report_id);
    }

    #[test]
    fn an_engine_found_long_running_or_across_an_hour_starts_a_new_interval_unreported() {
        for (started, now) in [
            (T0, T0 + 11 * 60_000),     // older than the window
            (T0 - 60_000, T0 + 60_000), // two minutes, but across an hour
        ] {
            let read = readings("i1", started, vec![replica("m-r0", "m", 5, 5, false)]);
            let (progress, reports) = next(
                &config(None),
                &Progress::default(),
                &read,
                at(now),
                "engine",
            );
            assert!(reports.is_empty());
            assert_eq!(progress.instance, "i1");
            assert_eq!(progress.replicas["m-r0"].at_ms, now);
            assert_eq!(progress.replicas["m-r0"].time.busy_gpu_micros, 5);
        }
    }

    #[test]
    fn the_same_engine_is_reported_by_difference_and_a_dead_replica_once() {
        let first = readings("i1", T0, vec![replica("m-r0", "m", 1_000_000, 0, false)]);
        let (p1, _) = next(
            &config(Some("named")),
            &Progress::default(),
            &first,
            at(T0 + 1_000),
            "engine",
        );
        let dead = readings(
            "i1",
            T0,
            vec![replica("m-r0", "m", 1_500_000, 250_000, true)],
        );
        let (p2, reports) = next(&config(Some("named")), &p1, &dead, at(T0 + 2_000), "engine");
        let reports = parsed(&reports);
        assert_eq!(reports.len(), 1);
        assert_eq!(
            reports[0].replica_id, "named",
            "the configured replica_id, as its events"
        );
        assert_eq!(reports[0].busy_gpu_seconds, Decimal::new(5, 1));
        assert_eq!(reports[0].idle_gpu_seconds, Decimal::new(25, 2));
        assert_eq!(reports[0].interval_start, at(T0 + 1_000));
        let (p3, reports) = next(&config(Some("named")), &p2, &dead, at(T0 + 3_000), "engine");
        assert!(
            reports.is_empty(),
            "a dead replica is reported to its end once"
        );
        assert_eq!(p3, p2);
        // Another instance of the engine (restarted an hour later): no
        // difference is taken across the two.
        let restarted = readings("i2", T0 + HOUR_MS, vec![replica("m-r0", "m", 7, 7, false)]);
        let (p4, reports) = next(
            &config(Some("named")),
            &p3,
            &restarted,
            at(T0 + HOUR_MS + 1_000),
            "engine",
        );
        let reports = parsed(&reports);
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].interval_start, at(T0 + HOUR_MS));
        assert_eq!(reports[0].busy_gpu_seconds, Decimal::new(7, 6));
        assert_eq!(p4.instance, "i2");
    }

    #[test]
    fn several_replicas_of_a_named_upstream_are_told_apart() {
        let c = config(Some("named"));
        assert_eq!(billed_name(&c, "m-r1", 2), "named/m-r1");
        assert_eq!(billed_name(&config(None), "m-r1", 2), "m-r1");
    }
}
