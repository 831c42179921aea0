//! What a generator has produced so far, per tenant and model: the figures
//! billing should show for the sample, kept exactly (integers, GPU time in
//! micro-GPU-seconds) while generating.

use std::fmt;

use rust_decimal::Decimal;
use usage_contract::GPU_SECONDS_SCALE;

/// Sums over a set of events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// Sum of `gpu_seconds`.
    pub gpu_seconds: Decimal,
    /// Sum of `preempted_gpu_seconds` (part of `gpu_seconds`).
    pub preempted_gpu_seconds: Decimal,
    /// The part of `gpu_seconds` that started in an off-peak hour of the
    /// price book ([`is_off_peak`](crate::diurnal::is_off_peak)).
    pub off_peak_gpu_seconds: Decimal,
}

/// One model's totals within a tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelTotals {
    pub model: String,
    pub totals: Totals,
}

/// One tenant's totals, and the same per model it called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantTotals {
    pub tenant: String,
    pub totals: Totals,
    pub models: Vec<ModelTotals>,
}

/// Per-tenant totals of what a [`Generator`](crate::Generator) has yielded,
/// in the order of its tenants. `Display` prints it as a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub tenants: Vec<TenantTotals>,
}

impl Summary {
    /// The totals of tenant `name`.
    pub fn tenant(&self, name: &str) -> Option<&TenantTotals> {
        self.tenants.iter().find(|t| t.tenant == name)
    }

    /// The totals over every tenant.
    pub fn total(&self) -> Totals {
        let mut all = Totals::default();
        for t in &self.tenants {
            all.add(&t.totals);
        }
        all
    }

    /// Total GPU-hours, exact (GPU-seconds / 3,600, rounded to 6 places).
    pub fn gpu_hours(&self) -> Decimal {
        (self.total().gpu_seconds / Decimal::from(3_600)).round_dp(GPU_SECONDS_SCALE)
    }
}

impl Totals {
    fn add(&mut self, other: &Totals) {
        self.requests += other.requests;
        self.prompt_tokens += other.prompt_tokens;
        self.cached_tokens += other.cached_tokens;
        self.completion_tokens += other.completion_tokens;
        self.gpu_seconds += other.gpu_seconds;
        self.preempted_gpu_seconds += other.preempted_gpu_seconds;
        self.off_peak_gpu_seconds += other.off_peak_gpu_seconds;
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<18} {:>9} {:>14} {:>14} {:>13} {:>18} {:>18}",
            "tenant",
            "requests",
            "prompt tok",
            "cached tok",
            "output tok",
            "GPU-seconds",
            "off-peak GPU-s"
        )?;
        let total = self.total();
        let rows = self.tenants.iter().map(|t| (t.tenant.as_str(), &t.totals));
        for (name, t) in rows.chain([("total", &total)]) {
            writeln!(
                f,
                "{:<18} {:>9} {:>14} {:>14} {:>13} {:>18} {:>18}",
                name,
                t.requests,
                t.prompt_tokens,
                t.cached_tokens,
                t.completion_tokens,
                t.gpu_seconds,
                t.off_peak_gpu_seconds
            )?;
        }
        write!(f, "GPU-hours: {}", self.gpu_hours())
    }
}

/// The running tally a generator keeps: integers only, per tenant × model.
#[derive(Debug, Clone)]
pub(crate) struct Tally {
    tenants: Vec<(String, Vec<(String, Counts)>)>,
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counts {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub gpu_micros: u64,
    pub preempted_micros: u64,
    pub off_peak_micros: u64,
}

impl Tally {
    /// A zero tally for `tenants`, each with its models.
    pub(crate) fn new(tenants: Vec<(String, Vec<String>)>) -> Self {
        Self {
            tenants: tenants
                .into_iter()
                .map(|(t, models)| {
                    (
                        t,
                        models.into_iter().map(|m| (m, Counts::default())).collect(),
                    )
                })
                .collect(),
        }
    }

    /// The counts of a tenant's `share`-th model.
    pub(crate) fn counts(&mut self, tenant: usize, share: usize) -> Option<&mut Counts> {
        self.tenants
            .get_mut(tenant)
            .and_then(|(_, models)| models.get_mut(share))
            .map(|(_, c)| c)
    }

    pub(crate) fn summary(&self) -> Summary {
        let tenants = self
            .tenants
            .iter()
            .map(|(tenant, models)| {
                let models: Vec<ModelTotals> = models
                    .iter()
                    .map(|(model, c)| ModelTotals {
                        model: model.clone(),
                        totals: c.totals(),
                    })
                    .collect();
                let mut totals = Totals::default();
                for m in &models {
                    totals.add(&m.totals);
                }
                TenantTotals {
                    tenant: tenant.clone(),
                    totals,
                    models,
                }
            })
            .collect();
        Summary { tenants }
    }
}

impl Counts {
    fn totals(&self) -> Totals {
        let seconds = |micros: u64| Decimal::from_i128_with_scale(i128::from(micros), 6);
        Totals {
            requests: self.requests,
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            completion_tokens: self.completion_tokens,
            gpu_seconds: seconds(self.gpu_micros),
            preempted_gpu_seconds: seconds(self.preempted_micros),
            off_peak_gpu_seconds: seconds(self.off_peak_micros),
        }
    }
}
