//! Turning two readings of a replica's GPU time into reports: one per UTC
//! hour the interval touches, split in proportion to wall time so the
//! pieces sum to the whole exactly. Pure arithmetic, shared by the
//! simulated pool's reporter and the elected reporter of HTTP upstreams.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use engine::{BusyIdle, ReplicaGpuTime};
use rust_decimal::Decimal;
use usage_contract::replica_report::{RECORD_KIND, REPORT_VERSION};
use usage_contract::ReplicaReport;

/// A replica's GPU time so far, read at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub at: DateTime<Utc>,
    pub time: BusyIdle,
}

/// The reports of one replica's time between two readings: one per UTC
/// hour the interval touches, each counter split in proportion to the
/// piece's share of the interval (rounded down, the last piece taking the
/// rest, so the pieces sum to the whole exactly). Lent and the owner's own
/// busy time are split apart, so no piece lends more than it ran. A
/// reading earlier than the last (another gateway's clock) ends where the
/// last did.
pub fn interval_reports(
    reporter_id: &str,
    replica: &ReplicaGpuTime,
    from: Reading,
    to: Reading,
) -> Vec<ReplicaReport> {
    let end = to.at.max(from.at);
    let busy = to
        .time
        .busy_gpu_micros
        .saturating_sub(from.time.busy_gpu_micros);
    let lent = to
        .time
        .lent_gpu_micros
        .saturating_sub(from.time.lent_gpu_micros)
        .min(busy);
    let own = busy - lent;
    let idle = to
        .time
        .idle_gpu_micros
        .saturating_sub(from.time.idle_gpu_micros);
    let mut pieces = Vec::new();
    let mut start = from.at;
    loop {
        let piece_end = (hour_of(start) + TimeDelta::hours(1)).min(end);
        pieces.push((start, piece_end));
        if piece_end >= end {
            break;
        }
        start = piece_end;
    }
    let total_ms = u128::try_from((end - from.at).num_milliseconds()).unwrap_or(0);
    let (mut lent_left, mut own_left, mut idle_left) = (lent, own, idle);
    let last = pieces.len() - 1;
    pieces
        .into_iter()
        .enumerate()
        .map(|(i, (start, piece_end))| {
            let (l, o, d) = if i == last || total_ms == 0 {
                (lent_left, own_left, idle_left)
            } else {
                let ms = u128::try_from((piece_end - start).num_milliseconds()).unwrap_or(0);
                let share = |n: u64| u64::try_from(u128::from(n) * ms / total_ms).unwrap_or(n);
                (
                    share(lent).min(lent_left),
                    share(own).min(own_left),
                    share(idle).min(idle_left),
                )
            };
            lent_left -= l;
            own_left -= o;
            idle_left -= d;
            ReplicaReport {
                record: RECORD_KIND.to_owned(),
                report_version: REPORT_VERSION,
                report_id: ReplicaReport::id_for(reporter_id, &replica.replica_id, start),
                replica_id: replica.replica_id.clone(),
                model: replica.model.clone(),
                reporter_id: reporter_id.to_owned(),
                dedicated_to: replica.dedicated_to.clone(),
                gpus: replica.gpus,
                interval_start: start,
                interval_end: piece_end,
                busy_gpu_seconds: micros(l + o),
                idle_gpu_seconds: micros(d),
                lent_gpu_seconds: Some(micros(l)),
            }
        })
        .collect()
}

pub(super) fn hour_of(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(TimeDelta::hours(1)).unwrap_or(t)
}

/// Micro-GPU-seconds as the exact decimal the contract carries.
fn micros(n: u64) -> Decimal {
    Decimal::new(i64::try_from(n).unwrap_or(i64::MAX), 6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn replica(dedicated: bool) -> ReplicaGpuTime {
        ReplicaGpuTime {
            replica_id: "m-r0".into(),
            model: "m".into(),
            gpus: 4,
            dedicated_to: dedicated.then(|| "acme".into()),
            dead: false,
            time: BusyIdle::default(),
        }
    }

    fn reading(at_ms: i64, busy: u64, idle: u64, lent: u64) -> Reading {
        Reading {
            at: Utc.timestamp_millis_opt(at_ms).unwrap(),
            time: BusyIdle {
                busy_gpu_micros: busy,
                idle_gpu_micros: idle,
                lent_gpu_micros: lent,
            },
        }
    }

    const HOUR_MS: i64 = 3_600_000;

    #[test]
    fn an_interval_inside_one_hour_is_one_report_of_the_differences() {
        let from = reading(10 * HOUR_MS + 1_000, 5, 7, 1);
        let to = reading(10 * HOUR_MS + 6_000, 1_000_005, 3_000_007, 400_001);
        let reports = interval_reports("gw", &replica(true), from, to);
        assert_eq!(reports.len(), 1);
        let r = &reports[0];
        assert_eq!(r.busy_gpu_seconds, Decimal::new(1, 0));
        assert_eq!(r.idle_gpu_seconds, Decimal::new(3, 0));
        assert_eq!(r.lent_gpu_seconds, Some(Decimal::new(4, 1)));
        assert_eq!((r.interval_start, r.interval_end), (from.at, to.at));
        assert_eq!(r.report_id, ReplicaReport::id_for("gw", "m-r0", from.at));
        r.validate(to.at).unwrap();
    }

    #[test]
    fn an_interval_across_an_hour_is_split_at_the_boundary_by_wall_time() {
        // 15 minutes before the hour and 45 after: a quarter, then the rest.
        let from = reading(10 * HOUR_MS - HOUR_MS / 4, 0, 0, 0);
        let to = reading(10 * HOUR_MS + 3 * HOUR_MS / 4, 4_000_000, 8_000_000, 0);
        let reports = interval_reports("gw", &replica(false), from, to);
        assert_eq!(reports.len(), 2);
        assert_eq!(
            reports[0].interval_end,
            Utc.timestamp_millis_opt(10 * HOUR_MS).unwrap()
        );
        assert_eq!(reports[1].interval_start, reports[0].interval_end);
        assert_eq!(reports[0].busy_gpu_seconds, Decimal::new(1, 0));
        assert_eq!(reports[1].busy_gpu_seconds, Decimal::new(3, 0));
        assert_eq!(reports[0].idle_gpu_seconds, Decimal::new(2, 0));
        assert_eq!(reports[1].idle_gpu_seconds, Decimal::new(6, 0));
        for r in &reports {
            r.validate(to.at).unwrap();
        }
    }

    #[test]
    fn a_reading_behind_the_last_ends_where_the_last_did() {
        let from = reading(10 * HOUR_MS + 5_000, 0, 0, 0);
        let to = reading(10 * HOUR_MS + 4_000, 9, 9, 0);
        let reports = interval_reports("gw", &replica(false), from, to);
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].interval_end, from.at);
        assert_eq!(reports[0].busy_gpu_seconds, Decimal::new(9, 6));
    }

    proptest! {
        /// Whatever the interval and counters: the pieces tile the interval,
        /// each lies in one hour and is valid, and every counter sums to its
        /// difference exactly.
        #[test]
        fn pieces_tile_the_interval_and_conserve_every_counter(
            start in 0i64..(5 * HOUR_MS),
            len in 0i64..(4 * HOUR_MS),
            busy in 0u64..10_000_000_000,
            lent_part in 0u64..=100,
            idle in 0u64..10_000_000_000,
        ) {
            let lent = busy * lent_part / 100;
            let from = reading(start, 0, 0, 0);
            let to = reading(start + len, busy, idle, lent);
            let reports = interval_reports("gw", &replica(true), from, to);
            prop_assert_eq!(reports[0].interval_start, from.at);
            prop_assert_eq!(reports.last().unwrap().interval_end, to.at);
            for pair in reports.windows(2) {
                prop_assert_eq!(pair[0].interval_end, pair[1].interval_start);
            }
            for r in &reports {
                prop_assert!(r.validate(to.at).is_ok(), "{:?}", r.validate(to.at));
            }
            let sum = |f: fn(&ReplicaReport) -> Decimal| reports.iter().map(f).sum::<Decimal>();
            prop_assert_eq!(sum(|r| r.busy_gpu_seconds), micros(busy));
            prop_assert_eq!(sum(|r| r.idle_gpu_seconds), micros(idle));
            prop_assert_eq!(sum(|r| r.lent_gpu_seconds.unwrap()), micros(lent));
        }
    }
}
