//! One request's figures: tokens, how it ended, its timings and its GPU
//! time, drawn for a tenant and a model.
//!
//! - Prompt and output lengths are lognormal with the reference's p50/p95
//!   (prompts 800/6,000, outputs 300/1,200), clamped to the tenant's limits
//!   and the model's context: a prompt leaves room for one output token,
//!   and an output that would pass `min(maxOutput, context − prompt)` is
//!   cut there and ends `length`.
//! - [`ERROR_PER_MILLE`] requests fail mid-way (`error`): like the gateway
//!   when the engine could not report, no cached tokens and the profile's
//!   roofline estimate of GPU time (`ModelProfile::estimated_gpu_seconds`).
//!   [`CANCELLED_PER_MILLE`] are cancelled by the client (`cancelled`)
//!   after a uniform share of their output, billed what they used.
//! - Timings: a queue wait (exponential, the tenant's mean), the prefill,
//!   then one decode step per further token; a preempted request also
//!   redoes its prefill and the tokens it had, after a second wait. Times
//!   are rounded up to the millisecond; `ttft_ms` and `tpot_ms` follow from
//!   them as the gateway computes them.
//! - GPU time is [`FleetModel`]'s share of the busy time, in integer
//!   micro-GPU-seconds; `preempted` is the thrown-away part of it.
//!
//! Floats only draw the samples; every figure that is billed is an integer.

use engine::profile::{StepCosts, BLOCK_TOKENS};
use rand::Rng;
use usage_contract::FinishReason;

use crate::fleet::FleetModel;
use crate::tenants::Tenant;

/// Prompt tokens, median (`../shared/REFERENCE.md`, traffic shape).
pub const PROMPT_P50: f64 = 800.0;
/// Prompt tokens, 95th percentile.
pub const PROMPT_P95: f64 = 6_000.0;
/// Output tokens, median.
pub const OUTPUT_P50: f64 = 300.0;
/// Output tokens, 95th percentile.
pub const OUTPUT_P95: f64 = 1_200.0;
/// Requests per thousand that fail mid-way.
pub const ERROR_PER_MILLE: u32 = 2;
/// Requests per thousand the client cancels.
pub const CANCELLED_PER_MILLE: u32 = 10;
/// Mean wait before a preempted request is scheduled again, milliseconds.
const REQUEUE_MEAN_MS: f64 = 200.0;
/// The 95th percentile of a standard normal.
const Z95: f64 = 1.644_853_626_951_472_2;

/// What one request used and how long it took, relative to its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Figures {
    pub prompt: u64,
    pub cached: u64,
    pub completion: u64,
    pub finish: FinishReason,
    pub stream: bool,
    /// Milliseconds from the start to the first token, if there was one.
    pub first_token_ms: Option<u64>,
    /// Milliseconds from the start to the end.
    pub total_ms: u64,
    pub tpot_ms: Option<u64>,
    pub gpu_micros: u64,
    pub preempted_micros: u64,
}

/// A lognormal law given by its median and 95th percentile.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogNormal {
    mu: f64,
    sigma: f64,
}

impl LogNormal {
    pub(crate) fn new(p50: f64, p95: f64) -> Self {
        Self {
            mu: p50.ln(),
            sigma: (p95 / p50).ln() / Z95,
        }
    }

    fn sample(&self, rng: &mut impl Rng) -> f64 {
        (self.mu + self.sigma * standard_normal(rng)).exp()
    }
}

/// The two token laws every tenant shares.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lengths {
    pub prompt: LogNormal,
    pub output: LogNormal,
}

impl Lengths {
    pub(crate) fn reference() -> Self {
        Self {
            prompt: LogNormal::new(PROMPT_P50, PROMPT_P95),
            output: LogNormal::new(OUTPUT_P50, OUTPUT_P95),
        }
    }
}

/// Box–Muller, one value per call.
fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u1 = 1.0 - rng.random::<f64>(); // (0, 1]: ln is finite
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Exponential with the given mean, in whole microseconds.
fn exponential_micros(rng: &mut impl Rng, mean_ms: f64) -> u64 {
    let u = 1.0 - rng.random::<f64>();
    (-u.ln() * mean_ms * 1_000.0) as u64
}

fn percent(rng: &mut impl Rng, p: u32) -> bool {
    rng.random_range(0..100) < p
}

/// Draws one request of `tenant` on `model` (`costs` is its profile's roofline).
pub(crate) fn draw(
    rng: &mut impl Rng,
    lengths: &Lengths,
    tenant: &Tenant,
    model: &FleetModel,
    costs: &StepCosts,
) -> Figures {
    let limit = u64::from(tenant.max_context.min(model.profile.max_context)).max(2);
    let prompt = (lengths.prompt.sample(rng).round() as u64).clamp(1, limit - 1);
    let cache = tenant.cache;
    let mut cached = 0;
    if percent(rng, cache.hit_percent) {
        let lo = cache.min_share_percent.min(cache.max_share_percent);
        let share = u64::from(rng.random_range(lo..=cache.max_share_percent.min(100)));
        let block = u64::from(BLOCK_TOKENS);
        cached = (prompt * share / 100 / block * block).min(prompt - 1);
    }
    let planned = (lengths.output.sample(rng).round() as u64).max(1);
    let cap = u64::from(tenant.max_output).min(limit - prompt).max(1);
    let natural = planned.min(cap);
    let stream = percent(rng, tenant.stream_percent);
    let roll = rng.random_range(0..1_000);
    let queue_us = exponential_micros(rng, f64::from(tenant.queue_mean_ms));
    let (gpus, concurrency) = (model.profile.gpus, model.concurrency);

    if roll < ERROR_PER_MILLE {
        let produced = rng.random_range(0..=natural / 2);
        let prefill_us = FleetModel::prefill_micros(costs, prompt, prompt);
        let tpot_us = FleetModel::tpot_micros(costs, concurrency, prompt + produced / 2);
        let wall_us = queue_us + prefill_us + produced.saturating_sub(1) * tpot_us;
        let mut estimate = model.profile.estimated_gpu_seconds(prompt, produced);
        estimate.rescale(usage_contract::GPU_SECONDS_SCALE);
        return Figures {
            prompt,
            cached: 0,
            completion: produced,
            finish: FinishReason::Error,
            stream,
            first_token_ms: (produced > 0).then(|| (queue_us + prefill_us).div_ceil(1_000)),
            total_ms: wall_us.div_ceil(1_000),
            tpot_ms: None,
            gpu_micros: u64::try_from(estimate.mantissa()).unwrap_or(0),
            preempted_micros: 0,
        };
    }

    let (produced, finish) = if roll < ERROR_PER_MILLE + CANCELLED_PER_MILLE {
        (rng.random_range(0..natural), FinishReason::Cancelled)
    } else if planned > cap {
        (cap, FinishReason::Length)
    } else {
        (planned, FinishReason::Stop)
    };
    let uncached = prompt - cached;
    let prefill_us = FleetModel::prefill_micros(costs, uncached, prompt);
    let tpot_us = FleetModel::tpot_micros(costs, concurrency, prompt + produced / 2);
    let (mut busy_us, mut wall_us, mut wasted_us) = (0, queue_us, 0);
    if produced == 0 {
        // Cancelled during its prefill.
        busy_us = prefill_us * rng.random_range(0..=100) / 100;
        wall_us += busy_us;
    } else {
        busy_us += prefill_us + (produced - 1) * tpot_us;
        if produced >= 2 && rng.random_range(0..1_000) < tenant.preempted_per_mille {
            let had = rng.random_range(1..produced);
            wasted_us = prefill_us + had * tpot_us;
            wall_us += exponential_micros(rng, REQUEUE_MEAN_MS);
        }
        busy_us += wasted_us;
        wall_us += busy_us;
    }
    let first_token_ms = (produced > 0).then(|| (queue_us + prefill_us).div_ceil(1_000));
    let total_ms = wall_us.div_ceil(1_000);
    let tpot_ms = match (finish, first_token_ms) {
        (FinishReason::Stop | FinishReason::Length, Some(first)) if produced > 1 => {
            Some((total_ms - first) / (produced - 1))
        }
        _ => None,
    };
    Figures {
        prompt,
        cached,
        completion: produced,
        finish,
        stream,
        first_token_ms,
        total_ms,
        tpot_ms,
        gpu_micros: FleetModel::share_micros(gpus, concurrency, busy_us),
        preempted_micros: FleetModel::share_micros(gpus, concurrency, wasted_us),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fleet;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn lognormal_hits_its_median_and_95th_percentile() {
        let law = LogNormal::new(800.0, 6_000.0);
        let mut rng = StdRng::seed_from_u64(7);
        let mut xs: Vec<f64> = (0..100_000).map(|_| law.sample(&mut rng)).collect();
        xs.sort_by(f64::total_cmp);
        let (p50, p95) = (xs[50_000], xs[95_000]);
        assert!((760.0..840.0).contains(&p50), "p50 {p50}");
        assert!((5_600.0..6_400.0).contains(&p95), "p95 {p95}");
    }

    #[test]
    fn figures_keep_limits_and_order() {
        let fleet = Fleet::reference();
        let lengths = Lengths::reference();
        let mut rng = StdRng::seed_from_u64(3);
        for tenant in crate::Tenant::reference() {
            for share in &tenant.models {
                let model = fleet.model(&share.model).unwrap();
                let costs = model.profile.costs();
                for _ in 0..5_000 {
                    let f = draw(&mut rng, &lengths, &tenant, model, &costs);
                    assert!(f.prompt + f.completion <= u64::from(tenant.max_context));
                    assert!(f.completion <= u64::from(tenant.max_output));
                    assert!(f.cached < f.prompt);
                    assert!(f.preempted_micros <= f.gpu_micros);
                    if let Some(first) = f.first_token_ms {
                        assert!(first <= f.total_ms);
                    }
                    assert_eq!(f.first_token_ms.is_some(), f.completion > 0);
                    if f.finish == FinishReason::Length {
                        let cap = u64::from(tenant.max_output)
                            .min(u64::from(tenant.max_context) - f.prompt);
                        assert_eq!(f.completion, cap);
                    }
                }
            }
        }
    }
}
