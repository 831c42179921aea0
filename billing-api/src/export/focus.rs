//! The FOCUS (FinOps Open Cost and Usage Specification) 1.2
//! cost-and-usage dataset, one row per invoice line, as CSV or Parquet,
//! both written from the same typed rows and columns. `tests/tests/focus_conformance.rs` runs the FinOps
//! Foundation's validator (focus-validator 2.2.1, FOCUS 1.2 rules) on both.
//!
//! How Meterline maps onto FOCUS:
//! - each tenant is its own billing account (id and display name) and its
//!   one sub account: a tenant's month runs from midnight in its own time
//!   zone, so an account never spans two billing periods;
//! - date-times are UTC, to the second, ending in `Z`; a missing value is a
//!   null (an empty CSV field, a Parquet null), never an empty string or a
//!   placeholder 0;
//! - usage rows (and the overhead share, one `Month`) carry ListUnitPrice,
//!   PricingQuantity in the price book's unit (`1000000 Tokens`,
//!   `GPU-Hours`) and ListCost = ListUnitPrice × PricingQuantity exactly;
//!   EffectiveCost, ContractedCost and BilledCost are the line's amount in
//!   cents;
//! - credit rows (off-peak discounts) and adjustments are money only: no
//!   quantity, unit, unit price or SKU, and every cost is their amount;
//! - prices are in the billing currency: the PricingCurrency* columns (which
//!   the validator asks for once a price list is published) repeat the
//!   billing figures;
//! - an adjustment (usage that arrived after its month was invoiced) is a
//!   Correction whose charge period is the month it corrects;
//! - shadow tenants' BilledCost is 0: they are shown what they would pay,
//!   never billed.
//!
//! Money and quantities stay exact decimals: text in CSV, Decimal128 in
//! Parquet (a value that would need more places than the Parquet scale fails
//! the export rather than being rounded).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, Decimal128Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use chrono::{DateTime, SecondsFormat, Utc};
use rust_decimal::Decimal;

use crate::error::BillingError;
use crate::invoice::{Invoice, Status};
use crate::period::{parse_zone, Month};
use crate::rating::{Line, LineKind};
use crate::tenant::Tenant;

use super::csv_text::{csv_error, finish};

/// One FOCUS row: one invoice line, typed. CSV and Parquet are written from
/// the same rows through the same [`COLUMNS`].
struct FocusRow<'a> {
    /// The tenant: each tenant is its own billing account (and its one sub account).
    account_id: &'a str,
    account_name: &'a str,
    currency: &'a str,
    /// The tenant's month, `[start, end)` from midnight in its own time zone.
    billing_period: (DateTime<Utc>, DateTime<Utc>),
    /// The billing period, or for a correction the month it corrects.
    charge_period: (DateTime<Utc>, DateTime<Utc>),
    category: &'static str,
    class: Option<&'static str>,
    description: &'a str,
    frequency: &'static str,
    billed: Decimal,
    effective: Decimal,
    list: Decimal,
    contracted: Decimal,
    /// Usage rows only: credits and adjustments are money, not quantities.
    pricing: Option<Pricing>,
    invoice_id: String,
    /// Usage rows only.
    sku: Option<Sku>,
}

/// How a usage row is priced and what it measured.
struct Pricing {
    list_unit_price: Decimal,
    quantity: Decimal,
    unit: String,
    consumed_quantity: Decimal,
    consumed_unit: &'static str,
}

struct Sku {
    id: String,
    price_id: String,
    meter: &'static str,
}

/// How a column reads its value off a row.
enum Get {
    Text(for<'r> fn(&'r FocusRow<'r>) -> Option<&'r str>),
    Number(fn(&FocusRow<'_>) -> Option<Decimal>),
    Time(fn(&FocusRow<'_>) -> DateTime<Utc>),
}

/// One FOCUS column: its name, whether it may be null, and its value.
struct Column {
    name: &'static str,
    nullable: bool,
    get: Get,
}

const fn column(name: &'static str, nullable: bool, get: Get) -> Column {
    Column {
        name,
        nullable,
        get,
    }
}

const PROVIDER: &str = "Meterline";
const SERVICE: (&str, &str, &str) = ("LLM Inference", "AI and Machine Learning", "Generative AI");

/// The FOCUS 1.2 columns Meterline fills, in order. `CommitmentDiscountStatus`
/// is always null (Meterline has no commitment discounts) and is present
/// because ConsumedQuantity's nullability is defined in terms of it;
/// `SkuPriceDetails` is always null (allowed when SkuPriceId is set). Prices
/// are in the billing currency, so the PricingCurrency* columns repeat the
/// billing figures; the contracted unit price is the list price (there is no
/// negotiated pricing).
const COLUMNS: [Column; 38] = [
    column("BillingAccountId", false, Get::Text(|r| Some(r.account_id))),
    column(
        "BillingAccountName",
        false,
        Get::Text(|r| Some(r.account_name)),
    ),
    column("BillingCurrency", false, Get::Text(|r| Some(r.currency))),
    column(
        "BillingPeriodStart",
        false,
        Get::Time(|r| r.billing_period.0),
    ),
    column("BillingPeriodEnd", false, Get::Time(|r| r.billing_period.1)),
    column("ChargePeriodStart", false, Get::Time(|r| r.charge_period.0)),
    column("ChargePeriodEnd", false, Get::Time(|r| r.charge_period.1)),
    column("ChargeCategory", false, Get::Text(|r| Some(r.category))),
    column("ChargeClass", true, Get::Text(|r| r.class)),
    column(
        "ChargeDescription",
        false,
        Get::Text(|r| Some(r.description)),
    ),
    column("ChargeFrequency", false, Get::Text(|r| Some(r.frequency))),
    column("BilledCost", false, Get::Number(|r| Some(r.billed))),
    column("EffectiveCost", false, Get::Number(|r| Some(r.effective))),
    column("ListCost", false, Get::Number(|r| Some(r.list))),
    column("ContractedCost", false, Get::Number(|r| Some(r.contracted))),
    column(
        "ListUnitPrice",
        true,
        Get::Number(|r| r.pricing.as_ref().map(|p| p.list_unit_price)),
    ),
    column(
        "PricingQuantity",
        true,
        Get::Number(|r| r.pricing.as_ref().map(|p| p.quantity)),
    ),
    column(
        "PricingUnit",
        true,
        Get::Text(|r| r.pricing.as_ref().map(|p| p.unit.as_str())),
    ),
    column(
        "ConsumedQuantity",
        true,
        Get::Number(|r| r.pricing.as_ref().map(|p| p.consumed_quantity)),
    ),
    column(
        "ConsumedUnit",
        true,
        Get::Text(|r| r.pricing.as_ref().map(|p| p.consumed_unit)),
    ),
    column("CommitmentDiscountStatus", true, Get::Text(|_| None)),
    column("PricingCurrency", false, Get::Text(|r| Some(r.currency))),
    column(
        "PricingCurrencyContractedUnitPrice",
        true,
        Get::Number(|r| r.pricing.as_ref().map(|p| p.list_unit_price)),
    ),
    column(
        "PricingCurrencyEffectiveCost",
        false,
        Get::Number(|r| Some(r.effective)),
    ),
    column(
        "PricingCurrencyListUnitPrice",
        true,
        Get::Number(|r| r.pricing.as_ref().map(|p| p.list_unit_price)),
    ),
    column("InvoiceId", false, Get::Text(|r| Some(&r.invoice_id))),
    column("InvoiceIssuerName", false, Get::Text(|_| Some(PROVIDER))),
    column("ProviderName", false, Get::Text(|_| Some(PROVIDER))),
    column("PublisherName", false, Get::Text(|_| Some(PROVIDER))),
    column("ServiceName", false, Get::Text(|_| Some(SERVICE.0))),
    column("ServiceCategory", false, Get::Text(|_| Some(SERVICE.1))),
    column("ServiceSubcategory", false, Get::Text(|_| Some(SERVICE.2))),
    column("SubAccountId", false, Get::Text(|r| Some(r.account_id))),
    column("SubAccountName", false, Get::Text(|r| Some(r.account_name))),
    column(
        "SkuId",
        true,
        Get::Text(|r| r.sku.as_ref().map(|s| s.id.as_str())),
    ),
    column(
        "SkuPriceId",
        true,
        Get::Text(|r| r.sku.as_ref().map(|s| s.price_id.as_str())),
    ),
    column(
        "SkuMeter",
        true,
        Get::Text(|r| r.sku.as_ref().map(|s| s.meter)),
    ),
    column("SkuPriceDetails", true, Get::Text(|_| None)),
];

fn focus_rows<'a>(
    invoices: &'a [Invoice],
    tenants: &'a [Tenant],
) -> Result<Vec<FocusRow<'a>>, BillingError> {
    let names: HashMap<&str, &str> = tenants
        .iter()
        .map(|t| (t.tenant_id.as_str(), t.display_name.as_str()))
        .collect();
    let mut rows = Vec::new();
    for inv in invoices {
        let head = &inv.body.head;
        let account_id = head.tenant_id.as_str();
        let billing_period = (head.period_start, head.period_end);
        let invoice_id = invoice_id(inv);
        for l in &inv.body.lines {
            let (category, class) = match l.kind {
                LineKind::Usage | LineKind::Overhead => ("Usage", None),
                LineKind::Discount | LineKind::Credit | LineKind::GraceWaiver => ("Credit", None),
                // A dedicated pool, billed whether used or not.
                LineKind::Reserved => ("Usage", None),
                // Late usage for a month already invoiced.
                LineKind::Adjustment => ("Adjustment", Some("Correction")),
            };
            let charge_period = match (l.kind, &l.adjusts) {
                (LineKind::Adjustment, Some(month)) => {
                    Month::parse(month)?.bounds(parse_zone(&head.time_zone)?)
                }
                _ => billing_period,
            };
            let pricing = pricing(l);
            rows.push(FocusRow {
                account_id,
                account_name: names.get(account_id).copied().unwrap_or(account_id),
                currency: &head.currency,
                billing_period,
                charge_period,
                category,
                class,
                description: &l.description,
                frequency: if matches!(l.kind, LineKind::Overhead | LineKind::Reserved) {
                    "Recurring"
                } else {
                    "Usage-Based"
                },
                // Shadow tenants are shown what they would pay, never billed.
                billed: if head.shadow {
                    Decimal::new(0, l.amount.scale())
                } else {
                    l.amount
                },
                effective: l.amount,
                // At list prices, exactly; the line's amount is that rounded once to cents.
                list: pricing
                    .as_ref()
                    .map(|p| (p.list_unit_price * p.quantity).normalize())
                    .unwrap_or(l.amount),
                contracted: l.amount,
                sku: sku(l, &head.price_book),
                pricing,
                invoice_id: invoice_id.clone(),
            });
        }
    }
    Ok(rows)
}

/// A finalized invoice's number; a draft's provisional id (FOCUS allows an
/// InvoiceId before the invoice is issued).
fn invoice_id(inv: &Invoice) -> String {
    match (inv.status, inv.number) {
        (Status::Finalized | Status::Voided, Some(n)) => format!("INV-{n}"),
        _ => format!("DRAFT-{}-{}", inv.body.head.tenant_id, inv.body.head.period),
    }
}

fn pricing(l: &Line) -> Option<Pricing> {
    match l.kind {
        LineKind::Usage | LineKind::Reserved => Some(Pricing {
            list_unit_price: l.unit_price,
            quantity: (l.quantity / Decimal::from(l.per.max(1))).normalize(),
            unit: pricing_unit(&l.unit, l.per),
            consumed_quantity: l.quantity,
            consumed_unit: consumed_unit(&l.unit),
        }),
        // The tenant's share of the month's shared overhead.
        LineKind::Overhead => Some(Pricing {
            list_unit_price: l.amount,
            quantity: Decimal::ONE,
            unit: "Month".into(),
            consumed_quantity: Decimal::ONE,
            consumed_unit: "Month",
        }),
        LineKind::Discount | LineKind::Adjustment | LineKind::Credit | LineKind::GraceWaiver => {
            None
        }
    }
}

fn sku(l: &Line, price_book: &str) -> Option<Sku> {
    let (id, meter) = match l.kind {
        LineKind::Usage => (
            match (&l.model, l.priority) {
                (Some(m), Some(p)) => format!("{m}:{}:P{p}", l.unit),
                _ => l.unit.clone(),
            },
            sku_meter(&l.unit),
        ),
        LineKind::Overhead => ("overhead".to_owned(), "Shared Overhead"),
        LineKind::Reserved => (
            match (&l.model, l.priority) {
                (Some(m), Some(p)) => format!("{m}:reserved_gpu_hours:P{p}"),
                _ => "reserved_gpu_hours".to_owned(),
            },
            "Reserved GPU Hours",
        ),
        LineKind::Discount | LineKind::Adjustment | LineKind::Credit | LineKind::GraceWaiver => {
            return None
        }
    };
    Some(Sku {
        price_id: format!("{id}@{price_book}"),
        id,
        meter,
    })
}

/// FOCUS UnitFormat: a plural unit, `<unit>-<plural time unit>`, or a whole
/// number and a plural unit (`1000000 Tokens`).
fn consumed_unit(unit: &str) -> &'static str {
    match unit {
        "gpu_hours" => "GPU-Hours",
        "input_tokens" | "cached_input_tokens" | "output_tokens" => "Tokens",
        _ => "Units",
    }
}

fn pricing_unit(unit: &str, per: i64) -> String {
    let unit = consumed_unit(unit);
    if per > 1 {
        format!("{per} {unit}")
    } else {
        unit.to_owned()
    }
}

fn sku_meter(unit: &str) -> &'static str {
    match unit {
        "gpu_hours" => "GPU Hours",
        "input_tokens" => "Input Tokens",
        "cached_input_tokens" => "Cached Input Tokens",
        "output_tokens" => "Output Tokens",
        _ => "Usage",
    }
}

/// A text cell; an empty string is a null (FOCUS never uses empty strings).
fn text<'r>(
    get: for<'x> fn(&'x FocusRow<'x>) -> Option<&'x str>,
    r: &'r FocusRow<'r>,
) -> Option<&'r str> {
    get(r).filter(|s| !s.is_empty())
}

/// Date-times as FOCUS writes them: UTC, seconds, `Z`.
fn date_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// A decimal with at least one decimal place, so that a CSV reader takes the
/// column for a decimal even when every value in it is whole.
fn csv_decimal(d: Decimal) -> String {
    if d.scale() == 0 {
        format!("{d}.0")
    } else {
        d.to_string()
    }
}

/// The FOCUS dataset as CSV: nulls are empty fields.
pub fn focus_csv(invoices: &[Invoice], tenants: &[Tenant]) -> Result<String, BillingError> {
    let rows = focus_rows(invoices, tenants)?;
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(COLUMNS.iter().map(|c| c.name))
        .map_err(csv_error)?;
    for r in &rows {
        let fields: Vec<String> = COLUMNS
            .iter()
            .map(|c| match c.get {
                Get::Text(get) => text(get, r).unwrap_or_default().to_owned(),
                Get::Number(get) => get(r).map(csv_decimal).unwrap_or_default(),
                Get::Time(get) => date_time(get(r)),
            })
            .collect();
        w.write_record(&fields).map_err(csv_error)?;
    }
    finish(w)
}

/// Money and quantities as Decimal128 with this many decimal places: exact
/// for every figure Meterline produces (cents, microsecond GPU time, per-token
/// prices, and list costs, their products).
const PARQUET_SCALE: u32 = 10;

/// The FOCUS dataset as Parquet: strings, Decimal128 and UTC timestamps
/// (microseconds), nulls as nulls.
pub fn focus_parquet(invoices: &[Invoice], tenants: &[Tenant]) -> Result<Vec<u8>, BillingError> {
    let rows = focus_rows(invoices, tenants)?;
    let mut fields = Vec::with_capacity(COLUMNS.len());
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(COLUMNS.len());
    for c in &COLUMNS {
        let (ty, array): (DataType, ArrayRef) = match c.get {
            Get::Text(get) => (
                DataType::Utf8,
                Arc::new(rows.iter().map(|r| text(get, r)).collect::<StringArray>()),
            ),
            Get::Number(get) => {
                let values = rows
                    .iter()
                    .map(|r| get(r).map(scaled).transpose())
                    .collect::<Result<Vec<Option<i128>>, BillingError>>()?;
                let array = Decimal128Array::from(values)
                    .with_precision_and_scale(38, PARQUET_SCALE as i8)
                    .map_err(parquet_error)?;
                (
                    DataType::Decimal128(38, PARQUET_SCALE as i8),
                    Arc::new(array),
                )
            }
            Get::Time(get) => (
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                Arc::new(
                    TimestampMicrosecondArray::from(
                        rows.iter()
                            .map(|r| get(r).timestamp_micros())
                            .collect::<Vec<_>>(),
                    )
                    .with_timezone("UTC"),
                ),
            ),
        };
        fields.push(Field::new(c.name, ty, c.nullable));
        arrays.push(array);
    }
    let batch =
        RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).map_err(parquet_error)?;
    let mut out = Vec::new();
    let mut writer = parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), None)
        .map_err(parquet_error)?;
    writer.write(&batch).map_err(parquet_error)?;
    writer.close().map_err(parquet_error)?;
    Ok(out)
}

/// `d` as an integer count of 10^-PARQUET_SCALE; a value that needs more
/// places is an error, never rounded.
fn scaled(d: Decimal) -> Result<i128, BillingError> {
    let d = d.normalize();
    let places = PARQUET_SCALE.checked_sub(d.scale()).ok_or_else(|| {
        parquet_error(format!(
            "{d} needs more than {PARQUET_SCALE} decimal places"
        ))
    })?;
    d.mantissa()
        .checked_mul(10_i128.pow(places))
        .ok_or_else(|| parquet_error(format!("{d} does not fit Decimal128(38, {PARQUET_SCALE})")))
}

fn parquet_error(e: impl std::fmt::Display) -> BillingError {
    BillingError::Config(format!("parquet: {e}"))
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashSet};

    use arrow_array::{Array, Decimal128Array, StringArray};
    use chrono_tz::Tz;
    use rust_decimal_macros::dec;

    use super::*;
    use crate::invoice::{InvoiceBody, InvoiceHead, UsageTotals};
    use crate::rating::{rate, BillingMode, PriceBook, UsageGroup};

    const SEPTEMBER: Month = Month {
        year: 2026,
        month: 9,
    };

    fn book() -> PriceBook {
        PriceBook::from_yaml(include_str!("../../../config/price-book.yaml")).unwrap()
    }

    fn tenant(id: &str, name: &str, tz: Tz, mode: BillingMode, shadow: bool) -> Tenant {
        Tenant {
            tenant_id: id.into(),
            display_name: name.into(),
            billing_mode: mode,
            shadow,
            time_zone: tz,
            priority: 3,
            chargeback_since: None,
        }
    }

    fn group(model: &str, priority: i16, off_peak: bool, micros: i64) -> UsageGroup {
        UsageGroup {
            model: model.into(),
            priority,
            off_peak,
            requests: 3,
            prompt_tokens: 1_234_567,
            cached_tokens: 200_003,
            completion_tokens: 345_679,
            gpu_seconds: Decimal::new(micros, 6),
        }
    }

    fn money_line(
        kind: LineKind,
        description: &str,
        amount: Decimal,
        adjusts: Option<&str>,
    ) -> Line {
        Line {
            kind,
            description: description.into(),
            model: None,
            priority: None,
            off_peak: None,
            unit: "-".into(),
            quantity: Decimal::ONE,
            unit_price: amount,
            per: 1,
            amount,
            adjusts: adjusts.map(String::from),
        }
    }

    fn invoice(t: &Tenant, groups: &[UsageGroup], extra: Vec<Line>) -> Invoice {
        let book = book();
        let (start, end) = SEPTEMBER.bounds(t.time_zone);
        let mut lines = rate(groups, &book, t.billing_mode).unwrap();
        lines.extend(extra);
        let head = InvoiceHead {
            tenant_id: t.tenant_id.clone(),
            period: SEPTEMBER.to_string(),
            period_start: start,
            period_end: end,
            time_zone: t.time_zone.name().into(),
            currency: book.currency.clone(),
            price_book: book.version.clone(),
            billing_mode: t.billing_mode,
            shadow: t.shadow,
        };
        Invoice::draft(InvoiceBody::new(head, UsageTotals::default(), lines))
    }

    /// Three tenants in three time zones: per-token with an off-peak
    /// discount and an overhead share; per-GPU-second finalized, with a
    /// discount and an adjustment for August; a shadow tenant.
    fn dataset() -> (Vec<Invoice>, Vec<Tenant>) {
        let acme = tenant(
            "acme-corp",
            "Acme Corp",
            Tz::UTC,
            BillingMode::PerToken,
            false,
        );
        let p1 = tenant(
            "p1-team",
            "P1 Team",
            Tz::America__New_York,
            BillingMode::PerGpuSecond,
            false,
        );
        let night = tenant(
            "night-team",
            "Night Team",
            Tz::America__Los_Angeles,
            BillingMode::PerGpuSecond,
            true,
        );
        let overhead = |amount| {
            money_line(
                LineKind::Overhead,
                "shared overhead for 2026-09",
                amount,
                None,
            )
        };
        let mut p1_invoice = invoice(
            &p1,
            &[
                group("llama-3.1-70b", 1, false, 44_640_000_000_001),
                group("llama-3.1-70b", 1, true, 12_345_678_901),
            ],
            vec![
                overhead(dec!(1394.38)),
                money_line(
                    LineKind::Adjustment,
                    "charges for 2026-08 that changed after its invoice was finalized (late usage or replica reports)",
                    dec!(2.00),
                    Some("2026-08"),
                ),
            ],
        );
        p1_invoice.status = Status::Finalized;
        p1_invoice.number = Some(7);
        let invoices = vec![
            invoice(
                &acme,
                &[
                    group("llama-3.1-70b", 3, false, 1),
                    group("llama-3.1-70b", 3, true, 1),
                ],
                vec![overhead(dec!(12.34))],
            ),
            p1_invoice,
            invoice(
                &night,
                &[group("llama-3.1-8b", 3, true, 360_000_000)],
                vec![overhead(dec!(11.24))],
            ),
        ];
        (invoices, vec![acme, p1, night])
    }

    /// The CSV as one map per row, column name → field.
    fn csv_rows() -> Vec<HashMap<String, String>> {
        let (invoices, tenants) = dataset();
        let csv = focus_csv(&invoices, &tenants).unwrap();
        let mut reader = csv::Reader::from_reader(csv.as_bytes());
        let headers: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
        reader
            .records()
            .map(|r| {
                headers
                    .iter()
                    .cloned()
                    .zip(r.unwrap().iter().map(String::from))
                    .collect()
            })
            .collect()
    }

    fn parquet_batch() -> RecordBatch {
        let (invoices, tenants) = dataset();
        let bytes = focus_parquet(&invoices, &tenants).unwrap();
        let path = std::env::temp_dir().join(format!("focus-{}.parquet", uuid::Uuid::now_v7()));
        std::fs::write(&path, bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let mut reader =
            parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(file, 1 << 16).unwrap();
        let batch = reader.next().unwrap().unwrap();
        assert!(reader.next().is_none(), "one batch");
        std::fs::remove_file(&path).unwrap();
        batch
    }

    fn strings<'b>(batch: &'b RecordBatch, name: &str) -> &'b StringArray {
        batch
            .column_by_name(name)
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
    }

    fn number(row: &HashMap<String, String>, column: &str) -> Option<Decimal> {
        let field = &row[column];
        (!field.is_empty()).then(|| field.parse().unwrap())
    }

    #[test]
    fn parquet_charge_class_is_null_except_on_corrections() {
        let batch = parquet_batch();
        let (class, category) = (
            strings(&batch, "ChargeClass"),
            strings(&batch, "ChargeCategory"),
        );
        for i in 0..batch.num_rows() {
            if category.value(i) == "Adjustment" {
                assert_eq!(class.value(i), "Correction");
            } else {
                assert!(
                    class.is_null(i),
                    "row {i} ({}): {:?}",
                    category.value(i),
                    class.value(i)
                );
            }
        }
        assert!(class.null_count() > 0 && class.null_count() < batch.num_rows());
        // No string column anywhere holds an empty string in place of a null.
        for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
            if let Some(s) = column.as_any().downcast_ref::<StringArray>() {
                assert!(
                    s.iter().all(|v| v != Some("")),
                    "{} has an empty string",
                    field.name()
                );
            }
            assert!(
                field.is_nullable() || column.null_count() == 0,
                "{} is declared not null",
                field.name()
            );
        }
    }

    #[test]
    fn date_times_are_utc_seconds_ending_in_z() {
        for row in csv_rows() {
            for column in [
                "BillingPeriodStart",
                "BillingPeriodEnd",
                "ChargePeriodStart",
                "ChargePeriodEnd",
            ] {
                let v = &row[column];
                assert!(
                    v.len() == 20 && v.ends_with('Z') && v.as_bytes()[10] == b'T',
                    "{column} = {v:?}"
                );
                assert!(DateTime::parse_from_rfc3339(v).is_ok(), "{column} = {v:?}");
            }
        }
        assert_eq!(
            date_time(SEPTEMBER.bounds(Tz::America__New_York).0),
            "2026-09-01T04:00:00Z"
        );
        let batch = parquet_batch();
        assert_eq!(
            batch
                .schema()
                .field_with_name("BillingPeriodStart")
                .unwrap()
                .data_type(),
            &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        );
    }

    #[test]
    fn credit_and_adjustment_rows_are_money_only() {
        let rows = csv_rows();
        let mut seen = BTreeSet::new();
        for row in rows.iter().filter(|r| r["ChargeCategory"] != "Usage") {
            seen.insert(row["ChargeCategory"].clone());
            for column in [
                "ListUnitPrice",
                "PricingQuantity",
                "PricingUnit",
                "ConsumedQuantity",
                "ConsumedUnit",
                "PricingCurrencyListUnitPrice",
                "PricingCurrencyContractedUnitPrice",
                "SkuId",
                "SkuPriceId",
                "SkuMeter",
            ] {
                assert_eq!(
                    row[column], "",
                    "{} row has {column}",
                    row["ChargeCategory"]
                );
            }
            let effective = number(row, "EffectiveCost").unwrap();
            assert!(!effective.is_zero());
            assert_eq!(number(row, "ListCost"), Some(effective), "{row:?}");
            assert_eq!(number(row, "ContractedCost"), Some(effective));
            let billed = number(row, "BilledCost").unwrap();
            if row["BillingAccountId"] == "night-team" {
                assert!(billed.is_zero(), "a shadow tenant is never billed");
            } else {
                assert_eq!(billed, effective);
            }
        }
        assert_eq!(
            seen,
            BTreeSet::from(["Adjustment".to_owned(), "Credit".to_owned()])
        );
        let credits: Vec<_> = rows
            .iter()
            .filter(|r| r["ChargeCategory"] == "Credit")
            .collect();
        assert_eq!(credits.len(), 3, "one off-peak discount per tenant");
        assert!(credits
            .iter()
            .all(|r| number(r, "EffectiveCost").unwrap() < Decimal::ZERO));
        // The correction is charged to the month it corrects, on this month's bill.
        let adjustment = rows
            .iter()
            .find(|r| r["ChargeCategory"] == "Adjustment")
            .unwrap();
        assert_eq!(adjustment["ChargeClass"], "Correction");
        assert_eq!(adjustment["ChargePeriodStart"], "2026-08-01T04:00:00Z");
        assert_eq!(adjustment["ChargePeriodEnd"], "2026-09-01T04:00:00Z");
        assert_eq!(adjustment["BillingPeriodStart"], "2026-09-01T04:00:00Z");
        assert_eq!(adjustment["InvoiceId"], "INV-7");
    }

    #[test]
    fn units_follow_focus_unit_format() {
        let rows = csv_rows();
        let pricing: HashSet<&str> = rows
            .iter()
            .map(|r| r["PricingUnit"].as_str())
            .filter(|u| !u.is_empty())
            .collect();
        assert_eq!(
            pricing,
            HashSet::from(["1000000 Tokens", "GPU-Hours", "Month"])
        );
        let consumed: HashSet<&str> = rows
            .iter()
            .map(|r| r["ConsumedUnit"].as_str())
            .filter(|u| !u.is_empty())
            .collect();
        assert_eq!(consumed, HashSet::from(["Tokens", "GPU-Hours", "Month"]));
        // A quantity in a unit is a whole number and a space: never "1M".
        assert_eq!(pricing_unit("input_tokens", 1_000_000), "1000000 Tokens");
        assert_eq!(pricing_unit("output_tokens", 1), "Tokens");
        for row in rows.iter().filter(|r| r["PricingUnit"] == "1000000 Tokens") {
            assert_eq!(
                number(row, "PricingQuantity").unwrap() * dec!(1_000_000),
                number(row, "ConsumedQuantity").unwrap()
            );
        }
    }

    #[test]
    fn each_tenant_is_its_own_billing_account_with_one_billing_period() {
        let rows = csv_rows();
        let mut accounts: HashMap<&str, BTreeSet<(&str, &str, &str)>> = HashMap::new();
        for r in &rows {
            assert_eq!(r["SubAccountId"], r["BillingAccountId"]);
            assert_eq!(r["SubAccountName"], r["BillingAccountName"]);
            accounts
                .entry(r["BillingAccountId"].as_str())
                .or_default()
                .insert((
                    r["BillingAccountName"].as_str(),
                    r["BillingPeriodStart"].as_str(),
                    r["BillingPeriodEnd"].as_str(),
                ));
        }
        let one = |id: &str| -> Vec<(&str, &str, &str)> { accounts[id].iter().copied().collect() };
        assert_eq!(accounts.len(), 3);
        assert_eq!(
            one("acme-corp"),
            vec![("Acme Corp", "2026-09-01T00:00:00Z", "2026-10-01T00:00:00Z")]
        );
        assert_eq!(
            one("p1-team"),
            vec![("P1 Team", "2026-09-01T04:00:00Z", "2026-10-01T04:00:00Z")]
        );
        assert_eq!(
            one("night-team"),
            vec![("Night Team", "2026-09-01T07:00:00Z", "2026-10-01T07:00:00Z")]
        );
        // A tenant the list does not name is named by its id.
        let (invoices, _) = dataset();
        let csv = focus_csv(&invoices[..1], &[]).unwrap();
        assert!(csv.contains("\nacme-corp,acme-corp,USD,"), "{csv}");
    }

    #[test]
    fn list_cost_is_list_unit_price_times_pricing_quantity_exactly() {
        let rows = csv_rows();
        let mut usage = 0;
        for row in rows.iter().filter(|r| r["ChargeCategory"] == "Usage") {
            usage += 1;
            let (price, quantity) = (
                number(row, "ListUnitPrice").unwrap(),
                number(row, "PricingQuantity").unwrap(),
            );
            assert!(price >= Decimal::ZERO);
            assert_eq!(number(row, "ListCost"), Some(price * quantity), "{row:?}");
            // One currency: the pricing-currency figures are the billing ones.
            assert_eq!(row["PricingCurrency"], row["BillingCurrency"]);
            assert_eq!(number(row, "PricingCurrencyListUnitPrice"), Some(price));
            assert_eq!(row["PricingCurrencyEffectiveCost"], row["EffectiveCost"]);
            assert!(
                row["SkuPriceId"].starts_with(&format!("{}@", row["SkuId"])),
                "{row:?}"
            );
            assert!(!row["SkuMeter"].is_empty());
        }
        assert!(usage >= 9, "token, GPU and overhead rows");
    }

    #[test]
    fn csv_and_parquet_carry_the_same_values() {
        let rows = csv_rows();
        let batch = parquet_batch();
        assert_eq!(batch.num_rows(), rows.len());
        for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
            let name = field.name();
            for (i, row) in rows.iter().enumerate() {
                let csv = &row[name.as_str()];
                assert_eq!(column.is_null(i), csv.is_empty(), "{name} row {i}");
                if let Some(d) = column.as_any().downcast_ref::<Decimal128Array>() {
                    if !d.is_null(i) {
                        let parquet = Decimal::from_i128_with_scale(d.value(i), PARQUET_SCALE);
                        assert_eq!(parquet, csv.parse::<Decimal>().unwrap(), "{name} row {i}");
                    }
                }
                if let Some(s) = column.as_any().downcast_ref::<StringArray>() {
                    if !s.is_null(i) {
                        assert_eq!(s.value(i), csv, "{name} row {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn decimals_stay_exact() {
        assert_eq!(scaled(dec!(1.5)).unwrap(), 15_000_000_000);
        assert_eq!(scaled(dec!(-0.0000000001)).unwrap(), -1);
        assert!(
            scaled(dec!(0.00000000001)).is_err(),
            "finer than the Parquet scale fails, never rounds"
        );
        // Whole numbers keep a decimal point, so CSV readers type the column as decimal.
        assert_eq!(csv_decimal(dec!(1234567)), "1234567.0");
        assert_eq!(csv_decimal(dec!(0.60)), "0.60");
    }
}
