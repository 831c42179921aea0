//! GPU-second attribution: a step's busy time × the replica's GPUs, in
//! integer micro-GPU-seconds, split among the step's requests in proportion
//! to their work in it by the largest-remainder method. The shares always
//! sum to the whole, exactly, so the replica's attributed GPU-seconds equal
//! its busy GPU-seconds with nothing lost to rounding. Idle time is never
//! attributed; the replica reports it separately.

use rust_decimal::Decimal;

/// Micro-GPU-seconds as the usage contract's exact decimal (6 places).
pub fn to_gpu_seconds(micros: u64) -> Decimal {
    Decimal::from_i128_with_scale(i128::from(micros), 6)
}

/// Reusable scratch space for [`Splitter::split`], so the step loop does
/// not allocate.
#[derive(Debug, Default)]
pub struct Splitter {
    remainders: Vec<(u128, u32)>,
    packed: Vec<u64>,
}

impl Splitter {
    /// Splits `total` among `weights` (each > 0) in proportion, writing each
    /// share into `shares` (same length). The shares sum to `total` exactly:
    /// each gets the floor of its exact share, and the units left over go
    /// one each to the largest remainders (ties to the earlier position).
    pub fn split(&mut self, total: u64, weights: &[u64], shares: &mut [u64]) {
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
        let fits = weights.iter().all(|&w| w.checked_mul(total).is_some());
        // The common case: products fit a u64 and (remainder, position)
        // packs into one u64 ordered by remainder, then earlier position;
        // selecting on plain integers is several times faster than on tuples.
        if fits && sum < 1 << 43 && weights.len() < 1 << 20 {
            self.split_packed(total, sum as u64, weights, shares);
            return;
        }
        let mut given = 0u64;
        self.remainders.clear();
        let fast = u64::try_from(sum).ok().filter(|_| fits);
        for (i, (&w, share)) in weights.iter().zip(shares.iter_mut()).enumerate() {
            let (q, r) = match fast {
                Some(s) => {
                    let p = w * total;
                    (p / s, u128::from(p % s))
                }
                None => {
                    let p = u128::from(w) * u128::from(total);
                    // p / sum ≤ total, so it fits.
                    ((p / sum) as u64, p % sum)
                }
            };
            *share = q;
            given += q;
            self.remainders.push((r, i as u32));
        }
        let left = (total - given) as usize;
        if left == 0 {
            return;
        }
        let n = self.remainders.len();
        let by_remainder = |a: &(u128, u32), b: &(u128, u32)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
        if left < n {
            self.remainders
                .select_nth_unstable_by(left - 1, by_remainder);
        }
        for &(_, i) in &self.remainders[..left] {
            shares[i as usize] += 1;
        }
    }

    /// [`split`](Self::split) when every `w × total` fits a u64, `sum` is
    /// below 2^43 and there are fewer than 2^20 weights: no u128 work, and
    /// remainders go straight into their packed form.
    fn split_packed(&mut self, total: u64, sum: u64, weights: &[u64], shares: &mut [u64]) {
        let mut given = 0u64;
        self.packed.clear();
        for (i, (&w, share)) in weights.iter().zip(shares.iter_mut()).enumerate() {
            let p = w * total;
            let (q, r) = (p / sum, p % sum);
            *share = q;
            given += q;
            self.packed.push((r << 20) | (0xF_FFFF - i as u64));
        }
        let left = (total - given) as usize;
        if left == 0 {
            return;
        }
        if left < self.packed.len() {
            self.packed
                .select_nth_unstable_by(left - 1, |a, b| b.cmp(a));
        }
        for &p in &self.packed[..left] {
            shares[(0xF_FFFF - (p & 0xF_FFFF)) as usize] += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn leftovers_go_to_the_largest_remainders() {
        let mut s = Splitter::default();
        let mut shares = [0; 3];
        s.split(10, &[1, 1, 1], &mut shares);
        assert_eq!(shares, [4, 3, 3]);
        s.split(100, &[1, 2, 7], &mut shares);
        assert_eq!(shares, [10, 20, 70]);
        s.split(5, &[1, 3, 1], &mut shares);
        assert_eq!(shares, [1, 3, 1]);
        // Huge weights take the tuple path and agree.
        let w = 1u64 << 50;
        s.split(10, &[w, w, w], &mut shares);
        assert_eq!(shares, [4, 3, 3]);
    }

    #[test]
    fn micros_become_six_place_decimals() {
        assert_eq!(to_gpu_seconds(1_234_567).to_string(), "1.234567");
    }

    /// The largest-remainder split written the obvious way.
    fn reference_split(total: u64, weights: &[u64]) -> Vec<u64> {
        let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
        let mut shares = Vec::new();
        let mut rems = Vec::new();
        for (i, &w) in weights.iter().enumerate() {
            let p = u128::from(w) * u128::from(total);
            shares.push((p / sum) as u64);
            rems.push((p % sum, i));
        }
        let left = total - shares.iter().sum::<u64>();
        rems.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, i) in &rems[..left as usize] {
            shares[i] += 1;
        }
        shares
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
            let mut s = Splitter::default();
            let mut shares = vec![0; weights.len()];
            s.split(total, &weights, &mut shares);
            prop_assert_eq!(shares, reference_split(total, &weights));
        }
    }

    proptest! {
        #[test]
        fn shares_sum_to_the_total_exactly(
            total in 0u64..50_000_000,
            weights in prop::collection::vec(1u64..10_000_000_000, 1..300),
        ) {
            let mut s = Splitter::default();
            let mut shares = vec![0; weights.len()];
            s.split(total, &weights, &mut shares);
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
