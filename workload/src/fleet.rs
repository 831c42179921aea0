//! The fleet a sample is served by: the engine's model profiles, and how
//! many requests share a replica at once — the calibration of GPU time.
//!
//! A request's GPU time in a real fleet is its replica's busy wall time
//! shared among the requests batched with it:
//!
//! ```text
//! gpu_seconds = gpus × busy_seconds / concurrency
//! busy_seconds = prefill + (produced − 1) × TPOT  (+ work thrown away when preempted)
//! ```
//!
//! with prefill and TPOT from the profile's roofline (`engine::profile`): a
//! prefill of the uncached prompt, and a decode step of `concurrency`
//! sequences that reads the weights once and each sequence's KV.
//!
//! **Calibration.** The demo backfills ~1.5M requests over a 30-day month,
//! 0.58 requests/s, a small sample of the reference's 83/s. Served by one
//! replica per model, Little's law puts 4–5 requests in flight on the 70B
//! replica on average (0.39 requests/s × ~12 s each) and about twice that
//! at the daily peak, so [`DEFAULT_CONCURRENCY`] is 4 for every model. For
//! 1.5M requests in 30 days (seed 1) that is 3,505 GPU-hours: 2,001 for
//! acme-corp, 612 medai-labs, 91 finserv-team, 211 research-squad, 590
//! codegen-platform. Rated by the reference price book, finserv-team's and
//! research-squad's GPU-hours ($176, $285) outweigh their share of the
//! $2,800 overhead pool (split by GPU-seconds: $73, $169), and
//! codegen-platform's, mostly off-peak ($450), about equal it ($471). The
//! token-billed tenants' charges do not depend on GPU time at all:
//! acme-corp's $1,149 and medai-labs' $339 of tokens carry $1,599 and $489
//! of the pool whatever the concurrency, so the pool is a minority of
//! their invoices only from ~2.2M events a month. A fleet batching 16
//! requests per replica would bill a quarter of the GPU time; set
//! [`FleetModel::concurrency`] to model it.

use engine::profile::StepCosts;
use engine::ModelProfile;

/// Requests in flight on a replica, every model, by default (see the
/// module docs for the calibration).
pub const DEFAULT_CONCURRENCY: u32 = 4;

/// The models a sample's requests run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fleet {
    pub models: Vec<FleetModel>,
}

/// One model: its profile, and how many requests share its replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetModel {
    /// The engine's profile: GPUs, roofline, version, longest context.
    pub profile: ModelProfile,
    /// Requests batched together on the replica; a request is billed
    /// `1 / concurrency` of the replica's GPU time while it runs.
    pub concurrency: u32,
    /// `replica_id` on its events.
    pub replica_id: String,
}

impl Fleet {
    /// The engine's reference profiles (8B on 1 GPU, 70B on 4, 405B on 8)
    /// at [`DEFAULT_CONCURRENCY`], replicas named `backfill-<model>`.
    pub fn reference() -> Self {
        Self::with_concurrency(DEFAULT_CONCURRENCY)
    }

    /// The reference profiles, every model at `concurrency`.
    pub fn with_concurrency(concurrency: u32) -> Self {
        Self {
            models: ModelProfile::reference()
                .into_iter()
                .map(|profile| FleetModel {
                    replica_id: format!("backfill-{}", profile.name),
                    profile,
                    concurrency,
                })
                .collect(),
        }
    }

    /// The model named `name`.
    pub fn model(&self, name: &str) -> Option<&FleetModel> {
        self.models.iter().find(|m| m.profile.name == name)
    }
}

impl FleetModel {
    /// Prefill of `uncached` new tokens attending to a `prompt`-token
    /// context, unchunked, µs.
    pub(crate) fn prefill_micros(costs: &StepCosts, uncached: u64, prompt: u64) -> u64 {
        costs.step_micros(uncached, prompt)
    }

    /// One decode step of `concurrency` sequences of `context` tokens each, µs.
    pub(crate) fn tpot_micros(costs: &StepCosts, concurrency: u32, context: u64) -> u64 {
        let c = u64::from(concurrency);
        costs.step_micros(c, c.saturating_mul(context))
    }

    /// `gpus × busy / concurrency` in micro-GPU-seconds, rounded half up.
    pub(crate) fn share_micros(gpus: u32, concurrency: u32, busy_micros: u64) -> u64 {
        let c = u128::from(concurrency.max(1));
        let total = u128::from(gpus) * u128::from(busy_micros);
        u64::try_from((2 * total + c) / (2 * c)).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_70b_decode_step_at_the_default_concurrency_takes_about_27_ms() {
        let fleet = Fleet::reference();
        let m = fleet.model("llama-3.1-70b").unwrap();
        let us = FleetModel::tpot_micros(&m.profile.costs(), m.concurrency, 1_500);
        assert!((26_000..=28_000).contains(&us), "{us} µs");
    }

    #[test]
    fn gpu_share_is_gpus_times_busy_over_concurrency() {
        assert_eq!(FleetModel::share_micros(4, 4, 1_000_000), 1_000_000);
        assert_eq!(FleetModel::share_micros(8, 3, 1), 3); // 2.67 → 3
        assert_eq!(FleetModel::share_micros(1, 4, 1), 0); // 0.25 → 0
        assert_eq!(FleetModel::share_micros(1, 4, 2), 1); // 0.5 → 1
    }
}
