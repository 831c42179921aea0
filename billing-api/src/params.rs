//! The formats of the API's parameters. Each pattern here both validates
//! its parameter and describes it in the OpenAPI document, so what the
//! document promises is what the server accepts.

use std::sync::LazyLock;

use regex::Regex;
use rust_decimal::Decimal;
use serde::{Deserialize, Deserializer};
use utoipa::openapi::schema::{ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};
use uuid::Uuid;

/// A tenant id, as the `tenants.tenant_id` CHECK constraint has it.
pub const TENANT_PATTERN: &str = "^[a-z0-9][a-z0-9_-]{0,62}$";
/// A billing month, `YYYY-MM`.
pub const PERIOD_PATTERN: &str = "^[0-9]{4}-(0[1-9]|1[0-2])$";
/// `req_` and a UUIDv7, lower case and hyphenated: the `X-Request-Id` the
/// gateway gives out.
pub const REQUEST_ID_PATTERN: &str =
    "^req_[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$";
/// The documents' examples (a reference tenant, a month, a request in it).
pub const EXAMPLE_TENANT: &str = "acme-corp";
pub const EXAMPLE_PERIOD: &str = "2026-11";
pub const EXAMPLE_REQUEST_ID: &str = "req_01a1e4df-4580-7a3c-9d2e-4f6a8b0c1d2e";

/// A share from 0 to 1 as a decimal string.
pub const SHARE_PATTERN: &str = "^(0(\\.[0-9]{1,9})?|1(\\.0{1,9})?)$";
/// Text without NUL (Postgres refuses it in `text`).
pub const TEXT_PATTERN: &str = "^[^\\u0000]*$";
/// Text without NUL that is not only white space.
pub const NOT_BLANK_PATTERN: &str = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$";

fn compile(pattern: &str) -> Regex {
    #[expect(
        clippy::expect_used,
        reason = "constant patterns, each compiled by a test"
    )]
    Regex::new(pattern).expect("a valid pattern")
}

static TENANT: LazyLock<Regex> = LazyLock::new(|| compile(TENANT_PATTERN));
static PERIOD: LazyLock<Regex> = LazyLock::new(|| compile(PERIOD_PATTERN));
static REQUEST_ID: LazyLock<Regex> = LazyLock::new(|| compile(REQUEST_ID_PATTERN));
static SHARE: LazyLock<Regex> = LazyLock::new(|| compile(SHARE_PATTERN));

/// Whether `text` is a billing month (`YYYY-MM`).
pub fn is_period(text: &str) -> bool {
    PERIOD.is_match(text)
}

/// A string schema with a pattern and an example, for the OpenAPI document.
pub fn pattern_schema(pattern: &str, description: &str, example: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern))
        .description(Some(description))
        .examples([serde_json::Value::from(example)])
        .into()
}

/// A string without NUL that is not only white space, described.
pub fn not_blank_schema(description: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(NOT_BLANK_PATTERN))
        .description(Some(description))
        .into()
}

/// A tenant id from a path or a query (a cursor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantId(String);

impl TenantId {
    pub fn parse(text: &str) -> Result<Self, String> {
        if TENANT.is_match(text) {
            Ok(Self(text.to_owned()))
        } else {
            Err(format!("tenant id {text:?} must match {TENANT_PATTERN}"))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl<'de> Deserialize<'de> for TenantId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl utoipa::PartialSchema for TenantId {
    fn schema() -> RefOr<Schema> {
        pattern_schema(TENANT_PATTERN, "a tenant id", EXAMPLE_TENANT)
    }
}

impl utoipa::ToSchema for TenantId {}

/// A request id (`req_` + UUIDv7) from a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestId(pub Uuid);

impl RequestId {
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || {
            format!("request id {text:?} must be req_ followed by a UUIDv7 ({REQUEST_ID_PATTERN})")
        };
        if !REQUEST_ID.is_match(text) {
            return Err(bad());
        }
        let uuid = text
            .strip_prefix("req_")
            .and_then(|u| Uuid::try_parse(u).ok())
            .ok_or_else(bad)?;
        Ok(Self(uuid))
    }
}

impl<'de> Deserialize<'de> for RequestId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl utoipa::PartialSchema for RequestId {
    fn schema() -> RefOr<Schema> {
        pattern_schema(
            REQUEST_ID_PATTERN,
            "the request's X-Request-Id: req_ and a UUIDv7",
            EXAMPLE_REQUEST_ID,
        )
    }
}

impl utoipa::ToSchema for RequestId {}

/// A share from 0 to 1, as a decimal string (`0.25`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share(pub Decimal);

impl<'de> Deserialize<'de> for Share {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let bad = || {
            serde::de::Error::custom(format!(
                "{s:?} must be a decimal from 0 to 1 ({SHARE_PATTERN})"
            ))
        };
        if !SHARE.is_match(&s) {
            return Err(bad());
        }
        s.parse().map(Self).map_err(|_| bad())
    }
}

impl utoipa::PartialSchema for Share {
    fn schema() -> RefOr<Schema> {
        pattern_schema(SHARE_PATTERN, "a decimal from 0 to 1", "0.25")
    }
}

impl utoipa::ToSchema for Share {}

/// A time in RFC 3339 (`2026-11-01T00:00:00Z`), kept as given until the
/// handler names it in an error.
pub fn date_time_schema(description: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::DateTime,
        )))
        .description(Some(description))
        .into()
}

/// How `GET /v1/invoices` answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum InvoiceFormat {
    #[default]
    Json,
    Csv,
}

/// How `GET /v1/exports/focus` answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FocusFormat {
    #[default]
    Csv,
    Parquet,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pattern_compiles() {
        for p in [
            TENANT_PATTERN,
            PERIOD_PATTERN,
            REQUEST_ID_PATTERN,
            SHARE_PATTERN,
            TEXT_PATTERN,
            NOT_BLANK_PATTERN,
        ] {
            assert!(Regex::new(p).is_ok(), "{p}");
        }
    }

    #[test]
    fn text_patterns_refuse_nul_and_blank() {
        let text = Regex::new(TEXT_PATTERN).unwrap();
        let not_blank = Regex::new(NOT_BLANK_PATTERN).unwrap();
        assert!(text.is_match("") && text.is_match("any text") && !text.is_match("a\0b"));
        for ok in ["x", " wrong rate\n", "é"] {
            assert!(not_blank.is_match(ok), "{ok:?}");
        }
        for bad in ["", " \t\n", "\0", "why\0"] {
            assert!(!not_blank.is_match(bad), "{bad:?}");
        }
    }

    #[test]
    fn tenant_ids_follow_the_database_constraint() {
        for ok in ["acme-corp", "p1-team", "a", "x_9"] {
            assert!(TenantId::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Acme", "-lead", "a\0b", "a/b", &"a".repeat(64)] {
            assert!(TenantId::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_examples_keep_their_formats() {
        assert!(TenantId::parse(EXAMPLE_TENANT).is_ok());
        assert!(is_period(EXAMPLE_PERIOD));
        assert!(RequestId::parse(EXAMPLE_REQUEST_ID).is_ok());
    }

    #[test]
    fn request_ids_are_req_and_a_lower_case_uuid_v7() {
        let v7 = Uuid::now_v7();
        assert_eq!(RequestId::parse(&format!("req_{v7}")).unwrap().0, v7);
        for bad in [
            v7.to_string(),
            format!("req_{}", v7.simple()),
            format!("req_{}", v7.to_string().to_uppercase()),
            "req_6ba7b810-9dad-41d1-80b4-00c04fd430c8".to_owned(),
            "req_not-an-id".to_owned(),
        ] {
            assert!(RequestId::parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn shares_are_decimals_from_zero_to_one() {
        let share = |s: &str| serde_json::from_value::<Share>(serde_json::json!(s));
        assert_eq!(share("0.25").unwrap().0, Decimal::new(25, 2));
        assert_eq!(share("1").unwrap().0, Decimal::ONE);
        for bad in ["1.5", "-0.1", ".5", "1e-1", "0.", "2"] {
            assert!(share(bad).is_err(), "{bad}");
        }
    }
}
