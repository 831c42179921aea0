//! What a batch of raw messages means, before any database is involved:
//! which messages are events (or replica reports), which are dead letters,
//! which repeat an id seen earlier in the same batch, and how the counted
//! events add up per hour. Pure functions, so the rules are unit- and property-tested.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use usage_contract::{decode_record, Record, ReplicaReport, UsageEvent, Violation};
use uuid::Uuid;

/// One message as read from the topic.
#[derive(Debug, Clone)]
pub struct RawMessage {
    pub partition: i32,
    pub offset: i64,
    pub payload: Vec<u8>,
    /// The payload already decoded (by the consumer thread, while the
    /// batcher waits on Postgres); `None`: decode it in [`split`].
    pub decoded: Option<Prepared>,
}

/// A decoded message: the valid event and its content hash, a valid
/// replica report, or why not.
pub type Prepared = Result<Parsed, Violation>;

/// A message that kept the contract.
#[derive(Debug, Clone)]
pub enum Parsed {
    Usage(UsageEvent, [u8; 32]),
    Replica(ReplicaReport),
}

/// Decodes and validates one payload against the clock `now`.
pub fn prepare(payload: &[u8], now: DateTime<Utc>) -> Prepared {
    decode_record(payload, now).map(|record| match record {
        Record::Usage(event) => {
            let hash = event.content_hash();
            Parsed::Usage(event, hash)
        }
        Record::Replica(report) => Parsed::Replica(report),
    })
}

/// A valid replica report and where it came from.
#[derive(Debug, Clone)]
pub struct ReportCandidate {
    pub report: ReplicaReport,
    pub partition: i32,
    pub offset: i64,
    pub raw: Vec<u8>,
}

/// A decoded, valid event and where it came from.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub event: UsageEvent,
    pub hash: [u8; 32],
    pub partition: i32,
    pub offset: i64,
}

/// A message that will not be counted, and why.
#[derive(Debug, Clone)]
pub struct Rejected {
    pub partition: i32,
    pub offset: i64,
    pub raw: Vec<u8>,
    pub violation: Violation,
    pub request_id: Option<Uuid>,
    pub tenant_id: Option<String>,
    /// For conflicts: the version already stored, as the contract's
    /// canonical JSON ([`UsageEvent::to_json`]).
    pub stored_version: Option<String>,
}

/// A batch split into what to insert, what repeats within the batch, and
/// what is already known to be bad.
#[derive(Debug, Default)]
pub struct Decoded {
    /// The first occurrence of each request id in the batch.
    pub firsts: Vec<Candidate>,
    /// Later occurrences of an id already in `firsts`.
    pub repeats: Vec<Candidate>,
    pub rejected: Vec<Rejected>,
    /// Replica reports (idle and dedicated GPU time), stored by report id.
    pub reports: Vec<ReportCandidate>,
    /// Per partition: the offset after the last message in the batch.
    pub next_offsets: BTreeMap<i32, i64>,
}

impl Decoded {
    pub fn len(&self) -> usize {
        self.firsts.len() + self.repeats.len() + self.rejected.len() + self.reports.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Decodes and validates every message against the clock `now`.
pub fn split(messages: &[RawMessage], now: DateTime<Utc>) -> Decoded {
    split_with(messages.iter().map(|m| (m, None)), messages.len(), now)
}

/// [`split`], taking the decodings the consumer thread prepared (a message
/// split again, after a failed commit, is decoded afresh).
pub fn split_prepared(messages: &mut [RawMessage], now: DateTime<Utc>) -> Decoded {
    let n = messages.len();
    split_with(
        messages.iter_mut().map(|m| {
            let prepared = m.decoded.take();
            (&*m, prepared)
        }),
        n,
        now,
    )
}

fn split_with<'a>(
    messages: impl Iterator<Item = (&'a RawMessage, Option<Prepared>)>,
    n: usize,
    now: DateTime<Utc>,
) -> Decoded {
    let mut out = Decoded::default();
    let mut seen: HashSet<Uuid> = HashSet::with_capacity(n);
    for (m, prepared) in messages {
        let next = out.next_offsets.entry(m.partition).or_insert(m.offset + 1);
        *next = (*next).max(m.offset + 1);
        match prepared.unwrap_or_else(|| prepare(&m.payload, now)) {
            Ok(Parsed::Replica(report)) => out.reports.push(ReportCandidate {
                report,
                partition: m.partition,
                offset: m.offset,
                raw: m.payload.clone(),
            }),
            Ok(Parsed::Usage(event, hash)) => {
                let candidate = Candidate {
                    hash,
                    event,
                    partition: m.partition,
                    offset: m.offset,
                };
                let id = candidate.event.request_id.as_uuid();
                if seen.insert(id) {
                    out.firsts.push(candidate);
                } else {
                    out.repeats.push(candidate);
                }
            }
            Err(violation) => out.rejected.push(Rejected {
                partition: m.partition,
                offset: m.offset,
                raw: m.payload.clone(),
                violation,
                request_id: None,
                tenant_id: None,
                stored_version: None,
            }),
        }
    }
    out
}

/// How a candidate compares with the version stored under its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Same id, same content: skip it, count it as a duplicate.
    Duplicate,
    /// Same id, other content: dead-letter it with both versions.
    Conflict,
}

/// The rule for an id that is already stored.
pub fn compare(stored_hash: &[u8], candidate_hash: &[u8; 32]) -> Verdict {
    if stored_hash == candidate_hash.as_slice() {
        Verdict::Duplicate
    } else {
        Verdict::Conflict
    }
}

/// The rollup key: tenant, model, priority and the UTC hour the request started in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HourKey {
    pub tenant_id: String,
    pub model: String,
    pub priority: i16,
    pub hour: DateTime<Utc>,
}

pub use usage_contract::hourly::{hour_of, HourTotals};

/// Adds events up per hour key: one upsert per key instead of one per event.
/// Keys borrow from the events while adding, so the loop allocates only once
/// per key, not once per event.
pub fn aggregate<'a>(
    events: impl IntoIterator<Item = &'a UsageEvent>,
) -> BTreeMap<HourKey, HourTotals> {
    let mut sums: HashMap<(&'a str, &'a str, i16, DateTime<Utc>), HourTotals> = HashMap::new();
    for e in events {
        sums.entry((&e.tenant_id, &e.model, e.priority, hour_of(e)))
            .or_default()
            .add(e);
    }
    sums.into_iter()
        .map(|((tenant_id, model, priority, hour), totals)| {
            let key = HourKey {
                tenant_id: tenant_id.to_owned(),
                model: model.to_owned(),
                priority,
                hour,
            };
            (key, totals)
        })
        .collect()
}

/// The per-key rollup's key: tenant, API key, model, priority, UTC hour.
pub type KeyHour = (String, String, String, i16, DateTime<Utc>);

/// Adds events up per API key and hour, in key order.
pub fn aggregate_by_key<'a>(
    events: impl IntoIterator<Item = &'a UsageEvent>,
) -> BTreeMap<KeyHour, HourTotals> {
    let mut sums: HashMap<(&'a str, &'a str, &'a str, i16, DateTime<Utc>), HourTotals> =
        HashMap::new();
    for e in events {
        sums.entry((
            &e.tenant_id,
            &e.api_key_id,
            &e.model,
            e.priority,
            hour_of(e),
        ))
        .or_default()
        .add(e);
    }
    sums.into_iter()
        .map(|((t, k, m, p, h), totals)| ((t.to_owned(), k.to_owned(), m.to_owned(), p, h), totals))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;
    use rust_decimal::Decimal;
    use usage_contract::{FinishReason, RequestId};

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap()
    }

    fn event(tenant: &str, minute: u32, completion: i64, reason: FinishReason) -> UsageEvent {
        let started = Utc.with_ymd_and_hms(2026, 11, 29, 10, minute, 0).unwrap();
        UsageEvent {
            schema_version: 1,
            request_id: RequestId::at(started),
            tenant_id: tenant.into(),
            api_key_id: "k".into(),
            model: "m".into(),
            model_version: "v".into(),
            priority: 3,
            started_at: started,
            first_token_at: None,
            finished_at: started,
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: completion,
            gpu_seconds: Decimal::new(1_500_001, 6),
            preempted_gpu_seconds: Decimal::ZERO,
            finish_reason: reason,
            ttft_ms: None,
            tpot_ms: None,
            replica_id: "r".into(),
            gateway_id: "g".into(),
            stream: false,
            placement: None,
        }
    }

    fn raw(partition: i32, offset: i64, payload: Vec<u8>) -> RawMessage {
        RawMessage {
            decoded: None,
            partition,
            offset,
            payload,
        }
    }

    #[test]
    fn repeats_in_one_batch_are_kept_apart_from_first_occurrences() {
        let a = event("t", 1, 5, FinishReason::Stop);
        let mut conflicting = a.clone();
        conflicting.completion_tokens = 6;
        let msgs = vec![
            raw(0, 10, a.to_json()),
            raw(0, 11, a.to_json()),
            raw(1, 7, conflicting.to_json()),
            raw(1, 8, b"junk".to_vec()),
        ];
        let d = split(&msgs, now());
        assert_eq!(d.firsts.len(), 1);
        assert_eq!(d.repeats.len(), 2);
        assert_eq!(d.rejected.len(), 1);
        assert_eq!(d.rejected[0].violation.code(), "undecodable");
        assert_eq!((d.rejected[0].partition, d.rejected[0].offset), (1, 8));
        assert_eq!(d.next_offsets, BTreeMap::from([(0, 12), (1, 9)]));
        assert_eq!(
            compare(&d.firsts[0].hash, &d.repeats[0].hash),
            Verdict::Duplicate
        );
        assert_eq!(
            compare(&d.firsts[0].hash, &d.repeats[1].hash),
            Verdict::Conflict
        );
    }

    #[test]
    fn prepared_decodings_split_exactly_like_fresh_ones() {
        let a = event("t", 1, 5, FinishReason::Stop);
        let mut b = a.clone();
        b.completion_tokens = 6;
        let payloads = [a.to_json(), a.to_json(), b.to_json(), b"junk".to_vec()];
        let fresh: Vec<RawMessage> = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| raw(i as i32 % 2, i as i64, p.clone()))
            .collect();
        let mut prepared = fresh.clone();
        for m in &mut prepared {
            m.decoded = Some(prepare(&m.payload, now()));
        }
        let shape = |d: &Decoded| {
            (
                d.firsts
                    .iter()
                    .map(|c| (c.offset, c.hash))
                    .collect::<Vec<_>>(),
                d.repeats
                    .iter()
                    .map(|c| (c.offset, c.hash))
                    .collect::<Vec<_>>(),
                d.rejected
                    .iter()
                    .map(|r| (r.offset, r.violation.code()))
                    .collect::<Vec<_>>(),
                d.next_offsets.clone(),
            )
        };
        let expected = shape(&split(&fresh, now()));
        assert_eq!(shape(&split_prepared(&mut prepared, now())), expected);
        // Taken once: a retry decodes afresh, with the same result.
        assert!(prepared.iter().all(|m| m.decoded.is_none()));
        assert_eq!(shape(&split_prepared(&mut prepared, now())), expected);
    }

    #[test]
    fn hour_is_the_utc_hour_the_request_started_in() {
        let e = event("t", 59, 1, FinishReason::Stop);
        assert_eq!(
            hour_of(&e),
            Utc.with_ymd_and_hms(2026, 11, 29, 10, 0, 0).unwrap()
        );
    }

    #[test]
    fn cancelled_and_errored_requests_are_counted_apart() {
        let events = [
            event("t", 1, 1, FinishReason::Cancelled),
            event("t", 2, 1, FinishReason::Error),
            event("t", 3, 1, FinishReason::Length),
        ];
        let sums = aggregate(events.iter());
        let t = sums.values().next().unwrap();
        assert_eq!(
            (t.requests, t.cancelled_requests, t.errored_requests),
            (3, 1, 1)
        );
    }

    proptest! {
        /// Aggregating loses and invents nothing: per key, and in total, the
        /// sums equal the plain sums over the events (decimals exactly).
        #[test]
        fn aggregation_conserves_every_count(
            spec in proptest::collection::vec((0usize..3, 0u32..60, 0i64..5000, 0usize..4), 0..200)
        ) {
            let tenants = ["a", "b", "c"];
            let reasons = [FinishReason::Stop, FinishReason::Length, FinishReason::Cancelled, FinishReason::Error];
            let events: Vec<UsageEvent> = spec
                .iter()
                .map(|&(t, m, c, r)| event(tenants[t], m, c, reasons[r]))
                .collect();
            let sums = aggregate(events.iter());
            let total_requests: i64 = sums.values().map(|t| t.requests).sum();
            let total_completion: i64 = sums.values().map(|t| t.completion_tokens).sum();
            let total_gpu: Decimal = sums.values().map(|t| t.gpu_seconds).sum();
            prop_assert_eq!(total_requests, events.len() as i64);
            prop_assert_eq!(total_completion, events.iter().map(|e| e.completion_tokens).sum::<i64>());
            prop_assert_eq!(total_gpu, events.iter().map(|e| e.gpu_seconds).sum::<Decimal>());
            for (key, t) in &sums {
                let mine: Vec<&UsageEvent> = events.iter().filter(|e| e.tenant_id == key.tenant_id).collect();
                prop_assert_eq!(t.requests, mine.len() as i64);
                prop_assert_eq!(t.cached_tokens, mine.iter().map(|e| e.cached_tokens).sum::<i64>());
            }
        }

        /// The duplicate/conflict rule: equal content is a duplicate, any
        /// change to a counted field is a conflict.
        #[test]
        fn any_changed_field_is_a_conflict(delta in 1i64..1000, field in 0usize..4) {
            let a = event("t", 5, 100, FinishReason::Stop);
            let mut b = a.clone();
            match field {
                0 => b.completion_tokens += delta,
                1 => b.prompt_tokens += delta,
                2 => b.gpu_seconds += Decimal::new(delta, 6),
                _ => b.tenant_id = format!("t{delta}"),
            }
            prop_assert_eq!(compare(&a.content_hash(), &a.clone().content_hash()), Verdict::Duplicate);
            prop_assert_eq!(compare(&a.content_hash(), &b.content_hash()), Verdict::Conflict);
        }
    }
}
