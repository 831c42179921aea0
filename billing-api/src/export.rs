//! Exports for finance: invoice lines as CSV, and a FOCUS (FinOps Open Cost
//! and Usage Specification) cost-and-usage dataset as CSV, one row per
//! invoice line. Shadow tenants' rows carry a BilledCost of 0: their cost is
//! effective, never billed.

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
                b.tenant_id.as_str(),
                &b.period,
                status(inv),
                &inv.number.map(|n| n.to_string()).unwrap_or_default(),
                &b.currency,
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

/// The FOCUS columns Meterline fills.
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

pub fn focus_csv(invoices: &[Invoice]) -> Result<String, BillingError> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(FOCUS_COLUMNS).map_err(csv_error)?;
    for inv in invoices {
        let b = &inv.body;
        let start = b.period_start.to_rfc3339();
        let end = b.period_end.to_rfc3339();
        for l in &b.lines {
            let (category, class) = match l.kind {
                LineKind::Usage => ("Usage", ""),
                LineKind::Discount => ("Credit", ""),
                LineKind::Overhead => ("Usage", ""),
                LineKind::Adjustment => ("Adjustment", "Correction"),
            };
            let billed = if b.shadow { Decimal::ZERO } else { l.amount };
            let list = if l.kind == LineKind::Discount {
                Decimal::ZERO
            } else {
                l.amount
            };
            let (pricing_qty, pricing_unit) = match l.kind {
                LineKind::Usage => (
                    l.quantity / Decimal::from(l.per.max(1)),
                    pricing_unit(&l.unit, l.per),
                ),
                _ => (Decimal::ONE, "Each".to_owned()),
            };
            let sku = match (&l.model, l.priority) {
                (Some(m), Some(p)) => format!("{m}:{}:P{p}", l.unit),
                _ => kind(l.kind).to_owned(),
            };
            w.write_record([
                "meterline",
                "Meterline GPU fleet",
                b.currency.as_str(),
                &start,
                &end,
                &start,
                &end,
                category,
                class,
                &l.description,
                "Usage-Based",
                &billed.to_string(),
                &l.amount.to_string(),
                &list.to_string(),
                &l.amount.to_string(),
                &l.unit_price.to_string(),
                &pricing_qty.normalize().to_string(),
                &pricing_unit,
                &l.quantity.to_string(),
                &consumed_unit(&l.unit),
                "Meterline",
                "Meterline",
                "Meterline",
                "LLM Inference",
                "AI and Machine Learning",
                &b.tenant_id,
                &sku,
            ])
            .map_err(csv_error)?;
        }
    }
    finish(w)
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
