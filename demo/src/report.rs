//! The tables the demo prints: the backfilled month's invoices with their
//! lines, the month-to-date shadow bills beside them, and the live
//! traffic's "matches".

use billing_api::invoice::Status;
use billing_api::rating::LineKind;
use rust_decimal::Decimal;
use serde_json::Value;

use crate::backfill::Done;
use crate::traffic::Matched;

/// What the sample held, per tenant.
pub fn sample(done: &Done) {
    let total = done.expected.total();
    println!();
    println!(
        "backfilled {}: {} requests, {} GPU-hours ({} to {})",
        done.month.period,
        total.requests,
        done.expected.gpu_hours(),
        done.month.from.format("%Y-%m-%d %H:%M UTC"),
        done.month.to.format("%Y-%m-%d %H:%M UTC")
    );
    if let Some(took) = done.took {
        println!(
            "(produced, ingested, archived and finalized in {:.0} s)",
            took.as_secs_f64()
        );
    }
    // A month an earlier run backfilled with other settings is not this
    // run's sample: there is nothing to compare it with.
    if done.took.is_some() || done.exact {
        println!(
            "billed exactly what was produced (requests, prompt, cached and output tokens, GPU-seconds, every tenant): {}",
            if done.exact { "yes" } else { "NO" }
        );
    }
}

/// Each tenant's invoice for the backfilled month, line by line.
pub fn invoices(done: &Done) {
    for invoice in &done.invoices {
        let head = &invoice.body.head;
        println!();
        println!(
            "{} {}  invoice {}  {}{}  {} requests, {} GPU-seconds",
            head.tenant_id,
            head.period,
            invoice.number.map_or_else(|| "-".into(), |n| n.to_string()),
            match invoice.status {
                Status::Finalized => "finalized",
                Status::Draft => "draft",
                Status::Voided => "voided",
            },
            if head.shadow {
                " (shadow: not payable)"
            } else {
                ""
            },
            invoice.body.usage.requests,
            invoice.body.usage.gpu_seconds,
        );
        println!(
            "  {:<60} {:>16} {:<20} {:>12}",
            "line", "quantity", "unit", "amount"
        );
        for line in &invoice.body.lines {
            // Money-only lines (discounts, overhead) have no quantity to show.
            let (quantity, unit) = if line.unit == "-" {
                (String::new(), String::new())
            } else {
                (line.quantity.to_string(), line.unit.clone())
            };
            println!(
                "  {:<60} {quantity:>16} {unit:<20} {:>12}",
                line.description, line.amount
            );
        }
        println!(
            "  {:<60} {:>16} {:<20} {:>12}",
            format!("total {}", head.currency),
            "",
            "",
            invoice.body.total
        );
        println!("  content hash {}", invoice.content_hash);
    }
}

fn share(part: Decimal, whole: Decimal) -> String {
    if whole.is_zero() {
        "-".into()
    } else {
        format!("{}%", (part * Decimal::from(100) / whole).round_dp(1))
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or("?").to_owned()
}

/// The backfilled month's totals next to each tenant's month-to-date
/// shadow bill (`shadow_bills` in the order of `done.invoices`).
pub fn months(done: &Done, shadow_bills: &[Value]) {
    println!();
    println!(
        "{:<18} {:>10} {:>14} {:>9} {:>12} {:>14} {:>12}",
        "tenant",
        "billed by",
        done.month.period,
        "overhead",
        "off-peak",
        "month to date",
        "projected"
    );
    for (invoice, shadow) in done.invoices.iter().zip(shadow_bills) {
        let b = &invoice.body;
        let discount: Decimal = b
            .lines
            .iter()
            .filter(|l| l.kind == LineKind::Discount)
            .map(|l| l.amount)
            .sum();
        let mtd = &shadow["month_to_date"];
        println!(
            "{:<18} {:>10} {:>14} {:>9} {:>12} {:>14} {:>12}{}",
            b.head.tenant_id,
            serde_json::to_value(b.head.billing_mode)
                .map(|v| text(&v).replace("per_", ""))
                .unwrap_or_default(),
            format!("{} {}", b.total, b.head.currency),
            share(b.overhead, b.total),
            discount,
            text(&mtd["total"]),
            text(&shadow["projected_month_total"]),
            if b.head.shadow { "  (shadow)" } else { "" },
        );
    }
    println!(
        "(overhead: the part of the total that is the tenant's share of the price book's overhead pool; off-peak: the discount lines)"
    );
}

/// The live traffic: what billing counted against what clients were told.
pub fn matches(rows: &[Matched]) -> bool {
    println!();
    println!(
        "{:<18} {:>9} {:>12} {:>12} {:>14} {:>10}",
        "live traffic", "requests", "prompt tok", "output tok", "GPU-seconds", "matches"
    );
    for m in rows {
        println!(
            "{:<18} {:>9} {:>12} {:>12} {:>14} {:>10}",
            m.tenant,
            m.billed.requests,
            m.billed.prompt,
            m.billed.completion,
            m.gpu_seconds,
            if m.matches { "yes" } else { "NO" }
        );
    }
    println!(
        "(\"matches\": billed usage equals the usage the gateway reported to clients, exactly)"
    );
    rows.iter().all(|m| m.matches)
}
