//! Latency samples read at quantiles: sorted once, each quantile the
//! nearest rank (`round((n - 1) × q)`), so p50 of an even count is the
//! upper middle sample and `at(1.0)` the largest.

use std::time::Duration;

/// Samples (milliseconds, or whatever unit they were given in), sorted.
#[derive(Debug, Clone, Default)]
pub struct Percentiles {
    sorted: Vec<f64>,
}

impl Percentiles {
    pub fn new(mut samples: Vec<f64>) -> Self {
        samples.sort_by(f64::total_cmp);
        Self { sorted: samples }
    }

    /// Durations as milliseconds.
    pub fn of_durations_ms(durations: &[Duration]) -> Self {
        Self::new(durations.iter().map(|d| d.as_secs_f64() * 1000.0).collect())
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The samples, smallest first.
    pub fn samples(&self) -> &[f64] {
        &self.sorted
    }

    /// The sample at quantile `q` (0.0 to 1.0); NaN without samples.
    pub fn at(&self, q: f64) -> f64 {
        let Some(last) = self.sorted.len().checked_sub(1) else {
            return f64::NAN;
        };
        let i = (last as f64 * q.clamp(0.0, 1.0)).round() as usize;
        self.sorted[i.min(last)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_the_nearest_rank() {
        let p = Percentiles::new((1..=101).rev().map(f64::from).collect());
        assert_eq!(p.at(0.0), 1.0);
        assert_eq!(p.at(0.5), 51.0);
        assert_eq!(p.at(0.99), 100.0);
        assert_eq!(p.at(1.0), 101.0);
    }

    #[test]
    fn no_samples_read_as_nan() {
        assert!(Percentiles::default().at(0.5).is_nan());
    }
}
