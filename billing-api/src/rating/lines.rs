//! Rating: a tenant's usage for a period, summed per model × priority ×
//! peak/off-peak, becomes invoice lines under a price book.
//!
//! Rounding rule (the only place money is rounded): every line's amount is
//! computed exactly from the stored figures (integer tokens, GPU-seconds
//! exact to the microsecond) and rounded once to the currency's cents,
//! half away from zero. A discount line is computed from the rounded usage
//! lines it discounts, and rounded the same way. Subtotals and totals are
//! plain sums of rounded lines, so an invoice total is exactly the sum of
//! its lines.

use rust_decimal::{Decimal, RoundingStrategy};
use serde::{Deserialize, Serialize};

use crate::rating::price_book::PriceBook;

/// How a tenant is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BillingMode {
    /// External API customers: tokens by kind.
    PerToken,
    /// Internal chargeback: GPU-hours by priority.
    PerGpuSecond,
}

impl BillingMode {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "per_token" => Some(Self::PerToken),
            "per_gpu_second" => Some(Self::PerGpuSecond),
            _ => None,
        }
    }
}

/// A tenant's usage for a period, summed per model × priority × peak/off-peak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageGroup {
    pub model: String,
    pub priority: i16,
    pub off_peak: bool,
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    pub gpu_seconds: Decimal,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LineKind {
    Usage,
    Discount,
    Overhead,
    Adjustment,
    /// A dedicated pool's GPU-hours, billed to its owner whether used or not.
    Reserved,
    /// Taken off a reservation: the owner's own usage on it, and what
    /// other tenants borrowed (billed to them).
    Credit,
    /// Taken off during a tenant's grace period: the charges above its
    /// budget that accrued in it ([`crate::grace`]).
    GraceWaiver,
}

/// One invoice line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Line {
    pub kind: LineKind,
    pub description: String,
    pub model: Option<String>,
    pub priority: Option<i16>,
    pub off_peak: Option<bool>,
    /// What `quantity` counts: `input_tokens`, `cached_input_tokens`,
    /// `output_tokens`, `gpu_hours`, or `-` for money-only lines.
    pub unit: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub quantity: Decimal,
    /// Price per `per` units of `unit`.
    #[serde(with = "rust_decimal::serde::str")]
    pub unit_price: Decimal,
    pub per: i64,
    #[serde(with = "rust_decimal::serde::str")]
    pub amount: Decimal,
    /// For adjustment lines: the earlier period whose late usage this bills.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adjusts: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RatingError {
    #[error("price book {book} has no token rates for model {model:?}")]
    UnpricedModel { book: String, model: String },
}

/// Rounds to cents, half away from zero: the one rounding step.
pub fn cents(amount: Decimal) -> Decimal {
    amount.round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero)
}

const PER_MILLION: i64 = 1_000_000;
const SECONDS_PER_HOUR: i64 = 3_600;

/// Rates usage groups into lines (usage lines, then their off-peak discount).
pub fn rate(
    groups: &[UsageGroup],
    book: &PriceBook,
    mode: BillingMode,
) -> Result<Vec<Line>, RatingError> {
    let mut sorted: Vec<&UsageGroup> = groups.iter().collect();
    sorted.sort_by(|a, b| {
        (&a.model, a.priority, a.off_peak).cmp(&(&b.model, b.priority, b.off_peak))
    });
    let mut lines = Vec::with_capacity(sorted.len() * 4);
    for g in sorted {
        let first = lines.len();
        match mode {
            BillingMode::PerToken => {
                let rates =
                    book.token_rates
                        .get(&g.model)
                        .ok_or_else(|| RatingError::UnpricedModel {
                            book: book.version.clone(),
                            model: g.model.clone(),
                        })?;
                let uncached = g.prompt_tokens - g.cached_tokens;
                for (unit, what, qty, price) in [
                    ("input_tokens", "input", uncached, rates.input),
                    (
                        "cached_input_tokens",
                        "cached input",
                        g.cached_tokens,
                        rates.cached_input,
                    ),
                    ("output_tokens", "output", g.completion_tokens, rates.output),
                ] {
                    if qty == 0 {
                        continue;
                    }
                    lines.push(usage_line(
                        g,
                        format!(
                            "{} {what} tokens, P{}{}",
                            g.model,
                            g.priority,
                            when(g.off_peak)
                        ),
                        unit,
                        Decimal::from(qty),
                        price,
                        PER_MILLION,
                        cents(Decimal::from(qty) * price / Decimal::from(PER_MILLION)),
                    ));
                }
            }
            BillingMode::PerGpuSecond => {
                if g.gpu_seconds.is_zero() {
                    continue;
                }
                let rate = book.gpu_hour_rate(g.priority);
                let hours = g.gpu_seconds / Decimal::from(SECONDS_PER_HOUR);
                lines.push(usage_line(
                    g,
                    format!("{} GPU-hours, P{}{}", g.model, g.priority, when(g.off_peak)),
                    "gpu_hours",
                    hours.round_dp(6),
                    rate,
                    1,
                    // From the exact GPU-seconds, not the displayed hours.
                    cents(g.gpu_seconds * rate / Decimal::from(SECONDS_PER_HOUR)),
                ));
            }
        }
        let pct = book.off_peak.discount_percent;
        if g.off_peak && !pct.is_zero() {
            let discounted: Decimal = lines[first..].iter().map(|l| l.amount).sum();
            if !discounted.is_zero() {
                lines.push(Line {
                    kind: LineKind::Discount,
                    description: format!("off-peak discount {pct}% on {} P{}", g.model, g.priority),
                    model: Some(g.model.clone()),
                    priority: Some(g.priority),
                    off_peak: Some(true),
                    unit: "-".into(),
                    quantity: Decimal::ONE,
                    // Never "-0.00": a discount that rounds to nothing is 0.00.
                    unit_price: Decimal::ZERO - cents(discounted * pct / Decimal::ONE_HUNDRED),
                    per: 1,
                    amount: Decimal::ZERO - cents(discounted * pct / Decimal::ONE_HUNDRED),
                    adjusts: None,
                });
            }
        }
    }
    Ok(lines)
}

fn when(off_peak: bool) -> &'static str {
    if off_peak {
        ", off-peak"
    } else {
        ", peak"
    }
}

fn usage_line(
    g: &UsageGroup,
    description: String,
    unit: &str,
    quantity: Decimal,
    unit_price: Decimal,
    per: i64,
    amount: Decimal,
) -> Line {
    Line {
        kind: LineKind::Usage,
        description,
        model: Some(g.model.clone()),
        priority: Some(g.priority),
        off_peak: Some(g.off_peak),
        unit: unit.into(),
        quantity,
        unit_price,
        per,
        amount,
        adjusts: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rust_decimal_macros::dec;

    fn book() -> PriceBook {
        PriceBook::from_yaml(include_str!("../../../config/price-book.yaml")).unwrap()
    }

    fn gpu_group(priority: i16, gpu_seconds: Decimal, off_peak: bool) -> UsageGroup {
        UsageGroup {
            model: "llama-3.1-70b".into(),
            priority,
            off_peak,
            requests: 1,
            prompt_tokens: 0,
            cached_tokens: 0,
            completion_tokens: 0,
            gpu_seconds,
        }
    }

    fn total(lines: &[Line]) -> Decimal {
        lines.iter().map(|l| l.amount).sum()
    }

    #[test]
    fn reference_12400_gpu_hours_at_p1_and_p5() {
        let seconds = Decimal::from(12_400 * 3_600);
        let p1 = rate(
            &[gpu_group(1, seconds, false)],
            &book(),
            BillingMode::PerGpuSecond,
        )
        .unwrap();
        assert_eq!(total(&p1), dec!(12400.00));
        assert_eq!(p1[0].quantity, dec!(12400));
        let p5 = rate(
            &[gpu_group(5, seconds, false)],
            &book(),
            BillingMode::PerGpuSecond,
        )
        .unwrap();
        assert_eq!(total(&p5), dec!(43400.00));
    }

    #[test]
    fn off_peak_hours_get_30_percent_off() {
        let seconds = Decimal::from(100 * 3_600);
        let lines = rate(
            &[gpu_group(3, seconds, true)],
            &book(),
            BillingMode::PerGpuSecond,
        )
        .unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].amount, dec!(200.00));
        assert_eq!(lines[1].kind, LineKind::Discount);
        assert_eq!(lines[1].amount, dec!(-60.00));
        assert_eq!(total(&lines), dec!(140.00));
    }

    #[test]
    fn a_discount_that_rounds_to_nothing_reads_0_00_not_minus_0_00() {
        // 18 GPU-seconds at P3 ($2.00/h) = $0.01; 30% of it rounds to 0.00.
        let lines = rate(
            &[gpu_group(3, dec!(18), true)],
            &book(),
            BillingMode::PerGpuSecond,
        )
        .unwrap();
        assert_eq!(lines[0].amount, dec!(0.01));
        assert_eq!(lines[1].kind, LineKind::Discount);
        assert_eq!(lines[1].amount.to_string(), "0.00");
        assert_eq!(lines[1].unit_price.to_string(), "0.00");
    }

    #[test]
    fn tokens_are_priced_by_kind_per_million() {
        let g = UsageGroup {
            model: "llama-3.1-70b".into(),
            priority: 5,
            off_peak: false,
            requests: 10,
            prompt_tokens: 3_000_000,
            cached_tokens: 1_000_000,
            completion_tokens: 500_000,
            gpu_seconds: dec!(1),
        };
        let lines = rate(&[g], &book(), BillingMode::PerToken).unwrap();
        let amounts: Vec<Decimal> = lines.iter().map(|l| l.amount).collect();
        // 2M uncached × $0.60, 1M cached × $0.30, 0.5M output × $2.40
        assert_eq!(amounts, vec![dec!(1.20), dec!(0.30), dec!(1.20)]);
    }

    #[test]
    fn an_unpriced_model_is_an_error_not_a_free_lunch() {
        let mut g = gpu_group(1, dec!(1), false);
        g.model = "mystery-1t".into();
        g.prompt_tokens = 10;
        let err = rate(&[g], &book(), BillingMode::PerToken).unwrap_err();
        assert!(err.to_string().contains("mystery-1t"));
    }

    #[test]
    fn half_a_cent_rounds_away_from_zero() {
        assert_eq!(cents(dec!(0.005)), dec!(0.01));
        assert_eq!(cents(dec!(-0.005)), dec!(-0.01));
        assert_eq!(cents(dec!(0.0049999)), dec!(0.00));
    }
}
