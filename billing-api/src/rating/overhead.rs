//! The shared-overhead pool (model loads, warm-up, idle) split across
//! tenants in proportion to their billable GPU-seconds, in cents, with the
//! pool conserved exactly.
//!
//! Rule (largest remainder): each tenant first gets the floor of its exact
//! share in cents; the cents left over go one each to the tenants with the
//! largest remainders, ties broken by tenant id. The shares always add up
//! to the pool, to the cent.

use std::collections::BTreeMap;

use rust_decimal::{Decimal, RoundingStrategy};

/// Splits `pool` (rounded to cents first) by `weights`. Tenants with zero
/// weight get nothing; with no weight at all, nothing is allocated.
pub fn allocate(pool: Decimal, weights: &BTreeMap<String, Decimal>) -> BTreeMap<String, Decimal> {
    let pool_cents = (pool * Decimal::ONE_HUNDRED)
        .round_dp_with_strategy(0, RoundingStrategy::MidpointAwayFromZero);
    let total: Decimal = weights.values().filter(|w| w.is_sign_positive()).sum();
    if total.is_zero() || pool_cents.is_zero() {
        return weights.keys().map(|t| (t.clone(), Decimal::ZERO)).collect();
    }
    let mut shares: Vec<(&String, Decimal, Decimal)> = weights
        .iter()
        .map(|(tenant, w)| {
            let w = if w.is_sign_positive() {
                *w
            } else {
                Decimal::ZERO
            };
            let exact = pool_cents * w / total;
            let floor = exact.floor();
            (tenant, floor, exact - floor)
        })
        .collect();
    let given: Decimal = shares.iter().map(|s| s.1).sum();
    let mut left = pool_cents - given;
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by(|&a, &b| {
        shares[b]
            .2
            .cmp(&shares[a].2)
            .then_with(|| shares[a].0.cmp(shares[b].0))
    });
    for i in order {
        if left <= Decimal::ZERO {
            break;
        }
        shares[i].1 += Decimal::ONE;
        left -= Decimal::ONE;
    }
    shares
        .into_iter()
        .map(|(t, c, _)| (t.clone(), c / Decimal::ONE_HUNDRED))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rust_decimal_macros::dec;

    #[test]
    fn a_tenant_with_31_4_percent_carries_879_20_of_2800() {
        let weights = BTreeMap::from([("a".to_owned(), dec!(314)), ("b".to_owned(), dec!(686))]);
        let shares = allocate(dec!(2800), &weights);
        assert_eq!(shares["a"], dec!(879.20));
        assert_eq!(shares["b"], dec!(1920.80));
    }

    #[test]
    fn leftover_cents_go_to_the_largest_remainders() {
        let weights: BTreeMap<String, Decimal> = ["a", "b", "c"]
            .iter()
            .map(|t| (t.to_string(), Decimal::ONE))
            .collect();
        let shares = allocate(dec!(1.00), &weights);
        // 33.33… cents each: one cent left, to the first by id.
        assert_eq!(shares["a"], dec!(0.34));
        assert_eq!(shares["b"], dec!(0.33));
        assert_eq!(shares["c"], dec!(0.33));
    }

    proptest! {
        #[test]
        fn shares_always_add_up_to_the_pool(
            pool_cents in 0i64..100_000_000,
            weights in proptest::collection::vec(0i64..10_000_000_000, 1..40),
        ) {
            let weights: BTreeMap<String, Decimal> = weights
                .iter()
                .enumerate()
                .map(|(i, w)| (format!("t{i:03}"), Decimal::new(*w, 6)))
                .collect();
            let pool = Decimal::new(pool_cents, 2);
            let shares = allocate(pool, &weights);
            let sum: Decimal = shares.values().sum();
            let any_weight = weights.values().any(|w| !w.is_zero());
            prop_assert_eq!(sum, if any_weight { pool } else { Decimal::ZERO });
            for (t, s) in &shares {
                prop_assert!(s.scale() <= 2);
                if weights[t].is_zero() {
                    prop_assert!(s.is_zero());
                }
            }
        }
    }
}
