//! The replica report: a replica's busy and idle GPU time over one
//! interval, the second record kind on the usage topic.
//!
//! Idle GPU time is nobody's request, so no usage event carries it; a
//! dedicated replica's hours are its owner's whether used or not. Both
//! reach billing through these reports, written by the one process that
//! hosts the replica (never by every gateway in front of it) into its
//! durable outbox, published beside the usage events (key: the replica id)
//! and stored exactly once by ingest under [`ReplicaReport::report_id`].
//!
//! An interval never spans two UTC hours, so each report adds to exactly
//! one hour. Its busy GPU-seconds equal the GPU time the replica attributed
//! to requests over the interval (their `gpu_seconds`, preempted work
//! included); busy + idle is the replica's whole GPU time over it.
//!
//! Version 2 adds `lent_gpu_seconds`: of the busy time, what a dedicated
//! replica ran for tenants other than its owner (0 on a shared replica),
//! as the replica counted it. The owner's credit for lending is measured
//! here rather than from the usage events, because an event names only the
//! replica its request *ended* on: a request preempted on a lent replica
//! and finished elsewhere spent part of its GPU time on the owner's
//! replica that its event cannot place. Version 1 reports (no
//! `lent_gpu_seconds`) stay valid; for their hours billing takes the lent
//! time from the events, as before.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::event::GPU_SECONDS_SCALE;
use crate::validate::{Violation, MAX_FUTURE};

/// The `record` tag that marks a replica report on the topic.
pub const RECORD_KIND: &str = "replica_report";

/// The version of the report's own fields (1 is still read).
pub const REPORT_VERSION: u32 = 2;

/// One replica's GPU time over `[interval_start, interval_end)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaReport {
    /// Always [`RECORD_KIND`].
    pub record: String,
    pub report_version: u32,
    /// Unique per report: `{reporter_id}/{replica_id}/{interval_start ms}`.
    /// A re-send repeats it; ingest stores it once.
    pub report_id: String,
    pub replica_id: String,
    pub model: String,
    /// The process hosting the replica (a gateway's id for its simulated pool).
    pub reporter_id: String,
    /// The owner of a dedicated replica; absent for a shared one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedicated_to: Option<String>,
    pub gpus: u32,
    #[serde(with = "crate::event::millis")]
    pub interval_start: DateTime<Utc>,
    #[serde(with = "crate::event::millis")]
    pub interval_end: DateTime<Utc>,
    /// GPU time attributed to requests over the interval, a decimal string.
    #[serde(with = "rust_decimal::serde::str")]
    pub busy_gpu_seconds: Decimal,
    /// GPU time with nothing to run, a decimal string.
    #[serde(with = "rust_decimal::serde::str")]
    pub idle_gpu_seconds: Decimal,
    /// Version 2: of `busy_gpu_seconds`, what ran for tenants other than
    /// `dedicated_to` (`"0"` on a shared replica), a decimal string.
    /// Absent in version 1.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "rust_decimal::serde::str_option"
    )]
    pub lent_gpu_seconds: Option<Decimal>,
}

impl ReplicaReport {
    /// The id a report of this replica and interval start must carry.
    pub fn id_for(reporter_id: &str, replica_id: &str, start: DateTime<Utc>) -> String {
        format!("{reporter_id}/{replica_id}/{}", start.timestamp_millis())
    }

    /// The UTC hour the interval lies in.
    pub fn hour(&self) -> DateTime<Utc> {
        hour_of(self.interval_start)
    }

    /// Canonical JSON, as published.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The rules a report must keep; the first broken one.
    pub fn validate(&self, now: DateTime<Utc>) -> Result<(), Violation> {
        if self.record != RECORD_KIND {
            return Err(Violation::InvalidField(format!(
                "record is {:?}, not {RECORD_KIND:?}",
                self.record
            )));
        }
        match (self.report_version, self.lent_gpu_seconds) {
            (1, None) | (2, Some(_)) => {}
            (1, Some(_)) => {
                return Err(Violation::InvalidField(
                    "lent_gpu_seconds is a version 2 field; report_version is 1".into(),
                ))
            }
            (2, None) => return Err(Violation::MissingField("lent_gpu_seconds".into())),
            (v, _) => return Err(Violation::UnknownSchemaVersion(v.into())),
        }
        for (field, value) in [
            ("report_id", Some(&self.report_id)),
            ("replica_id", Some(&self.replica_id)),
            ("model", Some(&self.model)),
            ("reporter_id", Some(&self.reporter_id)),
            ("dedicated_to", self.dedicated_to.as_ref()),
        ] {
            if let Some(value) = value {
                crate::validate::check_identifier(field, value)?;
            }
        }
        if self.report_id != Self::id_for(&self.reporter_id, &self.replica_id, self.interval_start)
        {
            return Err(Violation::InvalidField(
                "report_id is not {reporter_id}/{replica_id}/{interval_start in ms}".into(),
            ));
        }
        if self.gpus == 0 || self.gpus > 1024 {
            return Err(Violation::InvalidField(format!(
                "gpus is {}, not 1 to 1024",
                self.gpus
            )));
        }
        if self.interval_end < self.interval_start {
            return Err(Violation::FinishedBeforeStarted {
                started: self.interval_start.to_rfc3339(),
                finished: self.interval_end.to_rfc3339(),
            });
        }
        let hour = self.hour();
        if self.interval_end > hour + TimeDelta::hours(1) {
            return Err(Violation::InvalidField(
                "the interval spans two UTC hours; a report covers one".into(),
            ));
        }
        if self.interval_end > now + MAX_FUTURE {
            return Err(Violation::InFuture {
                field: "interval_end",
                at: self.interval_end.to_rfc3339(),
            });
        }
        let lent = self.lent_gpu_seconds.unwrap_or_default();
        for (field, value) in [
            ("busy_gpu_seconds", self.busy_gpu_seconds),
            ("idle_gpu_seconds", self.idle_gpu_seconds),
            ("lent_gpu_seconds", lent),
        ] {
            if value.is_sign_negative() && !value.is_zero() {
                return Err(Violation::NegativeCount {
                    field,
                    value: value.to_string(),
                });
            }
            if value.normalize().scale() > GPU_SECONDS_SCALE {
                return Err(Violation::TooPrecise { field });
            }
            // A replica cannot run faster than real time by more than the
            // simulator's largest speed-up over a whole hour.
            if value > Decimal::from(u64::from(self.gpus) * 3600 * 10_000) {
                return Err(Violation::AbsurdCount {
                    field,
                    value: value.to_string(),
                    limit: (u64::from(self.gpus) * 3600 * 10_000).to_string(),
                });
            }
        }
        if lent > self.busy_gpu_seconds {
            return Err(Violation::InvalidField(format!(
                "lent_gpu_seconds {lent} exceeds busy_gpu_seconds {}",
                self.busy_gpu_seconds
            )));
        }
        if self.dedicated_to.is_none() && !lent.is_zero() {
            return Err(Violation::InvalidField(
                "lent_gpu_seconds is not 0 on a shared replica (no dedicated_to)".into(),
            ));
        }
        Ok(())
    }
}

fn hour_of(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(TimeDelta::hours(1)).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn report() -> ReplicaReport {
        let start = Utc.with_ymd_and_hms(2026, 12, 2, 10, 59, 0).unwrap();
        ReplicaReport {
            record: RECORD_KIND.into(),
            report_version: REPORT_VERSION,
            report_id: ReplicaReport::id_for("gw-1", "llama-3.1-70b-r0", start),
            replica_id: "llama-3.1-70b-r0".into(),
            model: "llama-3.1-70b".into(),
            reporter_id: "gw-1".into(),
            dedicated_to: Some("acme-corp".into()),
            gpus: 4,
            interval_start: start,
            interval_end: start + TimeDelta::seconds(60),
            busy_gpu_seconds: Decimal::new(180_500_000, 6),
            idle_gpu_seconds: Decimal::new(59_500_000, 6),
            lent_gpu_seconds: Some(Decimal::new(20_000_000, 6)),
        }
    }

    #[test]
    fn a_report_round_trips_and_validates() {
        let r = report();
        let back: ReplicaReport = serde_json::from_slice(&r.to_json()).unwrap();
        assert_eq!(back, r);
        assert_eq!(r.validate(Utc::now()), Ok(()));
        assert_eq!(
            r.hour(),
            Utc.with_ymd_and_hms(2026, 12, 2, 10, 0, 0).unwrap()
        );
    }

    #[test]
    fn an_interval_across_an_hour_is_refused() {
        let mut r = report();
        r.interval_end = r.interval_start + TimeDelta::seconds(61);
        assert_eq!(r.validate(Utc::now()).unwrap_err().code(), "invalid_field");
    }

    #[test]
    fn a_report_id_that_is_not_derived_is_refused() {
        let mut r = report();
        r.report_id = "gw-1/other".into();
        assert_eq!(r.validate(Utc::now()).unwrap_err().code(), "invalid_field");
        let mut r = report();
        r.idle_gpu_seconds = Decimal::new(-1, 6);
        assert_eq!(r.validate(Utc::now()).unwrap_err().code(), "negative_count");
    }

    #[test]
    fn lent_time_is_a_version_2_field_within_the_busy_time_of_a_dedicated_replica() {
        let mut r = report();
        r.lent_gpu_seconds = Some(r.busy_gpu_seconds);
        assert_eq!(r.validate(Utc::now()), Ok(()));
        r.lent_gpu_seconds = Some(r.busy_gpu_seconds + Decimal::new(1, 6));
        let e = r.validate(Utc::now()).unwrap_err();
        assert!(e.to_string().contains("exceeds busy_gpu_seconds"), "{e}");
        // Version 2 carries it; version 1 does not, and is still valid.
        r.lent_gpu_seconds = None;
        assert_eq!(r.validate(Utc::now()).unwrap_err().code(), "missing_field");
        r.report_version = 1;
        assert_eq!(r.validate(Utc::now()), Ok(()));
        r.lent_gpu_seconds = Some(Decimal::ZERO);
        assert_eq!(r.validate(Utc::now()).unwrap_err().code(), "invalid_field");
        // A shared replica lends nothing.
        let mut r = report();
        r.dedicated_to = None;
        assert_eq!(r.validate(Utc::now()).unwrap_err().code(), "invalid_field");
        r.lent_gpu_seconds = Some(Decimal::ZERO);
        assert_eq!(r.validate(Utc::now()), Ok(()));
        // It travels as a decimal string, and a v1 report has no such key.
        let json = String::from_utf8(report().to_json()).unwrap();
        assert!(json.contains(r#""lent_gpu_seconds":"20.000000""#), "{json}");
        let mut v1 = report();
        v1.report_version = 1;
        v1.lent_gpu_seconds = None;
        let json = String::from_utf8(v1.to_json()).unwrap();
        assert!(!json.contains("lent"), "{json}");
    }
}
