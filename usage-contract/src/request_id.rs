//! Request ids: `req_` followed by a hyphenated UUIDv7.
//!
//! The id is the `X-Request-Id` clients see and the primary key of
//! `request_log`. Because a UUIDv7 starts with its creation time in
//! milliseconds, ids sort by time, and `request_log` is range-partitioned on
//! the id itself: every version of one request lands in the same partition,
//! whatever `started_at` a conflicting version claims.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, NaiveDate, TimeZone, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uuid::Uuid;

const PREFIX: &str = "req_";

/// A time-ordered request id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(Uuid);

/// Why a string is not a request id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("request_id {0:?} is not `req_` followed by a UUIDv7")]
pub struct InvalidRequestId(pub String);

impl RequestId {
    /// A new id stamped with the current time.
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }

    /// An id stamped with the given time (for replays, load generators and tests).
    pub fn at(at: DateTime<Utc>) -> Self {
        let ts = uuid::Timestamp::from_unix(
            uuid::NoContext,
            at.timestamp().max(0) as u64,
            at.timestamp_subsec_nanos(),
        );
        Self(Uuid::new_v7(ts))
    }

    /// The id of a request that may be sent again (`Idempotency-Key`): the
    /// same `seed` on the same UTC `day` always gives the same id, so a
    /// re-run that no shared store remembered is still one row in
    /// `request_log`. Its time is the start of `day` (the request sorts
    /// first in its day's partition); the other 74 bits come from `seed`.
    pub fn derived(day: NaiveDate, seed: &[u8]) -> Self {
        use sha2::{Digest, Sha256};
        let midnight = day.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc();
        let ms = midnight.timestamp_millis().max(0) as u64;
        let mut h = Sha256::new();
        h.update(day.to_string().as_bytes());
        h.update([0]);
        h.update(seed);
        let digest = h.finalize();
        let mut random = [0u8; 10];
        random.copy_from_slice(&digest[..10]);
        let uuid = uuid::Builder::from_unix_timestamp_millis(ms, &random).into_uuid();
        Self(uuid)
    }

    /// Wraps a UUID, which must be version 7.
    pub fn from_uuid(uuid: Uuid) -> Result<Self, InvalidRequestId> {
        if uuid.get_version_num() == 7 {
            Ok(Self(uuid))
        } else {
            Err(InvalidRequestId(uuid.to_string()))
        }
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }

    /// The creation time embedded in the id (millisecond precision).
    pub fn created_at(&self) -> DateTime<Utc> {
        let ms = uuid_v7_millis(&self.0);
        // A 48-bit millisecond count always fits chrono's range.
        Utc.timestamp_millis_opt(ms as i64)
            .single()
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// The UTC day whose `request_log` partition holds this id.
    pub fn day(&self) -> NaiveDate {
        self.created_at().date_naive()
    }

    /// The smallest UUID whose v7 time is `at` (a partition bound).
    pub fn lower_bound_at(at: DateTime<Utc>) -> Uuid {
        let ms = at.timestamp_millis().max(0) as u64;
        let mut bytes = [0u8; 16];
        bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
        Uuid::from_bytes(bytes)
    }
}

impl Default for RequestId {
    fn default() -> Self {
        Self::new()
    }
}

fn uuid_v7_millis(uuid: &Uuid) -> u64 {
    let b = uuid.as_bytes();
    let mut ms = [0u8; 8];
    ms[2..].copy_from_slice(&b[..6]);
    u64::from_be_bytes(ms)
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}", self.0.hyphenated())
    }
}

impl FromStr for RequestId {
    type Err = InvalidRequestId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let uuid = s
            .strip_prefix(PREFIX)
            .and_then(|rest| Uuid::try_parse(rest).ok())
            .ok_or_else(|| InvalidRequestId(s.to_owned()))?;
        Self::from_uuid(uuid).map_err(|_| InvalidRequestId(s.to_owned()))
    }
}

impl Serialize for RequestId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RequestId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_per_seed_and_day_and_live_in_that_day() {
        let day = NaiveDate::from_ymd_opt(2026, 12, 2).unwrap();
        let a = RequestId::derived(day, b"key\0idem\0body\0attempt 0");
        assert_eq!(a, RequestId::derived(day, b"key\0idem\0body\0attempt 0"));
        assert_ne!(a, RequestId::derived(day, b"key\0idem\0body\0attempt 1"));
        let next = day.succ_opt().unwrap();
        assert_ne!(a, RequestId::derived(next, b"key\0idem\0body\0attempt 0"));
        assert_eq!(a.day(), day);
        assert_eq!(a.as_uuid().get_version_num(), 7);
        assert_eq!(a.to_string().parse::<RequestId>().unwrap(), a);
    }

    #[test]
    fn display_parses_back() {
        let id = RequestId::new();
        let text = id.to_string();
        assert!(text.starts_with("req_"));
        assert_eq!(text.parse::<RequestId>().unwrap(), id);
    }

    #[test]
    fn rejects_other_uuid_versions_and_prefixes() {
        assert!("req_6ba7b810-9dad-41d1-80b4-00c04fd430c8"
            .parse::<RequestId>()
            .is_err());
        let v7 = Uuid::now_v7();
        assert!(v7.to_string().parse::<RequestId>().is_err());
        assert!(format!("id_{v7}").parse::<RequestId>().is_err());
    }

    #[test]
    fn ids_sort_by_time_and_fall_in_their_day() {
        let a = RequestId::new();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = RequestId::new();
        assert!(a < b);
        assert!((Utc::now() - a.created_at()).num_seconds().abs() < 5);
        let day_start = a.day().and_hms_opt(0, 0, 0).unwrap().and_utc();
        assert!(RequestId::lower_bound_at(day_start) <= a.as_uuid());
    }
}
