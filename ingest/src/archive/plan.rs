//! How a batch of raw messages becomes archive pieces. Pure: no I/O, so the
//! rules are unit-tested.
//!
//! Per partition, messages are taken in offset order and cut into *runs*:
//! a new run starts whenever a valid event's UTC hour (of `started_at`)
//! differs from the run's. A run covers a contiguous offset range, from the
//! offset after the previous run (the stored archive offset, for the first
//! one) to just before the next run, so the ranges of a partition follow
//! each other with no gap and no overlap. Messages that do not decode or
//! break the contract's rules are counted in the run they fall in (as
//! `skipped`) and not written: ingest already keeps them in its dead
//! letters. A run with at least one valid event becomes one Parquet file,
//! `date=YYYY-MM-DD/hour=HH/<topic>-p<partition>-o<first>-<last>.parquet`;
//! a run of only skipped messages becomes a manifest row without a file.
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

/// One contiguous offset range of one partition, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub partition: i32,
    pub first_offset: i64,
    /// Inclusive.
    pub last_offset: i64,
    /// The UTC hour every row started in; `None` for a range without rows.
    pub hour: Option<DateTime<Utc>>,
    pub rows: Vec<ArchivedEvent>,
    /// Messages in the range that were not archived (undecodable or invalid).
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
        let mut current = Piece {
            partition,
            first_offset: start.unwrap_or(first.offset),
            last_offset: 0,
            hour: None,
            rows: Vec::new(),
            skipped: 0,
        };
        for m in &msgs {
            match decode(&m.payload, clock) {
                Ok(event) => {
                    let hour = hour_of(event.started_at);
                    match current.hour {
                        None => current.hour = Some(hour),
                        Some(h) if h == hour => {}
                        Some(_) => {
                            let next = Piece {
                                partition,
                                first_offset: m.offset,
                                last_offset: 0,
                                hour: Some(hour),
                                rows: Vec::new(),
                                skipped: 0,
                            };
                            let mut done = std::mem::replace(&mut current, next);
                            done.last_offset = m.offset - 1;
                            out.pieces.push(done);
                        }
                    }
                    current.rows.push(ArchivedEvent {
                        partition,
                        offset: m.offset,
                        event,
                    });
                }
                Err(violation) => {
                    current.skipped += 1;
                    *out.skipped.entry(violation.code()).or_default() += 1;
                }
            }
        }
        current.last_offset = last.offset;
        out.pieces.push(current);
        out.next_offsets.insert(partition, last.offset + 1);
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
    fn a_batch_is_cut_where_the_hour_changes_in_offset_order() {
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
            vec![
                (0, 10, 11, Some(9), 2, 0),
                (0, 12, 13, Some(10), 2, 0),
                (0, 14, 14, Some(9), 1, 0),
            ]
        );
        assert_eq!(plan.next_offsets, BTreeMap::from([(0, 15)]));
        assert_eq!(
            plan.pieces[0].path("usage.events.v1").as_deref(),
            Some("date=2026-11-29/hour=09/usage.events.v1-p0-o10-11.parquet")
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
    fn bad_messages_are_skipped_inside_the_range_they_fall_in() {
        let msgs = vec![
            msg(0, 0, None),
            msg(0, 1, Some(at(3, 0))),
            msg(0, 2, None),
            msg(0, 3, Some(at(4, 0))),
        ];
        let plan = plan(&msgs, &BTreeMap::new());
        assert_eq!(
            ranges(&plan),
            vec![(0, 0, 2, Some(3), 1, 2), (0, 3, 3, Some(4), 1, 0)]
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
    fn gaps_in_offsets_are_covered_by_the_ranges() {
        // Compacted or transactional topics skip offsets; the ranges still chain.
        let msgs = vec![msg(0, 12, Some(at(1, 0))), msg(0, 20, Some(at(2, 0)))];
        let plan = plan(&msgs, &BTreeMap::from([(0, Some(10))]));
        assert_eq!(
            ranges(&plan),
            vec![(0, 10, 19, Some(1), 1, 0), (0, 20, 20, Some(2), 1, 0)]
        );
    }
}
