//! Exports for finance: invoice lines as CSV, and the FOCUS (FinOps Open
//! Cost and Usage Specification) 1.2 cost-and-usage dataset, one row per
//! invoice line, as CSV or Parquet, both written from the same typed rows
//! and columns. `tests/tests/focus_conformance.rs` runs the FinOps
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

use crate::drafts::Tenant;
use crate::error::BillingError;
use crate::invoice::{Invoice, Status};
use crate::period::{parse_zone, Month};
use crate::rating::{Line, LineKind};

fn csv_error(e: impl std::fmt::Display) -> BillingError {
    BillingError::Config(format!("csv: {e}"))
}

fn finish(w: csv::Writer<Vec<u8>>) -> Result<String, BillingError> {
    let bytes = w.into_inner().map_err(csv_error)?;
    String::from_utf8(bytes).map_err(csv_error)
}

/// Every line of every invoice.
pub fn invoices_csv(invoices: &[Invoice]) -> Result<String, BillingError> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "tenant_id",
        "period",
        "status",
        "number",
        "currency",
        "kind",
        "description",
        "model",
        "priority",
        "off_peak",
        "unit",
        "quantity",
        "unit_price",
        "per",
        "amount",
        "invoice_total",
        "content_hash",
    ])
    .map_err(csv_error)?;
    for inv in invoices {
        let b = &inv.body;
        for l in &b.lines {
            w.write_record([
                b.head.tenant_id.as_str(),
                &b.head.period,
                status(inv),
                &inv.number.map(|n| n.to_string()).unwrap_or_default(),
                &b.head.currency,
                kind(l.kind),
                &l.description,
                l.model.as_deref().unwrap_or(""),
                &l.priority.map(|p| p.to_string()).unwrap_or_default(),
                &l.off_peak.map(|o| o.to_string()).unwrap_or_default(),
                &l.unit,
                &l.quantity.to_string(),
                &l.unit_price.to_string(),
                &l.per.to_string(),
                &l.amount.to_string(),
                &b.total.to_string(),
                &inv.content_hash,
            ])
            .map_err(csv_error)?;
        }
    }
    finish(w)
}

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
/// `SkuPriceDetails` is always null (allowed when SkuPriceId is set).
const COLUMNS: [Column; 34] = [
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
                LineKind::Discount => ("Credit", None),
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
                frequency: if l.kind == LineKind::Overhead {
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
        LineKind::Usage => Some(Pricing {
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
        LineKind::Discount | LineKind::Adjustment => None,
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
        LineKind::Discount | LineKind::Adjustment => return None,
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

fn status(inv: &Invoice) -> &'static str {
    match inv.status {
        Status::Draft => "draft",
        Status::Finalized => "finalized",
        Status::Voided => "voided",
    }
}

fn kind(k: LineKind) -> &'static str {
    match k {
        LineKind::Usage => "usage",
        LineKind::Discount => "discount",
        LineKind::Overhead => "overhead",
        LineKind::Adjustment => "adjustment",
    }
}
