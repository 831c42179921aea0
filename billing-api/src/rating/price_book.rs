//! Price books: versioned, with an effective date, loadable from YAML and
//! stored in Postgres. A book holds per-model token rates (per 1M tokens),
//! per-priority GPU-hour rates, the off-peak window in a named IANA zone,
//! and the shared-overhead pool.
//!
//! Every amount is read from the text of its YAML scalar, quoted or not
//! (`rust_decimal::serde::str`), never through a float: an unquoted
//! `0.1234567890123456789` is that number, not the nearest `f64`. What a
//! book may hold is also stated as JSON Schema for the OpenAPI document
//! ([`super::price_book_schema`]).

use std::collections::BTreeMap;
use std::str::FromStr;

use chrono::{DateTime, DurationRound, NaiveDate, NaiveTime, TimeDelta, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::error::BillingError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriceBook {
    pub version: String,
    pub effective_from: NaiveDate,
    pub currency: String,
    /// IANA zone of the off-peak window and of the overhead pool's month.
    pub time_zone: String,
    pub token_rates: BTreeMap<String, TokenRates>,
    /// Priority ("1".."5") → price of one GPU-hour.
    #[serde(with = "exact_map")]
    pub gpu_hour_rates: BTreeMap<String, Decimal>,
    pub off_peak: OffPeak,
    pub overhead: Overhead,
}

/// Prices per 1M tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenRates {
    #[serde(with = "rust_decimal::serde::str")]
    pub input: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub cached_input: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub output: Decimal,
}

/// A daily window in the book's zone; `start > end` wraps past midnight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OffPeak {
    #[serde(with = "hh_mm")]
    pub start: NaiveTime,
    #[serde(with = "hh_mm")]
    pub end: NaiveTime,
    #[serde(with = "rust_decimal::serde::str")]
    pub discount_percent: Decimal,
}

/// The shared-overhead pool for a month.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "OverheadSpec", into = "OverheadSpec")]
pub enum Overhead {
    /// A fixed amount per month.
    FixedPerMonth(Decimal),
    /// Idle GPU-hours of the fleet in the month times this rate.
    IdleGpuHourRate(Decimal),
}

/// How a pool is written in YAML: exactly one of the two keys.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct OverheadSpec {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "rust_decimal::serde::str_option"
    )]
    fixed_per_month: Option<Decimal>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "rust_decimal::serde::str_option"
    )]
    idle_gpu_hour_rate: Option<Decimal>,
}

impl TryFrom<OverheadSpec> for Overhead {
    type Error = String;

    fn try_from(spec: OverheadSpec) -> Result<Self, String> {
        match (spec.fixed_per_month, spec.idle_gpu_hour_rate) {
            (Some(d), None) => Ok(Self::FixedPerMonth(d)),
            (None, Some(d)) => Ok(Self::IdleGpuHourRate(d)),
            _ => Err("overhead needs exactly one of fixedPerMonth or idleGpuHourRate".into()),
        }
    }
}

impl From<Overhead> for OverheadSpec {
    fn from(o: Overhead) -> Self {
        match o {
            Overhead::FixedPerMonth(d) => Self {
                fixed_per_month: Some(d),
                idle_gpu_hour_rate: None,
            },
            Overhead::IdleGpuHourRate(d) => Self {
                fixed_per_month: None,
                idle_gpu_hour_rate: Some(d),
            },
        }
    }
}

impl PriceBook {
    /// Parses and validates a YAML book, naming what is wrong.
    pub fn from_yaml(text: &str) -> Result<Self, BillingError> {
        let book: Self = serde_norway::from_str(text)
            .map_err(|e| BillingError::BadRequest(format!("price book: {e}")))?;
        book.validate()?;
        Ok(book)
    }

    pub fn validate(&self) -> Result<(), BillingError> {
        // Postgres refuses NUL in text and jsonb; name the field that holds one.
        let strings = [
            ("version", self.version.as_str()),
            ("currency", &self.currency),
            ("timeZone", &self.time_zone),
        ]
        .into_iter()
        .chain(
            self.token_rates
                .keys()
                .map(|m| ("tokenRates (a model name)", m.as_str())),
        )
        .chain(
            self.gpu_hour_rates
                .keys()
                .map(|p| ("gpuHourRates (a priority)", p.as_str())),
        );
        for (field, value) in strings {
            if value.contains('\0') {
                return Err(BillingError::BadRequest(format!(
                    "price book: {}",
                    serving::nul_message(field)
                )));
            }
        }
        let bad = |m: String| {
            Err(BillingError::BadRequest(format!(
                "price book {}: {m}",
                self.version
            )))
        };
        if chrono_tz::Tz::from_str(&self.time_zone).is_err() {
            return bad(format!(
                "timeZone {:?} is not an IANA zone name",
                self.time_zone
            ));
        }
        if self.currency.len() != 3 || !self.currency.chars().all(|c| c.is_ascii_uppercase()) {
            return bad(format!(
                "currency {:?} is not an ISO 4217 code",
                self.currency
            ));
        }
        if let Some(p) = self
            .gpu_hour_rates
            .keys()
            .find(|p| !matches!(p.as_str(), "1" | "2" | "3" | "4" | "5"))
        {
            return bad(format!(
                "gpuHourRates has priority {p:?}; priorities are 1 to 5"
            ));
        }
        for p in 1..=5 {
            match self.gpu_hour_rates.get(&p.to_string()) {
                Some(r) if !r.is_sign_negative() => {}
                _ => {
                    return bad(format!(
                        "gpuHourRates needs a non-negative rate for priority {p}"
                    ))
                }
            }
        }
        for (model, r) in &self.token_rates {
            if [r.input, r.cached_input, r.output]
                .iter()
                .any(|d| d.is_sign_negative())
            {
                return bad(format!("tokenRates.{model} has a negative rate"));
            }
        }
        let pct = self.off_peak.discount_percent;
        if pct.is_sign_negative() || pct > Decimal::ONE_HUNDRED {
            return bad(format!("offPeak.discountPercent {pct} is outside 0..100"));
        }
        let pool = match self.overhead {
            Overhead::FixedPerMonth(d) | Overhead::IdleGpuHourRate(d) => d,
        };
        if pool.is_sign_negative() {
            return bad("overhead must not be negative".into());
        }
        Ok(())
    }

    /// Whether the hour starting at `hour` is off-peak: its local start time
    /// in the book's zone is inside the window. Local time comes from the
    /// zone's rules, so 23- and 25-hour days need no special case.
    pub fn is_off_peak(&self, zone: chrono_tz::Tz, hour: DateTime<Utc>) -> bool {
        let t = hour.with_timezone(&zone).time();
        let (start, end) = (self.off_peak.start, self.off_peak.end);
        if start <= end {
            t >= start && t < end
        } else {
            t >= start || t < end
        }
    }

    /// Every off-peak UTC hour start in `[from, to)`.
    pub fn off_peak_hours(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<DateTime<Utc>>, BillingError> {
        let zone = chrono_tz::Tz::from_str(&self.time_zone).map_err(|_| {
            BillingError::Config(format!(
                "price book {}: bad zone {}",
                self.version, self.time_zone
            ))
        })?;
        let mut hour = from.duration_trunc(TimeDelta::hours(1)).unwrap_or(from);
        let mut out = Vec::new();
        while hour < to {
            if self.is_off_peak(zone, hour) {
                out.push(hour);
            }
            hour += TimeDelta::hours(1);
        }
        Ok(out)
    }

    pub fn gpu_hour_rate(&self, priority: i16) -> Decimal {
        self.gpu_hour_rates
            .get(&priority.to_string())
            .copied()
            .unwrap_or_default()
    }
}

/// A map of amounts, each read from its scalar's text (see the module docs).
mod exact_map {
    use std::collections::BTreeMap;

    use rust_decimal::Decimal;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Deserialize)]
    struct Exact(#[serde(with = "rust_decimal::serde::str")] Decimal);

    pub fn serialize<S: Serializer>(
        m: &BTreeMap<String, Decimal>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        m.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, Decimal>, D::Error> {
        let m = BTreeMap::<String, Exact>::deserialize(d)?;
        Ok(m.into_iter().map(|(k, Exact(v))| (k, v)).collect())
    }
}

mod hh_mm {
    use chrono::NaiveTime;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &NaiveTime, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&t.format("%H:%M"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<NaiveTime, D::Error> {
        let text = String::deserialize(d)?;
        NaiveTime::parse_from_str(&text, "%H:%M")
            .map_err(|e| serde::de::Error::custom(format!("{text:?} is not HH:MM: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFERENCE: &str = include_str!("../../../config/price-book.yaml");

    #[test]
    fn the_reference_book_loads() {
        let book = PriceBook::from_yaml(REFERENCE).unwrap();
        assert_eq!(book.gpu_hour_rate(1), Decimal::new(100, 2));
        assert_eq!(book.gpu_hour_rate(5), Decimal::new(350, 2));
        assert_eq!(book.off_peak.discount_percent, Decimal::from(30));
        assert_eq!(
            book.overhead,
            Overhead::FixedPerMonth(Decimal::new(280000, 2))
        );
    }

    #[test]
    fn a_nul_in_a_price_book_field_is_a_bad_request_naming_it() {
        for (from, to, field) in [
            ("version: ", "version: \"v\\0\"\n# ", "version"),
            ("llama-3.1-70b:", "\"llama\\0\":", "tokenRates"),
        ] {
            let text = REFERENCE.replacen(from, to, 1);
            assert_ne!(text, REFERENCE, "{from}");
            match PriceBook::from_yaml(&text) {
                Err(BillingError::BadRequest(m)) => {
                    assert!(m.contains(field) && m.contains("NUL"), "{m}")
                }
                other => panic!("{field}: {other:?}"),
            }
        }
    }

    #[test]
    fn off_peak_hours_follow_local_time_on_the_25_hour_day() {
        let book = PriceBook::from_yaml(REFERENCE).unwrap();
        // 2026-11-01 in New York: 25 local hours from 04:00Z to 05:00Z next day.
        let from = "2026-11-01T04:00:00Z".parse::<DateTime<Utc>>().unwrap();
        let to = "2026-11-02T05:00:00Z".parse::<DateTime<Utc>>().unwrap();
        let hours = book.off_peak_hours(from, to).unwrap();
        // 00:00, 01:00 (EDT), 01:00 (EST), 02..05, 22:00, 23:00 local.
        assert_eq!(hours.len(), 9);
        assert_eq!(hours[0], from);
    }

    #[test]
    fn unquoted_amounts_are_read_exactly_not_through_a_float() {
        let long = "0.1234567890123456789";
        let text = REFERENCE
            .replacen("input: \"0.60\"", &format!("input: {long}"), 1)
            .replacen("\"1\": \"1.00\"", &format!("\"1\": {long}"), 1)
            .replacen(
                "discountPercent: \"30\"",
                "discountPercent: 30.000000000000000001",
                1,
            )
            .replacen(
                "fixedPerMonth: \"2800.00\"",
                "fixedPerMonth: 2800.000000000000000001",
                1,
            );
        let book = PriceBook::from_yaml(&text).unwrap();
        let exact = |t: &str| Decimal::from_str(t).unwrap();
        assert_eq!(book.token_rates["llama-3.1-70b"].input, exact(long));
        assert_eq!(book.gpu_hour_rates["1"], exact(long));
        assert_eq!(
            book.off_peak.discount_percent,
            exact("30.000000000000000001")
        );
        assert_eq!(
            book.overhead,
            Overhead::FixedPerMonth(exact("2800.000000000000000001"))
        );
        // Stored as JSON and read back, unchanged.
        let json = serde_json::to_string(&book).unwrap();
        assert_eq!(serde_json::from_str::<PriceBook>(&json).unwrap(), book);
        // A scalar that is no decimal is still refused, naming the field.
        let err = PriceBook::from_yaml(&REFERENCE.replacen("input: \"0.60\"", "input: true", 1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("input"), "{err}");
    }

    #[test]
    fn a_bad_zone_is_named() {
        let text = REFERENCE.replace("America/New_York", "Mars/Olympus");
        let err = PriceBook::from_yaml(&text).unwrap_err().to_string();
        assert!(err.contains("Mars/Olympus"), "{err}");
    }
}
