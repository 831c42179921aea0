//! Exports for finance: invoice lines as CSV, and a FOCUS (FinOps Open Cost
//! and Usage Specification) cost-and-usage dataset as CSV, one row per
//! invoice line, as CSV or Parquet (money as exact Decimal128). Shadow
//! tenants' rows carry a BilledCost of 0: their cost is effective, never billed.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;

use crate::error::BillingError;
use crate::invoice::Invoice;
use crate::rating::LineKind;

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
/// the same rows.
struct FocusRow<'a> {
    currency: &'a str,
    period_start: DateTime<Utc>,
    period_end: DateTime<Utc>,
    category: &'static str,
    class: &'static str,
    description: &'a str,
    billed: Decimal,
    effective: Decimal,
    list: Decimal,
    list_unit_price: Decimal,
    pricing_quantity: Decimal,
    pricing_unit: String,
    consumed_quantity: Decimal,
    consumed_unit: String,
    tenant: &'a str,
    sku: String,
}

fn focus_rows(invoices: &[Invoice]) -> Vec<FocusRow<'_>> {
    let mut rows = Vec::new();
    for inv in invoices {
        let b = &inv.body;
        for l in &b.lines {
            let (category, class) = match l.kind {
                LineKind::Usage | LineKind::Overhead => ("Usage", ""),
                LineKind::Discount => ("Credit", ""),
                LineKind::Adjustment => ("Adjustment", "Correction"),
            };
            let (pricing_quantity, pricing_unit) = match l.kind {
                LineKind::Usage => (
                    l.quantity / Decimal::from(l.per.max(1)),
                    pricing_unit(&l.unit, l.per),
                ),
                _ => (Decimal::ONE, "Each".to_owned()),
            };
            rows.push(FocusRow {
                currency: &b.head.currency,
                period_start: b.head.period_start,
                period_end: b.head.period_end,
                category,
                class,
                description: &l.description,
                // Shadow tenants are shown what they would pay, never billed.
                billed: if b.head.shadow {
                    Decimal::ZERO
                } else {
                    l.amount
                },
                effective: l.amount,
                list: if l.kind == LineKind::Discount {
                    Decimal::ZERO
                } else {
                    l.amount
                },
                list_unit_price: l.unit_price,
                pricing_quantity: pricing_quantity.normalize(),
                pricing_unit,
                consumed_quantity: l.quantity,
                consumed_unit: consumed_unit(&l.unit),
                tenant: &b.head.tenant_id,
                sku: match (&l.model, l.priority) {
                    (Some(m), Some(p)) => format!("{m}:{}:P{p}", l.unit),
                    _ => kind(l.kind).to_owned(),
                },
            });
        }
    }
    rows
}

/// The FOCUS columns Meterline fills, in order.
const FOCUS_COLUMNS: [&str; 27] = [
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "ContractedCost",
    "ListUnitPrice",
    "PricingQuantity",
    "PricingUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ProviderName",
    "PublisherName",
    "InvoiceIssuerName",
    "ServiceName",
    "ServiceCategory",
    "SubAccountId",
    "SkuId",
];
const ACCOUNT: (&str, &str) = ("meterline", "Meterline GPU fleet");
const PROVIDER: &str = "Meterline";
const SERVICE: (&str, &str) = ("LLM Inference", "AI and Machine Learning");

pub fn focus_csv(invoices: &[Invoice]) -> Result<String, BillingError> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(FOCUS_COLUMNS).map_err(csv_error)?;
    for r in focus_rows(invoices) {
        let (start, end) = (r.period_start.to_rfc3339(), r.period_end.to_rfc3339());
        w.write_record([
            ACCOUNT.0,
            ACCOUNT.1,
            r.currency,
            &start,
            &end,
            &start,
            &end,
            r.category,
            r.class,
            r.description,
            "Usage-Based",
            &r.billed.to_string(),
            &r.effective.to_string(),
            &r.list.to_string(),
            &r.effective.to_string(),
            &r.list_unit_price.to_string(),
            &r.pricing_quantity.to_string(),
            &r.pricing_unit,
            &r.consumed_quantity.to_string(),
            &r.consumed_unit,
            PROVIDER,
            PROVIDER,
            PROVIDER,
            SERVICE.0,
            SERVICE.1,
            r.tenant,
            &r.sku,
        ])
        .map_err(csv_error)?;
    }
    finish(w)
}

/// Money and quantities as Decimal128 with this many decimal places: exact
/// for every figure Meterline produces (cents, microsecond GPU time, per-token prices).
const PARQUET_SCALE: u32 = 10;

pub fn focus_parquet(invoices: &[Invoice]) -> Result<Vec<u8>, BillingError> {
    use arrow_array::{
        ArrayRef, Decimal128Array, RecordBatch, StringArray, TimestampMicrosecondArray,
    };
    use arrow_schema::{DataType, Field, Schema, TimeUnit};
    use std::sync::Arc;

    let rows = focus_rows(invoices);
    let n = rows.len();
    let text = |f: &dyn Fn(&FocusRow) -> String| -> ArrayRef {
        Arc::new(StringArray::from(rows.iter().map(f).collect::<Vec<_>>()))
    };
    let fixed = |v: &str| -> ArrayRef { Arc::new(StringArray::from(vec![v; n])) };
    let time = |f: &dyn Fn(&FocusRow) -> DateTime<Utc>| -> ArrayRef {
        Arc::new(
            TimestampMicrosecondArray::from(
                rows.iter()
                    .map(|r| f(r).timestamp_micros())
                    .collect::<Vec<_>>(),
            )
            .with_timezone("UTC"),
        )
    };
    let money = |f: &dyn Fn(&FocusRow) -> Decimal| -> Result<ArrayRef, BillingError> {
        let values: Vec<i128> = rows.iter().map(|r| scaled(f(r))).collect();
        let array = Decimal128Array::from(values)
            .with_precision_and_scale(38, PARQUET_SCALE as i8)
            .map_err(parquet_error)?;
        Ok(Arc::new(array))
    };
    let decimal = DataType::Decimal128(38, PARQUET_SCALE as i8);
    let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let mut fields = Vec::with_capacity(FOCUS_COLUMNS.len());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(FOCUS_COLUMNS.len());
    for name in FOCUS_COLUMNS {
        let (ty, col): (DataType, ArrayRef) = match name {
            "BillingAccountId" => (DataType::Utf8, fixed(ACCOUNT.0)),
            "BillingAccountName" => (DataType::Utf8, fixed(ACCOUNT.1)),
            "BillingCurrency" => (DataType::Utf8, text(&|r| r.currency.to_owned())),
            "BillingPeriodStart" | "ChargePeriodStart" => (ts.clone(), time(&|r| r.period_start)),
            "BillingPeriodEnd" | "ChargePeriodEnd" => (ts.clone(), time(&|r| r.period_end)),
            "ChargeCategory" => (DataType::Utf8, text(&|r| r.category.to_owned())),
            "ChargeClass" => (DataType::Utf8, text(&|r| r.class.to_owned())),
            "ChargeDescription" => (DataType::Utf8, text(&|r| r.description.to_owned())),
            "ChargeFrequency" => (DataType::Utf8, fixed("Usage-Based")),
            "BilledCost" => (decimal.clone(), money(&|r| r.billed)?),
            "EffectiveCost" | "ContractedCost" => (decimal.clone(), money(&|r| r.effective)?),
            "ListCost" => (decimal.clone(), money(&|r| r.list)?),
            "ListUnitPrice" => (decimal.clone(), money(&|r| r.list_unit_price)?),
            "PricingQuantity" => (decimal.clone(), money(&|r| r.pricing_quantity)?),
            "PricingUnit" => (DataType::Utf8, text(&|r| r.pricing_unit.clone())),
            "ConsumedQuantity" => (decimal.clone(), money(&|r| r.consumed_quantity)?),
            "ConsumedUnit" => (DataType::Utf8, text(&|r| r.consumed_unit.clone())),
            "ProviderName" | "PublisherName" | "InvoiceIssuerName" => {
                (DataType::Utf8, fixed(PROVIDER))
            }
            "ServiceName" => (DataType::Utf8, fixed(SERVICE.0)),
            "ServiceCategory" => (DataType::Utf8, fixed(SERVICE.1)),
            "SubAccountId" => (DataType::Utf8, text(&|r| r.tenant.to_owned())),
            _ => (DataType::Utf8, text(&|r| r.sku.clone())),
        };
        fields.push(Field::new(name, ty, false));
        columns.push(col);
    }
    let batch =
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(parquet_error)?;
    let mut out = Vec::new();
    let mut writer = parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), None)
        .map_err(parquet_error)?;
    writer.write(&batch).map_err(parquet_error)?;
    writer.close().map_err(parquet_error)?;
    Ok(out)
}

/// `d` as an integer count of 10^-PARQUET_SCALE.
fn scaled(d: Decimal) -> i128 {
    let mut d = d.round_dp(PARQUET_SCALE);
    d.rescale(PARQUET_SCALE);
    d.mantissa()
}

fn parquet_error(e: impl std::fmt::Display) -> BillingError {
    BillingError::Config(format!("parquet: {e}"))
}

fn status(inv: &Invoice) -> &'static str {
    match inv.status {
        crate::invoice::Status::Draft => "draft",
        crate::invoice::Status::Finalized => "finalized",
        crate::invoice::Status::Voided => "voided",
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

fn consumed_unit(unit: &str) -> String {
    match unit {
        "gpu_hours" => "GPU-Hours".into(),
        "input_tokens" | "cached_input_tokens" | "output_tokens" => "Tokens".into(),
        _ => "Each".into(),
    }
}

fn pricing_unit(unit: &str, per: i64) -> String {
    match (unit, per) {
        ("gpu_hours", _) => "GPU-Hours".into(),
        (_, 1_000_000) => "1M Tokens".into(),
        _ => "Each".into(),
    }
}
