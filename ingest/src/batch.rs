//! What a batch of raw messages means, before any database is involved:
//! which messages are events, which are dead letters, which repeat an id
//! seen earlier in the same batch, and how the counted events add up per
//! hour. Pure functions, so the rules are unit- and property-tested.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use rust_decimal::Decimal;
use usage_contract::{decode, FinishReason, UsageEvent, Violation};
use uuid::Uuid;

/// One message as read from the topic.
#[derive(Debug, Clone)]
pub struct RawMessage {
    pub partition: i32,
    pub offset: i64,
    pub payload: Vec<u8>,
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
    /// For conflicts: the version already stored, as JSON.
    pub stored_version: Option<serde_json::Value>,
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
    /// Per partition: the offset after the last message in the batch.
    pub next_offsets: BTreeMap<i32, i64>,
}

impl Decoded {
    pub fn len(&self) -> usize {
        self.firsts.len() + self.repeats.len() + self.rejected.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Decodes and validates every message against the clock `now`.
pub fn split(messages: &[RawMessage], now: DateTime<Utc>) -> Decoded {
    let mut out = Decoded::default();
    let mut seen: HashSet<Uuid> = HashSet::with_capacity(messages.len());
    for m in messages {
        let next = out.next_offsets.entry(m.partition).or_insert(m.offset + 1);
        *next = (*next).max(m.offset + 1);
        match decode(&m.payload, now) {
            Ok(event) => {
                let candidate = Candidate {
                    hash: event.content_hash(),
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
    /// Nothing was stored: this version is now the stored one.
    Inserted,
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

/// What a set of requests adds to one usage_hourly row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HourTotals {
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    pub gpu_seconds: Decimal,
    pub preempted_gpu_seconds: Decimal,
    pub cancelled_requests: i64,
    pub errored_requests: i64,
}

impl HourTotals {
    pub fn add(&mut self, e: &UsageEvent) {
        self.requests += 1;
        self.prompt_tokens += e.prompt_tokens;
        self.cached_tokens += e.cached_tokens;
        self.completion_tokens += e.completion_tokens;
        self.gpu_seconds += e.gpu_seconds;
        self.preempted_gpu_seconds += e.preempted_gpu_seconds;
        self.cancelled_requests += i64::from(e.finish_reason == FinishReason::Cancelled);
        self.errored_requests += i64::from(e.finish_reason == FinishReason::Error);
    }
}

/// The UTC hour an event is counted in.
pub fn hour_of(e: &UsageEvent) -> DateTime<Utc> {
    // Truncating a valid UTC time to the hour cannot overflow.
    e.started_at
        .duration_trunc(TimeDelta::hours(1))
        .unwrap_or(e.started_at)
}

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
