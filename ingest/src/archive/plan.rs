//! How a batch of raw messages becomes archive pieces. Pure: no I/O, so the
//! rules are unit-tested.
//!
//! Per partition, a batch covers one contiguous offset range: from the
//! stored archive offset (or the first message, for a partition never
//! archived) to its last message. Its valid events are grouped by the UTC
//! hour they started in, one Parquet file per hour, each named by that
//! range: `date=YYYY-MM-DD/hour=HH/<topic>-p<partition>-o<first>-<last>.parquet`.
//! So a partition's ranges follow each other with no gap and no overlap,
//! a batch that straddles an hour writes one file per hour under the same
//! range, and the same name always means the same rows (that range's
//! events of that hour). Messages that do not decode or break the
//! contract's rules are counted (`skipped`, on the range's first piece)
//! and not written: ingest already keeps them in its dead letters. A range
//! of only such messages becomes a manifest row without a file.
//!
//! Validity is the contract's, minus its one clock-relative rule ("more
//! than a day in the future"): the archive must not depend on when it was
//! written, so a file re-written under the same name holds the same rows,
//! and whatever ingest accepted the archive accepts too.

use std::collections::BTreeMap;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use usage_contract::decode;

use crate::archive::writer::ArchivedEvent;
use crate::batch::RawMessage;

/// One file of a batch (or, for a range without valid events, no file):
/// the events of one partition's range that started in one UTC hour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub partition: i32,
    /// The range of the batch in this partition (shared by its pieces).
    pub first_offset: i64,
    /// Inclusive.
    pub last_offset: i64,
    /// The UTC hour every row started in; `None` for a range without rows.
    pub hour: Option<DateTime<Utc>>,
    /// In offset order.
    pub rows: Vec<ArchivedEvent>,
    /// Messages of the range that were not archived (undecodable or
    /// invalid); counted on the range's first piece only.
    pub skipped: u64,
}

impl Piece {
    /// The file's path relative to the archive's root, if it has rows.
    pub fn path(&self, topic: &str) -> Option<String> {
        self.hour.map(|h| {
            format!(
                "date={}/hour={}/{topic}-p{}-o{}-{}.parquet",
                h.format("%Y-%m-%d"),
                h.format("%H"),
                self.partition,
                self.first_offset,
                self.last_offset
            )
        })
    }
}

/// A batch cut into pieces.
#[derive(Debug, Default)]
pub struct Plan {
    pub pieces: Vec<Piece>,
    /// Per partition: the offset after the last message in the batch.
    pub next_offsets: BTreeMap<i32, i64>,
    /// Skipped messages by violation code, for metrics.
    pub skipped: BTreeMap<&'static str, u64>,
}

impl Plan {
    pub fn rows(&self) -> usize {
        self.pieces.iter().map(|p| p.rows.len()).sum()
    }
}

/// The clock the archive validates against: far enough ahead that the
/// "in the future" rule never fires, so validity depends on the bytes alone.
fn archive_clock() -> DateTime<Utc> {
    DateTime::<Utc>::MAX_UTC
        .checked_sub_signed(TimeDelta::days(7))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn hour_of(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(TimeDelta::hours(1)).unwrap_or(t)
}

/// Cuts `messages` into pieces. `starts` holds, per partition, the stored
/// archive offset (`None`: nothing archived yet, start at the first message).
/// Messages below a partition's start are ignored.
pub fn plan(messages: &[RawMessage], starts: &BTreeMap<i32, Option<i64>>) -> Plan {
    let clock = archive_clock();
    let mut by_partition: BTreeMap<i32, Vec<&RawMessage>> = BTreeMap::new();
    for m in messages {
        by_partition.entry(m.partition).or_default().push(m);
    }
    let mut out = Plan::default();
    for (partition, mut msgs) in by_partition {
        msgs.sort_by_key(|m| m.offset);
        msgs.dedup_by_key(|m| m.offset);
        let start = starts.get(&partition).copied().flatten();
        if let Some(start) = start {
            msgs.retain(|m| m.offset >= start);
        }
        let (Some(first), Some(last)) = (msgs.first(), msgs.last()) else {
            continue;
        };
        let (first_offset, last_offset) = (start.unwrap_or(first.offset), last.offset);
        let mut hours: BTreeMap<DateTime<Utc>, Vec<ArchivedEvent>> = BTreeMap::new();
        let mut skipped = 0;
        for m in &msgs {
            match decode(&m.payload, clock) {
                Ok(event) => {
                    hours
                        .entry(hour_of(event.started_at))
                        .or_default()
                        .push(ArchivedEvent {
                            partition,
                            offset: m.offset,
                            event,
                        })
                }
                Err(violation) => {
                    skipped += 1;
                    *out.skipped.entry(violation.code()).or_default() += 1;
                }
            }
        }
        let piece = |hour, rows, skipped| Piece {
            partition,
            first_offset,
            last_offset,
            hour,
            rows,
            skipped,
        };
        if hours.is_empty() {
            out.pieces.push(piece(None, Vec::new(), skipped));
        }
        for (i, (hour, rows)) in hours.into_iter().enumerate() {
            out.pieces
                .push(piece(Some(hour), rows, if i == 0 { skipped } else { 0 }));
        }
        out.next_offsets.insert(partition, last_offset + 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use rust_decimal::Decimal;
    use usage_contract::{FinishReason, RequestId, UsageEvent};

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, h, m, 0).unwrap()
    }

    fn event(started: DateTime<Utc>) -> UsageEvent {
        UsageEvent {
            schema_version: 1,
            request_id: RequestId::at(started),
            tenant_id: "acme-corp".into(),
            api_key_id: "k".into(),
            model: "m".into(),
            model_version: "v".into(),
            priority: 3,
            started_at: started,
            first_token_at: None,
            finished_at: started,
            prompt_tokens: 10,
            cached_tokens: 0,
            completion_tokens: 5,
            gpu_seconds: Decimal::new(1_500_000, 6),
            preempted_gpu_seconds: Decimal::ZERO,
            finish_reason: FinishReason::Stop,
            ttft_ms: None,
            tpot_ms: None,
            replica_id: "r".into(),
            gateway_id: "g".into(),
            stream: false,
        }
    }

    fn msg(partition: i32, offset: i64, started: Option<DateTime<Utc>>) -> RawMessage {
        RawMessage {
            decoded: None,
            partition,
            offset,
            payload: started.map_or_else(|| b"garbage".to_vec(), |t| event(t).to_json()),
        }
    }

    fn ranges(plan: &Plan) -> Vec<(i32, i64, i64, Option<u32>, usize, u64)> {
        use chrono::Timelike;
        plan.pieces
            .iter()
            .map(|p| {
                (
                    p.partition,
                    p.first_offset,
                    p.last_offset,
                    p.hour.map(|h| h.hour()),
                    p.rows.len(),
                    p.skipped,
                )
            })
            .collect()
    }

    #[test]
    fn a_batch_is_split_into_one_file_per_hour_under_one_range() {
        let msgs = vec![
            msg(0, 10, Some(at(9, 59))),
            msg(0, 11, Some(at(9, 10))),
            msg(0, 12, Some(at(10, 0))),
            msg(0, 13, Some(at(10, 30))),
            msg(0, 14, Some(at(9, 58))), // late: back to hour 9
        ];
        let plan = plan(&msgs, &BTreeMap::from([(0, Some(10))]));
        assert_eq!(
            ranges(&plan),
            vec![(0, 10, 14, Some(9), 3, 0), (0, 10, 14, Some(10), 2, 0)]
        );
        let offsets: Vec<i64> = plan.pieces[0].rows.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![10, 11, 14]);
        assert_eq!(plan.next_offsets, BTreeMap::from([(0, 15)]));
        assert_eq!(
            plan.pieces[0].path("usage.events.v1").as_deref(),
            Some("date=2026-11-29/hour=09/usage.events.v1-p0-o10-14.parquet")
        );
        assert_eq!(
            plan.pieces[1].path("usage.events.v1").as_deref(),
            Some("date=2026-11-29/hour=10/usage.events.v1-p0-o10-14.parquet")
        );
    }

    #[test]
    fn hours_on_both_sides_of_midnight_go_to_their_own_dates() {
        let before = Utc.with_ymd_and_hms(2026, 11, 29, 23, 59, 59).unwrap();
        let after = Utc.with_ymd_and_hms(2026, 11, 30, 0, 0, 0).unwrap();
        let plan = plan(
            &[msg(3, 0, Some(after)), msg(3, 1, Some(before))],
            &BTreeMap::new(),
        );
        let paths: Vec<String> = plan.pieces.iter().filter_map(|p| p.path("t")).collect();
        assert_eq!(
            paths,
            vec![
                "date=2026-11-29/hour=23/t-p3-o0-1.parquet",
                "date=2026-11-30/hour=00/t-p3-o0-1.parquet"
            ]
        );
    }

    #[test]
    fn partitions_are_planned_separately_and_ranges_start_at_the_stored_offset() {
        let msgs = vec![
            msg(1, 7, Some(at(1, 0))),
            msg(0, 3, Some(at(1, 0))),
            msg(1, 5, Some(at(1, 0))), // below the stored offset: already archived
            msg(1, 9, Some(at(1, 5))),
        ];
        let starts = BTreeMap::from([(0, None), (1, Some(6))]);
        let plan = plan(&msgs, &starts);
        assert_eq!(
            ranges(&plan),
            vec![(0, 3, 3, Some(1), 1, 0), (1, 6, 9, Some(1), 2, 0)]
        );
        assert_eq!(plan.next_offsets, BTreeMap::from([(0, 4), (1, 10)]));
    }

    #[test]
    fn bad_messages_are_skipped_and_counted_once_per_range() {
        let msgs = vec![
            msg(0, 0, None),
            msg(0, 1, Some(at(3, 0))),
            msg(0, 2, None),
            msg(0, 3, Some(at(4, 0))),
        ];
        let plan = plan(&msgs, &BTreeMap::new());
        assert_eq!(
            ranges(&plan),
            vec![(0, 0, 3, Some(3), 1, 2), (0, 0, 3, Some(4), 1, 0)]
        );
        assert_eq!(plan.skipped.get("undecodable"), Some(&2));
    }

    #[test]
    fn a_range_of_only_bad_messages_has_no_file() {
        let plan = plan(
            &[msg(2, 40, None), msg(2, 41, None)],
            &BTreeMap::from([(2, Some(40))]),
        );
        assert_eq!(ranges(&plan), vec![(2, 40, 41, None, 0, 2)]);
        assert_eq!(plan.pieces[0].path("t"), None);
    }

    #[test]
    fn an_event_far_in_the_future_is_still_archived() {
        let far = Utc::now() + TimeDelta::days(30);
        let far = far.duration_trunc(TimeDelta::milliseconds(1)).unwrap();
        let plan = plan(&[msg(0, 0, Some(far))], &BTreeMap::new());
        assert_eq!(plan.rows(), 1);
    }

    #[test]
    fn resends_are_archived_as_they_came() {
        let e = event(at(5, 0));
        let msgs: Vec<RawMessage> = (0..3)
            .map(|o| RawMessage {
                decoded: None,
                partition: 0,
                offset: o,
                payload: e.to_json(),
            })
            .collect();
        let plan = plan(&msgs, &BTreeMap::new());
        let offsets: Vec<i64> = plan.pieces[0].rows.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![0, 1, 2]);
    }

    #[test]
    fn gaps_in_offsets_are_covered_by_the_range() {
        // Compacted or transactional topics skip offsets; the ranges still chain.
        let msgs = vec![msg(0, 12, Some(at(1, 0))), msg(0, 20, Some(at(1, 5)))];
        let plan = plan(&msgs, &BTreeMap::from([(0, Some(10))]));
        assert_eq!(ranges(&plan), vec![(0, 10, 20, Some(1), 2, 0)]);
    }
}
