//! A recomputed invoice against billing's: the head (period bounds, zone,
//! currency, price book, billing mode), the usage totals, every line by
//! what it is (kind, model, priority, peak/off-peak, unit, the month it
//! adjusts) — its quantity, unit price and amount — and the total. Line
//! descriptions are prose and are not compared.

use std::collections::BTreeMap;

use billing_api::invoice::InvoiceBody;
use billing_api::rating::Line;
use rust_decimal::Decimal;
use serde::Serialize;

/// One way the archive's invoice and billing's disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Difference {
    pub tenant_id: String,
    pub period: String,
    /// `finalized #N` or `draft`.
    pub invoice: String,
    /// What differs: `head.<field>`, `usage.<field>`, `line <key>.<field>`, `total`.
    pub what: String,
    /// The value recomputed from the archive (`-` if it has no such line).
    pub archive: String,
    /// The value on billing's invoice (`-` if it has no such line).
    pub billed: String,
}

/// What identifies a line on an invoice.
fn key(l: &Line) -> String {
    let mut k = serde_json::to_value(l.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    for part in [
        l.model.clone(),
        l.priority.map(|p| format!("P{p}")),
        l.off_peak
            .map(|o| if o { "off-peak" } else { "peak" }.to_owned()),
        Some(l.unit.clone()).filter(|u| u != "-"),
        l.adjusts.as_ref().map(|q| format!("adjusts {q}")),
    ]
    .into_iter()
    .flatten()
    {
        k.push(' ');
        k.push_str(&part);
    }
    k
}

/// The figures of a line that must agree.
fn figures(l: &Line) -> [(&'static str, Decimal); 3] {
    [
        ("quantity", l.quantity),
        ("unit_price", l.unit_price / Decimal::from(l.per.max(1))),
        ("amount", l.amount),
    ]
}

/// Every difference between `archive` (recomputed) and `billed`.
pub fn differences(archive: &InvoiceBody, billed: &InvoiceBody, invoice: &str) -> Vec<Difference> {
    let mut out = Vec::new();
    let mut push = |what: String, a: String, b: String| {
        if a != b {
            out.push(Difference {
                tenant_id: billed.head.tenant_id.clone(),
                period: billed.head.period.clone(),
                invoice: invoice.to_owned(),
                what,
                archive: a,
                billed: b,
            });
        }
    };
    let (ah, bh) = (&archive.head, &billed.head);
    for (field, a, b) in [
        (
            "period_start",
            ah.period_start.to_rfc3339(),
            bh.period_start.to_rfc3339(),
        ),
        (
            "period_end",
            ah.period_end.to_rfc3339(),
            bh.period_end.to_rfc3339(),
        ),
        ("time_zone", ah.time_zone.clone(), bh.time_zone.clone()),
        ("currency", ah.currency.clone(), bh.currency.clone()),
        ("price_book", ah.price_book.clone(), bh.price_book.clone()),
        (
            "billing_mode",
            format!("{:?}", ah.billing_mode),
            format!("{:?}", bh.billing_mode),
        ),
    ] {
        push(format!("head.{field}"), a, b);
    }
    let (au, bu) = (&archive.usage, &billed.usage);
    for (field, a, b) in [
        ("requests", au.requests, bu.requests),
        ("prompt_tokens", au.prompt_tokens, bu.prompt_tokens),
        ("cached_tokens", au.cached_tokens, bu.cached_tokens),
        (
            "completion_tokens",
            au.completion_tokens,
            bu.completion_tokens,
        ),
    ] {
        push(format!("usage.{field}"), a.to_string(), b.to_string());
    }
    push(
        "usage.gpu_seconds".into(),
        au.gpu_seconds.normalize().to_string(),
        bu.gpu_seconds.normalize().to_string(),
    );
    let lines = |body: &InvoiceBody| -> BTreeMap<String, Vec<Line>> {
        let mut m: BTreeMap<String, Vec<Line>> = BTreeMap::new();
        for l in &body.lines {
            m.entry(key(l)).or_default().push(l.clone());
        }
        m
    };
    let (al, bl) = (lines(archive), lines(billed));
    let keys: std::collections::BTreeSet<&String> = al.keys().chain(bl.keys()).collect();
    for k in keys {
        let a = al.get(k).map(Vec::as_slice).unwrap_or_default();
        let b = bl.get(k).map(Vec::as_slice).unwrap_or_default();
        for i in 0..a.len().max(b.len()) {
            match (a.get(i), b.get(i)) {
                (Some(x), Some(y)) => {
                    for ((name, xa), (_, yb)) in figures(x).into_iter().zip(figures(y)) {
                        push(
                            format!("line {k}.{name}"),
                            xa.normalize().to_string(),
                            yb.normalize().to_string(),
                        );
                    }
                }
                (Some(x), None) => push(format!("line {k}"), x.amount.to_string(), "-".into()),
                (None, Some(y)) => push(format!("line {k}"), "-".into(), y.amount.to_string()),
                (None, None) => {}
            }
        }
    }
    push(
        "total".into(),
        archive.total.normalize().to_string(),
        billed.total.normalize().to_string(),
    );
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]
    use super::*;

    #[test]
    fn lines_are_matched_by_what_they_are_and_compared_to_the_cent() {
        let body: InvoiceBody = serde_json::from_value(serde_json::json!({
            "tenant_id": "acme", "period": "2026-11",
            "period_start": "2026-11-01T00:00:00Z", "period_end": "2026-12-01T00:00:00Z",
            "time_zone": "UTC", "currency": "USD", "price_book": "v1",
            "billing_mode": "per_token", "shadow": false,
            "usage": {"requests": 2, "prompt_tokens": 10, "cached_tokens": 0,
                      "completion_tokens": 5, "gpu_seconds": "1.5"},
            "lines": [
              {"kind": "usage", "description": "x", "model": "m", "priority": 3,
               "off_peak": false, "unit": "input_tokens", "quantity": "10",
               "unit_price": "2", "per": 1000000, "amount": "0.01"},
              {"kind": "overhead", "description": "y", "model": null, "priority": null,
               "off_peak": null, "unit": "-", "quantity": "1", "unit_price": "0.50",
               "per": 1, "amount": "0.50"}
            ],
            "subtotal": "0.01", "overhead": "0.50", "adjustments": "0", "total": "0.51"
        }))
        .unwrap();
        assert!(differences(&body, &body.clone(), "draft").is_empty());
        let mut changed = body.clone();
        changed.lines[0].amount = Decimal::new(2, 2);
        changed.total = Decimal::new(52, 2);
        let d = differences(&changed, &body, "finalized #7");
        let whats: Vec<&str> = d.iter().map(|d| d.what.as_str()).collect();
        assert_eq!(
            whats,
            ["line usage m P3 peak input_tokens.amount", "total"],
            "{d:?}"
        );
        assert_eq!(
            (d[0].archive.as_str(), d[0].billed.as_str()),
            ("0.02", "0.01")
        );
        let mut missing = body.clone();
        missing.lines.pop();
        let d = differences(&missing, &body, "draft");
        assert!(d
            .iter()
            .any(|d| d.what == "line overhead" && d.archive == "-"));
    }
}
