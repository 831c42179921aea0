//! Numbers for people: money in the currency with thousands separators
//! and two decimals, counts with separators, shares as percentages. Exact
//! (Decimal and integers), never through floating point.

use rust_decimal::{Decimal, RoundingStrategy};

/// `1234567` → `1,234,567`.
pub fn count(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

/// `1234.5` in USD → `$1,234.50`; other currencies by code (`EUR 1,234.50`).
pub fn money(amount: Decimal, currency: &str) -> String {
    let cents = amount.round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero);
    let negative = cents.is_sign_negative() && !cents.is_zero();
    let text = format!("{:.2}", cents.abs());
    let (whole, frac) = text.split_once('.').unwrap_or((&text, "00"));
    let whole = count(whole.parse().unwrap_or(0));
    let symbol = match currency {
        "USD" => "$".to_owned(),
        "EUR" => "€".to_owned(),
        "GBP" => "£".to_owned(),
        other => format!("{other} "),
    };
    format!("{}{symbol}{whole}.{frac}", if negative { "-" } else { "" })
}

/// `0.8123` → `81.2%`.
pub fn percent(share: Decimal) -> String {
    let p = (share * Decimal::ONE_HUNDRED).round_dp(1);
    format!("{p:.1}%")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rust_decimal_macros::dec;

    #[test]
    fn money_has_separators_and_cents() {
        assert_eq!(money(dec!(1234567.891), "USD"), "$1,234,567.89");
        assert_eq!(money(dec!(0), "USD"), "$0.00");
        assert_eq!(money(dec!(-12.5), "EUR"), "-€12.50");
        assert_eq!(money(dec!(999.995), "CHF"), "CHF 1,000.00");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(999), "999");
        assert_eq!(percent(dec!(0.8)), "80.0%");
    }
}
