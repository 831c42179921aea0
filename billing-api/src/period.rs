//! Billing periods: calendar months in a named time zone, as UTC instants.
//! A usage hour belongs to the period that contains its start.

use std::str::FromStr;

use chrono::{DateTime, Datelike, LocalResult, NaiveDate, TimeZone, Utc};
use chrono_tz::Tz;

use crate::error::BillingError;

/// A month, `YYYY-MM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Month {
    pub year: i32,
    pub month: u32,
}

impl Month {
    pub fn parse(text: &str) -> Result<Self, BillingError> {
        let bad = || BillingError::BadRequest(Self::format_error(text));
        if !crate::params::is_period(text) {
            return Err(bad());
        }
        let (y, m) = text.split_once('-').ok_or_else(bad)?;
        let (year, month) = (y.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
        Ok(Self { year, month })
    }

    fn format_error(text: &str) -> String {
        format!("period {text:?} must be YYYY-MM")
    }

    pub fn containing(at: DateTime<Utc>, tz: Tz) -> Self {
        let local = at.with_timezone(&tz);
        Self {
            year: local.year(),
            month: local.month(),
        }
    }

    pub fn next(self) -> Self {
        if self.month == 12 {
            Self {
                year: self.year + 1,
                month: 1,
            }
        } else {
            Self {
                year: self.year,
                month: self.month + 1,
            }
        }
    }

    pub fn prev(self) -> Self {
        if self.month == 1 {
            Self {
                year: self.year - 1,
                month: 12,
            }
        } else {
            Self {
                year: self.year,
                month: self.month - 1,
            }
        }
    }

    pub fn first_day(self) -> NaiveDate {
        NaiveDate::from_ymd_opt(self.year, self.month, 1).unwrap_or(NaiveDate::MIN)
    }

    /// The month as `[start, end)` in UTC, its edges at local midnight in `tz`.
    pub fn bounds(self, tz: Tz) -> (DateTime<Utc>, DateTime<Utc>) {
        (
            local_midnight(self.first_day(), tz),
            local_midnight(self.next().first_day(), tz),
        )
    }
}

impl<'de> serde::Deserialize<'de> for Month {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::parse(&s).map_err(|_| serde::de::Error::custom(Self::format_error(&s)))
    }
}

impl utoipa::PartialSchema for Month {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
        crate::params::pattern_schema(
            crate::params::PERIOD_PATTERN,
            "a month, YYYY-MM",
            crate::params::EXAMPLE_PERIOD,
        )
    }
}

impl utoipa::ToSchema for Month {}

impl std::fmt::Display for Month {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04}-{:02}", self.year, self.month)
    }
}

/// Local midnight of `day` in `tz`; where midnight does not exist (a DST
/// gap at 00:00), the first instant of the day that does.
pub fn local_midnight(day: NaiveDate, tz: Tz) -> DateTime<Utc> {
    for minutes in (0..=180).step_by(30) {
        let naive =
            day.and_hms_opt(0, 0, 0).unwrap_or_default() + chrono::Duration::minutes(minutes);
        match tz.from_local_datetime(&naive) {
            LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => return t.with_timezone(&Utc),
            LocalResult::None => continue,
        }
    }
    day.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc()
}

pub fn parse_zone(name: &str) -> Result<Tz, BillingError> {
    Tz::from_str(name)
        .map_err(|_| BillingError::BadRequest(format!("{name:?} is not an IANA time zone")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_start_at_local_midnight() {
        let ny = parse_zone("America/New_York").unwrap();
        let (start, end) = Month::parse("2026-11").unwrap().bounds(ny);
        assert_eq!(start.to_rfc3339(), "2026-11-01T04:00:00+00:00"); // EDT, UTC-4
        assert_eq!(end.to_rfc3339(), "2026-12-01T05:00:00+00:00"); // EST, UTC-5
                                                                   // November in New York has a 25-hour day: 30 × 24 + 1 hours.
        assert_eq!((end - start).num_hours(), 721);
    }

    #[test]
    fn bad_periods_are_named() {
        for bad in [
            "2026-13",
            "26-01",
            "2026/01",
            "2026-1",
            "+202-01",
            "2026-00",
            "2026-01\0",
        ] {
            assert!(Month::parse(bad).is_err(), "{bad}");
        }
    }
}
