//! The price book as JSON Schema, for the OpenAPI document's
//! `POST /v1/price-books` (a YAML body of this shape). It states what
//! [`PriceBook::validate`] and its deserializer check: every key, the
//! currency's three capitals, an IANA zone (chrono-tz's names, as an enum),
//! rates that are not negative, a discount from 0 to 100, `HH:MM` times,
//! exactly one overhead key, no NUL in a string. Amounts are given in their
//! canonical form: decimal text of at most 12 digits before the point and
//! 12 after it (the server reads any non-negative decimal, quoted or not).

use serde_json::{json, Value};
use utoipa::openapi::{RefOr, Schema};

use super::PriceBook;
use crate::params::TEXT_PATTERN;

/// A non-negative amount.
const AMOUNT_PATTERN: &str = "^[0-9]{1,12}(\\.[0-9]{1,12})?$";
/// A percentage from 0 to 100.
const PERCENT_PATTERN: &str = "^(100(\\.0{1,12})?|[0-9]{1,2}(\\.[0-9]{1,12})?)$";
/// A time of day, `HH:MM`.
const HH_MM_PATTERN: &str = "^([01][0-9]|2[0-3]):[0-5][0-9]$";

fn amount(description: &str) -> Value {
    json!({"type": "string", "pattern": AMOUNT_PATTERN, "description": description})
}

fn closed_object(required: &[&str], properties: Value) -> Value {
    json!({
        "type": "object",
        "required": required,
        "properties": properties,
        "additionalProperties": false,
    })
}

fn document() -> Value {
    let zones: Vec<&str> = chrono_tz::TZ_VARIANTS.iter().map(|z| z.name()).collect();
    let token_rates = closed_object(
        &["input", "cachedInput", "output"],
        json!({
            "input": amount("per 1M uncached input tokens"),
            "cachedInput": amount("per 1M cached input tokens"),
            "output": amount("per 1M output tokens"),
        }),
    );
    let priorities = ["1", "2", "3", "4", "5"];
    let gpu_hour_rates: serde_json::Map<String, Value> = priorities
        .iter()
        .map(|p| ((*p).to_owned(), amount("one GPU-hour at this priority")))
        .collect();
    let overhead =
        |key: &str, description: &str| closed_object(&[key], json!({ key: amount(description) }));
    json!({
        "type": "object",
        "description": "A price book (config/price-book.yaml is the reference). Amounts are decimal text; the book of the same version is replaced, and two books may not take effect on the same day (409).",
        "required": ["version", "effectiveFrom", "currency", "timeZone", "tokenRates", "gpuHourRates", "offPeak", "overhead"],
        "additionalProperties": false,
        "properties": {
            "version": {"type": "string", "pattern": TEXT_PATTERN},
            "effectiveFrom": {"type": "string", "format": "date", "description": "the first day it prices (the book in effect on a month's first day prices that month)"},
            "currency": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "ISO 4217"},
            "timeZone": {"type": "string", "enum": zones, "description": "the IANA zone of the off-peak window and of the overhead pool's month"},
            "tokenRates": {
                "type": "object",
                "description": "model → its rates",
                "propertyNames": {"type": "string", "pattern": TEXT_PATTERN},
                "additionalProperties": token_rates,
            },
            "gpuHourRates": {
                "type": "object",
                "required": priorities,
                "properties": gpu_hour_rates,
                "additionalProperties": false,
            },
            "offPeak": closed_object(
                &["start", "end", "discountPercent"],
                json!({
                    "start": {"type": "string", "pattern": HH_MM_PATTERN},
                    "end": {"type": "string", "pattern": HH_MM_PATTERN, "description": "before start: the window wraps past midnight"},
                    "discountPercent": {"type": "string", "pattern": PERCENT_PATTERN},
                }),
            ),
            "overhead": {
                "oneOf": [
                    overhead("fixedPerMonth", "a fixed pool per month"),
                    overhead("idleGpuHourRate", "per idle GPU-hour of the fleet in the month"),
                ],
            },
        },
    })
}

impl utoipa::PartialSchema for PriceBook {
    fn schema() -> RefOr<Schema> {
        #[expect(
            clippy::expect_used,
            reason = "a constant schema, which the OpenAPI tests read"
        )]
        serde_json::from_value(document()).expect("a valid schema")
    }
}

impl utoipa::ToSchema for PriceBook {}

#[cfg(test)]
mod tests {
    use super::*;

    const REFERENCE: &str = include_str!("../../../config/price-book.yaml");

    /// The reference book, as the server stores it, has the documented
    /// shape; and the patterns admit only what the server reads.
    #[test]
    fn the_reference_book_fits_the_schema() {
        let book = PriceBook::from_yaml(REFERENCE).unwrap();
        let value = serde_json::to_value(&book).unwrap();
        let doc = document();
        let props = doc["properties"].as_object().unwrap();
        let keys: Vec<&String> = value.as_object().unwrap().keys().collect();
        assert_eq!(keys, props.keys().collect::<Vec<_>>());
        assert!(doc["properties"]["timeZone"]["enum"]
            .as_array()
            .unwrap()
            .contains(&json!(book.time_zone)));
        let amount = regex::Regex::new(AMOUNT_PATTERN).unwrap();
        for rate in book.gpu_hour_rates.values() {
            assert!(amount.is_match(&rate.to_string()), "{rate}");
        }
        let percent = regex::Regex::new(PERCENT_PATTERN).unwrap();
        for ok in ["0", "30", "99.5", "100", "100.000"] {
            assert!(percent.is_match(ok), "{ok}");
        }
        for bad in ["100.5", "101", "-1", "1e2"] {
            assert!(!percent.is_match(bad), "{bad}");
        }
    }
}
