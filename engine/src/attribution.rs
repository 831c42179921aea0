//! GPU-second attribution: a step's busy time × the replica's GPUs, in
//! integer micro-GPU-seconds, split among the step's requests in proportion
//! to their work in it by cumulative rounding (each share is its exact
//! share rounded down or up). The shares always sum to the whole, exactly, so the replica's attributed GPU-seconds equal
//! its busy GPU-seconds with nothing lost to rounding. Idle time is never
//! attributed; the replica reports it separately.

use rust_decimal::Decimal;

/// Micro-GPU-seconds as the usage contract's exact decimal (6 places).
pub fn to_gpu_seconds(micros: u64) -> Decimal {
    Decimal::from_i128_with_scale(i128::from(micros), 6)
}

/// Splits `total` among `weights` (each > 0) in proportion, writing each
/// share into `shares` (same length), by cumulative rounding: request
/// `i` gets `⌊C_i·total/S⌋ − ⌊C_{i−1}·total/S⌋`, where `C_i` is the sum
/// of the first `i` weights and `S` of all. The shares telescope to
/// `total` exactly, and each is its exact share rounded down or up —
/// the same guarantee as the largest-remainder method, in one pass with
/// no sorting.
pub fn split(total: u64, weights: &[u64], shares: &mut [u64]) {
    debug_assert_eq!(weights.len(), shares.len());
    if weights.is_empty() {
        return;
    }
    let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    if sum == 0 {
        shares.fill(0);
        shares[0] = total;
        return;
    }
    // The common case: every product fits a u64, so no u128 division.
    if let Some(top) = u64::try_from(sum)
        .ok()
        .filter(|s| s.checked_mul(total).is_some())
    {
        let (mut cum, mut before) = (0u64, 0u64);
        for (&w, share) in weights.iter().zip(shares.iter_mut()) {
            cum += w;
            let upto = cum * total / top;
            *share = upto - before;
            before = upto;
        }
        return;
    }
    let (mut cum, mut before) = (0u128, 0u128);
    for (&w, share) in weights.iter().zip(shares.iter_mut()) {
        cum += u128::from(w);
        let upto = cum * u128::from(total) / sum;
        // upto − before ≤ total, so it fits.
        *share = (upto - before) as u64;
        before = upto;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn leftovers_go_where_the_running_total_crosses_a_unit() {
        let mut shares = [0; 3];
        split(10, &[1, 1, 1], &mut shares);
        assert_eq!(shares, [3, 3, 4]);
        split(100, &[1, 2, 7], &mut shares);
        assert_eq!(shares, [10, 20, 70]);
        split(5, &[1, 3, 1], &mut shares);
        assert_eq!(shares, [1, 3, 1]);
        // Huge weights take the u128 path and agree.
        let w = 1u64 << 50;
        split(10, &[w, w, w], &mut shares);
        assert_eq!(shares, [3, 3, 4]);
    }

    #[test]
    fn micros_become_six_place_decimals() {
        assert_eq!(to_gpu_seconds(1_234_567).to_string(), "1.234567");
    }

    /// Cumulative rounding written the obvious way, all in u128.
    fn reference_split(total: u64, weights: &[u64]) -> Vec<u64> {
        let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
        let mut cum = 0u128;
        weights
            .iter()
            .map(|&w| {
                let before = cum * u128::from(total) / sum;
                cum += u128::from(w);
                (cum * u128::from(total) / sum - before) as u64
            })
            .collect()
    }

    proptest! {
        #[test]
        fn every_path_matches_the_reference_split(
            total in prop_oneof![0u64..2_000, 0u64..50_000_000, 0u64..1 << 40],
            weights in prop::collection::vec(
                prop_oneof![1u64..4, 1u64..10_000_000_000, 1u64..1 << 50],
                1..300,
            ),
        ) {
                let mut shares = vec![0; weights.len()];
            split(total, &weights, &mut shares);
            prop_assert_eq!(shares, reference_split(total, &weights));
        }
    }

    proptest! {
        #[test]
        fn shares_sum_to_the_total_exactly(
            total in 0u64..50_000_000,
            weights in prop::collection::vec(1u64..10_000_000_000, 1..300),
        ) {
                let mut shares = vec![0; weights.len()];
            split(total, &weights, &mut shares);
            prop_assert_eq!(shares.iter().sum::<u64>(), total);
            let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
            for (w, share) in weights.iter().zip(&shares) {
                let exact = u128::from(*w) * u128::from(total);
                // Each share is its exact share rounded down or up.
                prop_assert!(u128::from(*share) * sum <= exact + sum);
                prop_assert!(u128::from(*share) * sum + sum > exact);
            }
        }
    }
}
