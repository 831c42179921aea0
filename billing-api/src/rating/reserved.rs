//! Rating a dedicated pool: the owner pays for its dedicated replicas'
//! GPU-hours whether used or not, and is not charged twice for what it ran
//! there itself, nor for what other tenants borrowed.
//!
//! Per model, the owner's invoice gets:
//! - a **reserved** line: the dedicated replicas' GPU-hours (busy and idle,
//!   as the replicas reported them) at the GPU-hour rate of the owner's
//!   priority, no off-peak discount (a reservation is held around the clock);
//! - a **covered** credit: minus what the owner's own usage on those
//!   replicas rated to on its usage lines (its usage lines still show all of
//!   its usage; this credit takes the dedicated part out again, discounts
//!   included);
//! - a **lent** credit: minus the GPU-hours other tenants ran on the
//!   replicas, at the same rate. The borrowers are billed for that usage on
//!   their own invoices, as usual.
//!
//! Every amount is rounded once to cents, as all lines are ([`cents`]).

use rust_decimal::Decimal;

use crate::rating::lines::{cents, rate, BillingMode, Line, LineKind, RatingError, UsageGroup};
use crate::rating::price_book::PriceBook;

const SECONDS_PER_HOUR: i64 = 3_600;

/// One model's dedicated pool of one owner, for a period.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reservation {
    pub model: String,
    /// The dedicated replicas' GPU-seconds, busy and idle.
    pub reserved_gpu_seconds: Decimal,
    /// The owner's own usage on them, in rating groups.
    pub own_usage: Vec<UsageGroup>,
    /// GPU-seconds other tenants ran on them.
    pub lent_gpu_seconds: Decimal,
}

/// The lines of an owner's reservations, per model in order; `priority` is
/// the owner's (its tier's GPU-hour rate prices the reservation).
pub fn reserved_lines(
    reservations: &[Reservation],
    book: &PriceBook,
    mode: BillingMode,
    priority: i16,
) -> Result<Vec<Line>, RatingError> {
    let rate_per_hour = book.gpu_hour_rate(priority);
    let mut sorted: Vec<&Reservation> = reservations.iter().collect();
    sorted.sort_by(|a, b| a.model.cmp(&b.model));
    let mut lines = Vec::new();
    for r in sorted {
        let hours = |s: Decimal| (s / Decimal::from(SECONDS_PER_HOUR)).round_dp(6);
        let money = |s: Decimal| cents(s * rate_per_hour / Decimal::from(SECONDS_PER_HOUR));
        if !r.reserved_gpu_seconds.is_zero() {
            lines.push(Line {
                kind: LineKind::Reserved,
                description: format!(
                    "{} dedicated replicas, reserved GPU-hours, P{priority}",
                    r.model
                ),
                model: Some(r.model.clone()),
                priority: Some(priority),
                off_peak: None,
                unit: "gpu_hours".into(),
                quantity: hours(r.reserved_gpu_seconds),
                unit_price: rate_per_hour,
                per: 1,
                amount: money(r.reserved_gpu_seconds),
                adjusts: None,
            });
        }
        let covered: Decimal = rate(&r.own_usage, book, mode)?
            .iter()
            .map(|l| l.amount)
            .sum();
        if !covered.is_zero() {
            lines.push(Line {
                kind: LineKind::Credit,
                description: format!(
                    "{} usage on own dedicated replicas, covered by the reservation",
                    r.model
                ),
                model: Some(r.model.clone()),
                priority: None,
                off_peak: None,
                unit: "-".into(),
                quantity: Decimal::ONE,
                unit_price: -covered,
                per: 1,
                amount: -covered,
                adjusts: None,
            });
        }
        if !r.lent_gpu_seconds.is_zero() {
            lines.push(Line {
                kind: LineKind::Credit,
                description: format!(
                    "{} dedicated GPU-hours lent to other tenants (billed to them)",
                    r.model
                ),
                model: Some(r.model.clone()),
                priority: Some(priority),
                off_peak: None,
                unit: "gpu_hours".into(),
                quantity: hours(r.lent_gpu_seconds),
                unit_price: -rate_per_hour,
                per: 1,
                // Never "-0.00": a credit that rounds to nothing is 0.00.
                amount: Decimal::ZERO - money(r.lent_gpu_seconds),
                adjusts: None,
            });
        }
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rust_decimal_macros::dec;

    fn book() -> PriceBook {
        PriceBook::from_yaml(include_str!("../../../config/price-book.yaml")).unwrap()
    }

    fn group(off_peak: bool, gpu_seconds: Decimal, completion: i64) -> UsageGroup {
        UsageGroup {
            model: "llama-3.1-70b".into(),
            priority: 5,
            off_peak,
            requests: 1,
            prompt_tokens: 1_000,
            cached_tokens: 0,
            completion_tokens: completion,
            gpu_seconds,
        }
    }

    #[test]
    fn a_lent_credit_that_rounds_to_nothing_reads_0_00_not_minus_0_00() {
        let r = Reservation {
            model: "llama-3.1-70b".into(),
            reserved_gpu_seconds: dec!(20),
            own_usage: Vec::new(),
            lent_gpu_seconds: dec!(6.7),
        };
        let lines = reserved_lines(&[r], &book(), BillingMode::PerGpuSecond, 2).unwrap();
        let lent = lines.iter().find(|l| l.kind == LineKind::Credit).unwrap();
        assert_eq!(lent.amount.to_string(), "0.00");
        assert_eq!(lent.quantity, dec!(0.001861));
    }

    #[test]
    fn four_replicas_for_a_30_day_month_at_p5() {
        // 4 replicas × 4 GPUs × 720 h = 11,520 GPU-hours × $3.50.
        let r = Reservation {
            model: "llama-3.1-70b".into(),
            reserved_gpu_seconds: Decimal::from(4 * 4 * 720 * 3_600),
            ..Default::default()
        };
        let lines = reserved_lines(&[r], &book(), BillingMode::PerToken, 5).unwrap();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].kind, LineKind::Reserved);
        assert_eq!(lines[0].quantity, dec!(11520));
        assert_eq!(lines[0].amount, dec!(40320.00));
    }

    #[test]
    fn own_usage_is_credited_exactly_as_it_was_rated() {
        let own = vec![
            group(false, dec!(100), 2_000_000),
            group(true, dec!(50), 1_000_000),
        ];
        let r = Reservation {
            model: "llama-3.1-70b".into(),
            reserved_gpu_seconds: dec!(3600),
            own_usage: own.clone(),
            lent_gpu_seconds: dec!(0),
        };
        for mode in [BillingMode::PerToken, BillingMode::PerGpuSecond] {
            let lines = reserved_lines(std::slice::from_ref(&r), &book(), mode, 5).unwrap();
            let usage: Decimal = rate(&own, &book(), mode)
                .unwrap()
                .iter()
                .map(|l| l.amount)
                .sum();
            let credit = lines.iter().find(|l| l.kind == LineKind::Credit).unwrap();
            assert_eq!(credit.amount, -usage, "{mode:?}");
        }
    }

    #[test]
    fn lent_hours_are_credited_at_the_owners_rate() {
        let r = Reservation {
            model: "llama-3.1-70b".into(),
            reserved_gpu_seconds: dec!(7200),
            own_usage: vec![],
            lent_gpu_seconds: dec!(1800),
        };
        let lines = reserved_lines(&[r], &book(), BillingMode::PerGpuSecond, 5).unwrap();
        let amounts: Vec<Decimal> = lines.iter().map(|l| l.amount).collect();
        assert_eq!(amounts, vec![dec!(7.00), dec!(-1.75)]);
    }

    proptest! {
        /// A reservation lent out whole costs its owner nothing; otherwise
        /// the owner pays at least for the idle part, never below zero.
        #[test]
        fn the_owner_never_pays_less_than_nothing(
            reserved in 0i64..10_000_000_000,
            lent_share in 0u32..=100,
            priority in 1i16..=5,
        ) {
            let reserved = Decimal::new(reserved, 6);
            let lent = (reserved * Decimal::from(lent_share) / Decimal::ONE_HUNDRED).round_dp(6);
            let r = Reservation {
                model: "llama-3.1-70b".into(),
                reserved_gpu_seconds: reserved,
                own_usage: vec![],
                lent_gpu_seconds: lent,
            };
            let lines = reserved_lines(&[r], &book(), BillingMode::PerGpuSecond, priority).unwrap();
            let net: Decimal = lines.iter().map(|l| l.amount).sum();
            prop_assert!(net >= Decimal::ZERO);
            if lent_share == 100 {
                prop_assert_eq!(net, Decimal::ZERO);
            }
        }
    }
}
