//! A latency histogram with fixed buckets in integer microseconds, as a
//! replica keeps its TTFT and inter-token times and `/metrics` renders
//! them (Prometheus buckets, cumulative). Below both [`crate::replica`]
//! and [`crate::metrics`], which use it.

use std::fmt::Write as _;

/// Upper bounds of the latency buckets, microseconds.
const BOUNDS: [u64; 16] = [
    1_000, 5_000, 10_000, 20_000, 40_000, 60_000, 80_000, 100_000, 250_000, 500_000, 750_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 40_000_000,
];

/// A latency histogram with fixed buckets, in integer microseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Histogram {
    counts: [u64; BOUNDS.len()],
    count: u64,
    sum_micros: u64,
}

impl Histogram {
    /// Records `n` observations of `micros`.
    pub fn observe_micros(&mut self, micros: u64, n: u64) {
        if n == 0 {
            return;
        }
        if let Some(i) = BOUNDS.iter().position(|&b| micros <= b) {
            self.counts[i] += n;
        }
        self.count += n;
        self.sum_micros += micros * n;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub(crate) fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (bound, c) in BOUNDS.iter().zip(self.counts) {
            cumulative += c;
            let le = *bound as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {}",
            self.sum_micros as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::default();
        h.observe_micros(900, 2);
        h.observe_micros(30_000, 1);
        let mut out = String::new();
        h.render(&mut out, "x", "a=\"b\"");
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.001\"} 2"), "{out}");
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.04\"} 3"), "{out}");
        assert!(out.contains("x_count{a=\"b\"} 3"), "{out}");
    }
}
