//! Service-level objectives: the typed `slo:` of a tenant, and the sliding
//! 60 s window of its requests' TTFT and end-to-end latency that says how
//! it is doing — p50/p95/p99 and the compliance ratio of each metric (the
//! share of the window's requests within the objective; for availability,
//! the share that did not fail).
//!
//! Percentiles are nearest-rank over the window's samples: the p-th
//! percentile of n sorted samples is the one at rank ⌈p/100 × n⌉. Only
//! integers: latencies in milliseconds, availability in basis points.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How far back the window reaches.
pub const WINDOW: Duration = Duration::from_secs(60);

/// A tenant's objectives; `None` is no objective for that metric.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Slo {
    /// TTFT p95 under this, ms.
    pub ttft_p95_ms: Option<u32>,
    /// End-to-end p95 under this, ms.
    pub e2e_p95_ms: Option<u32>,
    /// Requests that must not fail, in basis points (99.9% = 9,990).
    pub availability_bp: Option<u32>,
}

/// Why an `slo:` block is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SloError {
    #[error("slo.{field} must be between 1 and {max}, got {got}")]
    OutOfRange {
        field: &'static str,
        max: u64,
        got: u64,
    },
    #[error("slo.availability must be a percentage like \"99.9\" (above 0, at most 100, two decimals at most), got {0:?}")]
    Availability(String),
    #[error("slo.bestEffort cannot be combined with targets ({0})")]
    BestEffortWithTargets(&'static str),
}

impl Slo {
    /// Checks and builds an objective: latencies 1 ms to 1 hour; an
    /// availability percentage as text (`"99.9"`, exact, two decimals at
    /// most); best effort excludes every target.
    pub fn new(
        ttft_p95_ms: Option<u32>,
        e2e_p95_ms: Option<u32>,
        availability: Option<&str>,
        best_effort: bool,
    ) -> Result<Self, SloError> {
        for (field, v) in [("ttftP95Ms", ttft_p95_ms), ("e2eP95Ms", e2e_p95_ms)] {
            if let Some(v) = v {
                if !(1..=3_600_000).contains(&v) {
                    return Err(SloError::OutOfRange {
                        field,
                        max: 3_600_000,
                        got: u64::from(v),
                    });
                }
            }
        }
        let availability_bp = availability.map(parse_percent).transpose()?;
        if best_effort {
            let set = [
                ("ttftP95Ms", ttft_p95_ms.is_some()),
                ("e2eP95Ms", e2e_p95_ms.is_some()),
                ("availability", availability_bp.is_some()),
            ];
            if let Some((name, _)) = set.iter().find(|(_, s)| *s) {
                return Err(SloError::BestEffortWithTargets(name));
            }
        }
        Ok(Self {
            ttft_p95_ms,
            e2e_p95_ms,
            availability_bp,
        })
    }
}

/// `"99.9"` → 9,990 basis points.
fn parse_percent(text: &str) -> Result<u32, SloError> {
    let bad = || SloError::Availability(text.to_owned());
    let (whole, frac) = text.trim().split_once('.').unwrap_or((text.trim(), ""));
    if whole.is_empty() || frac.len() > 2 || !frac.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    let whole: u32 = whole.parse().map_err(|_| bad())?;
    let frac: u32 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<2}").parse().map_err(|_| bad())?
    };
    let bp = whole
        .checked_mul(100)
        .and_then(|w| w.checked_add(frac))
        .ok_or_else(bad)?;
    if bp == 0 || bp > 10_000 {
        return Err(bad());
    }
    Ok(bp)
}

/// p50, p95, p99 of one metric, ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Percentiles {
    pub p50: u64,
    pub p95: u64,
    pub p99: u64,
}

/// One tenant's window at a moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub requests: usize,
    /// Over the requests that produced a first token.
    pub ttft: Option<Percentiles>,
    pub e2e: Option<Percentiles>,
    /// Share of requests with TTFT within the objective, in [0, 1].
    pub ttft_compliance: Option<f64>,
    pub e2e_compliance: Option<f64>,
    /// Share of requests that did not fail.
    pub availability: Option<f64>,
    pub slo: Slo,
    /// The tenant's priority.
    pub priority: i16,
}

impl Report {
    /// How close the window's p95 is to its objective, per mille (the
    /// worse of TTFT and end-to-end; 1,000 = at the objective); `None`
    /// without an objective or without requests.
    pub fn pressure_permille(&self) -> Option<u32> {
        let ratio = |p: Option<Percentiles>, objective: Option<u32>| {
            let (p, o) = (p?, objective?);
            Some(u32::try_from(p.p95 * 1_000 / u64::from(o.max(1))).unwrap_or(u32::MAX))
        };
        match (
            ratio(self.ttft, self.slo.ttft_p95_ms),
            ratio(self.e2e, self.slo.e2e_p95_ms),
        ) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).max(b.unwrap_or(0))),
        }
    }
}

/// The nearest-rank percentile of sorted `v` (not empty).
fn rank(v: &[u64], p: u64) -> u64 {
    let n = v.len() as u64;
    let r = (p * n).div_ceil(100).max(1);
    v[(r - 1) as usize]
}

fn percentiles(mut v: Vec<u64>) -> Option<Percentiles> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(Percentiles {
        p50: rank(&v, 50),
        p95: rank(&v, 95),
        p99: rank(&v, 99),
    })
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    ttft_ms: Option<u64>,
    e2e_ms: u64,
    failed: bool,
}

/// Every tenant's window.
#[derive(Debug, Default)]
pub struct Windows {
    tenants: Mutex<HashMap<String, TenantWindow>>,
}

/// A tenant's objectives and priority (as of its latest request) and its samples.
#[derive(Debug, Default)]
struct TenantWindow {
    slo: Slo,
    priority: i16,
    samples: VecDeque<Sample>,
}

impl Windows {
    /// A request of `tenant` (whose objectives are `slo`, at `priority`)
    /// ended at `now`.
    #[allow(clippy::too_many_arguments, reason = "one sample's fields")]
    pub fn record(
        &self,
        tenant: &str,
        slo: Slo,
        priority: i16,
        ttft_ms: Option<u64>,
        e2e_ms: u64,
        failed: bool,
        now: Instant,
    ) {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        let t = tenants.entry(tenant.to_owned()).or_default();
        t.slo = slo;
        t.priority = priority;
        let w = &mut t.samples;
        w.push_back(Sample {
            at: now,
            ttft_ms,
            e2e_ms,
            failed,
        });
        while w
            .front()
            .is_some_and(|s| now.saturating_duration_since(s.at) > WINDOW)
        {
            w.pop_front();
        }
    }

    /// The tenants that have a window.
    pub fn tenants(&self) -> Vec<String> {
        let tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        tenants.keys().cloned().collect()
    }

    /// `tenant`'s window at `now`, measured against its objectives.
    pub fn report(&self, tenant: &str, now: Instant) -> Report {
        let (slo, priority, samples): (Slo, i16, Vec<Sample>) = {
            let tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
            tenants
                .get(tenant)
                .map(|t| {
                    let recent = t
                        .samples
                        .iter()
                        .filter(|s| now.saturating_duration_since(s.at) <= WINDOW)
                        .copied()
                        .collect();
                    (t.slo, t.priority, recent)
                })
                .unwrap_or_default()
        };
        let n = samples.len();
        let ttfts: Vec<u64> = samples.iter().filter_map(|s| s.ttft_ms).collect();
        let share = |hits: usize, of: usize| (of > 0).then(|| hits as f64 / of as f64);
        let ttft_compliance = slo.ttft_p95_ms.and_then(|t| {
            share(
                ttfts.iter().filter(|v| **v <= u64::from(t)).count(),
                ttfts.len(),
            )
        });
        let e2e_compliance = slo.e2e_p95_ms.and_then(|t| {
            share(
                samples.iter().filter(|s| s.e2e_ms <= u64::from(t)).count(),
                n,
            )
        });
        Report {
            requests: n,
            ttft: percentiles(ttfts),
            e2e: percentiles(samples.iter().map(|s| s.e2e_ms).collect()),
            ttft_compliance,
            e2e_compliance,
            availability: share(samples.iter().filter(|s| !s.failed).count(), n),
            slo,
            priority,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_reference_slos_parse_and_bad_ones_name_the_field() {
        let acme = Slo::new(Some(200), Some(500), Some("99.9"), false).unwrap();
        assert_eq!(acme.availability_bp, Some(9_990));
        assert_eq!(
            Slo::new(None, Some(30_000), Some("95"), false)
                .unwrap()
                .availability_bp,
            Some(9_500)
        );
        assert_eq!(Slo::new(None, None, None, true).unwrap(), Slo::default());
        assert!(matches!(
            Slo::new(Some(0), None, None, false),
            Err(SloError::OutOfRange {
                field: "ttftP95Ms",
                ..
            })
        ));
        for bad in ["100.01", "0", "99.999", "abc", "", "-1", "99.x"] {
            assert!(
                matches!(
                    Slo::new(None, None, Some(bad), false),
                    Err(SloError::Availability(_))
                ),
                "{bad}"
            );
        }
        assert_eq!(
            Slo::new(Some(200), None, None, true),
            Err(SloError::BestEffortWithTargets("ttftP95Ms"))
        );
    }

    #[test]
    fn compliance_and_the_window_moving_on() {
        let w = Windows::default();
        let t0 = Instant::now();
        let slo = Slo::new(Some(200), Some(500), Some("99.0"), false).unwrap();
        for i in 0..100u64 {
            // TTFT 10..=1000 ms: 20 of 100 within 200 ms; e2e 300 + 10 i.
            w.record(
                "acme",
                slo,
                5,
                Some(10 * (i + 1)),
                300 + 10 * i,
                i == 99,
                t0,
            );
        }
        let r = w.report("acme", t0);
        assert_eq!(r.requests, 100);
        assert_eq!(r.ttft_compliance, Some(0.2));
        assert_eq!(r.e2e_compliance, Some(0.21), "300..=500 ms: 21 of 100");
        assert_eq!(r.availability, Some(0.99));
        assert_eq!(r.ttft.unwrap().p95, 950);
        // p95 TTFT 950 ms against 200 ms; e2e p95 1,240 ms against 500 ms.
        assert_eq!(r.pressure_permille(), Some(4_750));
        let later = w.report("acme", t0 + WINDOW + Duration::from_secs(1));
        assert_eq!(later.requests, 0);
        assert_eq!(later.ttft, None);
        assert_eq!(later.availability, None, "no requests, no ratio");
    }

    proptest! {
        /// The window's percentiles are those of a plain sort of the same
        /// samples, by nearest rank.
        #[test]
        fn percentiles_match_a_reference_computation(
            v in proptest::collection::vec(0u64..100_000, 1..500)
        ) {
            let w = Windows::default();
            let t0 = Instant::now();
            for e2e in &v {
                w.record("t", Slo::default(), 3, Some(*e2e / 2), *e2e, false, t0);
            }
            let mut sorted = v.clone();
            sorted.sort_unstable();
            let reference = |p: f64| sorted[((p / 100.0 * sorted.len() as f64).ceil() as usize).max(1) - 1];
            let got = w.report("t", t0).e2e.unwrap();
            prop_assert_eq!(got.p50, reference(50.0));
            prop_assert_eq!(got.p95, reference(95.0));
            prop_assert_eq!(got.p99, reference(99.0));
        }
    }
}
