//! Every line of every invoice as one CSV document, the invoice's status,
//! number, total and content hash repeated on each line.

use crate::error::BillingError;
use crate::invoice::{Invoice, Status};
use crate::rating::LineKind;

use super::csv_text::{csv_error, finish};

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
        LineKind::Reserved => "reserved",
        LineKind::Credit => "credit",
        LineKind::GraceWaiver => "grace_waiver",
    }
}
