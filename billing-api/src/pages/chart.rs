//! Charts drawn by the server as SVG (no JavaScript, nothing fetched):
//! the daily cost stacked by model, and cost by hour of day with the
//! off-peak window shaded. Geometry is computed from the exact amounts in
//! integer pixels (Decimal, rounded), never through floating point.

use std::collections::BTreeMap;

use chrono::NaiveDate;
use maud::{html, Markup};
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

use crate::pages::format::money;
use crate::shadow::Amount;

const WIDTH: i64 = 720;
const HEIGHT: i64 = 220;
const LEFT: i64 = 70;
const BOTTOM: i64 = 24;
const TOP: i64 = 10;

/// A colour per model, stable across pages (by the model's place in the list).
pub const PALETTE: [&str; 6] = [
    "#3b6ea8", "#e07b39", "#4d9a5b", "#a8509a", "#c9a227", "#5fa3b5",
];

fn px(amount: Decimal, max: Decimal, span: i64) -> i64 {
    if max.is_zero() {
        return 0;
    }
    (amount * Decimal::from(span) / max)
        .round()
        .to_i64()
        .unwrap_or(0)
}

/// A nice round top for the axis (1, 2 or 5 × 10^k at or above `max`).
fn axis_top(max: Decimal) -> Decimal {
    if max <= Decimal::ZERO {
        return Decimal::ONE;
    }
    let mut step = Decimal::new(1, 2);
    loop {
        for m in [1, 2, 5] {
            let top = step * Decimal::from(m);
            if top >= max {
                return top;
            }
        }
        step *= Decimal::TEN;
    }
}

/// One day's segments, bottom up: `(colour index, model, y, height, amount)`.
fn stack<'a>(
    by_model: &BTreeMap<String, Amount>,
    models: &'a [String],
    top: Decimal,
    plot_h: i64,
) -> Vec<(usize, &'a str, i64, i64, Decimal)> {
    let mut y = HEIGHT - BOTTOM;
    let mut out = Vec::new();
    for (m, model) in models.iter().enumerate() {
        if let Some(a) = by_model.get(model) {
            let h = px(a.amount, top, plot_h);
            y -= h;
            out.push((m, model.as_str(), y, h, a.amount));
        }
    }
    out
}

/// Daily cost stacked by model; `models` fixes the colours and legend order.
pub fn daily_by_model(
    days: &BTreeMap<NaiveDate, BTreeMap<String, Amount>>,
    models: &[String],
    currency: &str,
) -> Markup {
    let max = days
        .values()
        .map(|m| m.values().map(|a| a.amount).sum::<Decimal>())
        .max()
        .unwrap_or_default();
    let top = axis_top(max);
    let plot_h = HEIGHT - BOTTOM - TOP;
    let n = i64::try_from(days.len()).unwrap_or(1).max(1);
    let slot = (WIDTH - LEFT - 10) / n;
    let bar = (slot * 3 / 4).max(2);
    html! {
        svg.chart role="img" viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) aria-label="daily cost by model" {
            line x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(HEIGHT - BOTTOM) stroke="#888" {}
            line x1=(LEFT) y1=(HEIGHT - BOTTOM) x2=(WIDTH - 10) y2=(HEIGHT - BOTTOM) stroke="#888" {}
            text x=(LEFT - 6) y=(TOP + 10) text-anchor="end" font-size="11" { (money(top, currency)) }
            text x=(LEFT - 6) y=(HEIGHT - BOTTOM) text-anchor="end" font-size="11" { (money(Decimal::ZERO, currency)) }
            @for (i, (day, by_model)) in days.iter().enumerate() {
                @let x = LEFT + 4 + i64::try_from(i).unwrap_or(0) * slot;
                @for (m, model, y, h, amount) in stack(by_model, models, top, plot_h) {
                    rect x=(x) y=(y) width=(bar) height=(h) fill=(PALETTE[m % PALETTE.len()]) {
                        title { (day) " " (model) ": " (money(amount, currency)) }
                    }
                }
                @if days.len() <= 16 || i % 5 == 0 {
                    text x=(x + bar / 2) y=(HEIGHT - 8) text-anchor="middle" font-size="10" { (day.format("%d")) }
                }
            }
        }
        p.legend {
            @for (m, model) in models.iter().enumerate() {
                span.swatch style=(format!("background:{}", PALETTE[m % PALETTE.len()])) {}
                " " (model) " "
            }
        }
    }
}

/// Cost by hour of day (0–23, in the book's zone), off-peak hours shaded.
pub fn hour_of_day(hours: &BTreeMap<u32, Amount>, off_peak: &[bool; 24], currency: &str) -> Markup {
    let max = hours.values().map(|a| a.amount).max().unwrap_or_default();
    let top = axis_top(max);
    let plot_h = HEIGHT - BOTTOM - TOP;
    let slot = (WIDTH - LEFT - 10) / 24;
    html! {
        svg.chart role="img" viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) aria-label="cost by hour of day" {
            @for h in 0..24i64 {
                @if off_peak[usize::try_from(h).unwrap_or(0)] {
                    rect.offpeak x=(LEFT + h * slot) y=(TOP) width=(slot) height=(plot_h) fill="#e6eef7" {}
                }
            }
            line x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(HEIGHT - BOTTOM) stroke="#888" {}
            line x1=(LEFT) y1=(HEIGHT - BOTTOM) x2=(WIDTH - 10) y2=(HEIGHT - BOTTOM) stroke="#888" {}
            text x=(LEFT - 6) y=(TOP + 10) text-anchor="end" font-size="11" { (money(top, currency)) }
            @for h in 0..24u32 {
                @let x = LEFT + i64::from(h) * slot;
                @if let Some(a) = hours.get(&h) {
                    @let bar = px(a.amount, top, plot_h);
                    rect x=(x + 3) y=(HEIGHT - BOTTOM - bar) width=(slot - 6) height=(bar) fill="#3b6ea8" {
                        title { (format!("{h:02}:00")) ": " (money(a.amount, currency)) }
                    }
                }
                @if h % 3 == 0 {
                    text x=(x + slot / 2) y=(HEIGHT - 8) text-anchor="middle" font-size="10" { (format!("{h:02}")) }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rust_decimal_macros::dec;

    #[test]
    fn the_axis_top_is_round_and_covers_the_max() {
        assert_eq!(axis_top(dec!(0)), dec!(1));
        assert_eq!(axis_top(dec!(7.3)), dec!(10));
        assert_eq!(axis_top(dec!(120)), dec!(200));
        assert_eq!(px(dec!(50), dec!(100), 200), 100);
    }
}
