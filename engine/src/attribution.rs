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
        let mut given = 0u64;
        self.remainders.clear();
        let fast = u64::try_from(sum)
            .ok()
            .filter(|_| weights.iter().all(|&w| w.checked_mul(total).is_some()));
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
        // Usually (remainder, position) packs into one u64 ordered by
        // remainder, then earlier position: selecting on plain integers is
        // several times faster than on tuples.
        if sum < 1 << 43 && n < 1 << 20 {
            self.packed.clear();
            self.packed.extend(
                self.remainders
                    .iter()
                    .map(|&(r, i)| ((r as u64) << 20) | u64::from(0xF_FFFF - i)),
            );
            if left < n {
                self.packed
                    .select_nth_unstable_by(left - 1, |a, b| b.cmp(a));
            }
            for &p in &self.packed[..left] {
                shares[(0xF_FFFF - (p & 0xF_FFFF)) as usize] += 1;
            }
            return;
        }
        let by_remainder = |a: &(u128, u32), b: &(u128, u32)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
        if left < n {
            self.remainders
                .select_nth_unstable_by(left - 1, by_remainder);
        }
        for &(_, i) in &self.remainders[..left] {
            shares[i as usize] += 1;
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
