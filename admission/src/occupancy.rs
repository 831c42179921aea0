//! A replica's KV reading, for admission by class on an HTTP upstream: the gateway polls the
//! upstream's Prometheus `/metrics` for its KV-cache usage (vLLM's
//! `vllm:kv_cache_usage_perc`, or `vllm:gpu_cache_usage_perc` on older
//! versions; Meterline's engine exports the former) and refuses a request
//! whose class threshold the replica is past — 503, as for the simulator —
//! instead of letting vLLM queue it without bound.
//!
//! A failed poll keeps the last reading for a while, then forgets it
//! (unknown occupancy admits: the upstream's own answer decides).
//!
//! The same poll reads the replica's KV capacity in tokens from vLLM's
//! `vllm:cache_config_info` (`num_gpu_blocks` × `block_size`), and the
//! reading keeps count of the tokens this gateway sent the replica since
//! (and has in flight there), for the reserved floors of its pool
//! ([`crate::floors`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The metric names read, newest first.
const METRICS: [&str; 2] = ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"];
/// How long a reading stays valid without a fresh one.
const STALE_AFTER: Duration = Duration::from_secs(10);
/// The reading when none is known.
const UNKNOWN: u64 = u64::MAX;

/// The latest KV usage of one upstream replica, in basis points (1/100 %).
#[derive(Debug)]
pub struct Occupancy {
    basis_points: AtomicU64,
    read_at_ms: AtomicU64,
    origin: Instant,
    /// KV capacity in tokens (0: unknown).
    kv_tokens: AtomicU64,
    /// KV tokens this gateway sent the replica since the last reading.
    sent_since: AtomicU64,
    /// KV tokens this gateway has in flight there.
    in_flight: AtomicU64,
}

impl Default for Occupancy {
    fn default() -> Self {
        Self {
            basis_points: AtomicU64::new(UNKNOWN),
            read_at_ms: AtomicU64::new(0),
            origin: Instant::now(),
            kv_tokens: AtomicU64::new(0),
            sent_since: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
        }
    }
}

impl Occupancy {
    /// The last reading, if fresh, in basis points.
    pub fn basis_points(&self) -> Option<u64> {
        let bp = self.basis_points.load(Ordering::Relaxed);
        let age = (self.origin.elapsed().as_millis() as u64)
            .saturating_sub(self.read_at_ms.load(Ordering::Relaxed));
        (bp != UNKNOWN && age <= STALE_AFTER.as_millis() as u64).then_some(bp)
    }

    /// A fresh reading: it now includes what was sent before it.
    pub fn set(&self, basis_points: u64) {
        self.basis_points.store(basis_points, Ordering::Relaxed);
        self.read_at_ms
            .store(self.origin.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.sent_since.store(0, Ordering::Relaxed);
    }

    /// The last reading plus what this gateway sent since, in basis points
    /// of the capacity (the reading alone while the capacity is unknown):
    /// what routing compares, so a burst between two polls spreads
    /// instead of herding onto the replica that read emptiest.
    pub fn routed_basis_points(&self) -> Option<u64> {
        let bp = self.basis_points()?;
        let sent = match self.kv_tokens() {
            Some(capacity) => {
                self.sent_since
                    .load(Ordering::Relaxed)
                    .saturating_mul(10_000)
                    / capacity
            }
            None => 0,
        };
        Some(bp.saturating_add(sent))
    }

    /// The replica's KV capacity in tokens, if known.
    pub fn kv_tokens(&self) -> Option<u64> {
        Some(self.kv_tokens.load(Ordering::Relaxed)).filter(|&t| t > 0)
    }

    pub fn set_kv_tokens(&self, tokens: u64) {
        self.kv_tokens.store(tokens, Ordering::Relaxed);
    }

    /// A request of `kv` tokens was sent to the replica.
    pub fn sent(&self, kv: u64) {
        self.sent_since.fetch_add(kv, Ordering::Relaxed);
        self.in_flight.fetch_add(kv, Ordering::Relaxed);
    }

    /// A request of `kv` tokens sent there ended.
    pub fn ended(&self, kv: u64) {
        let _ = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(kv))
            });
    }

    /// KV tokens in use of `capacity`: the fresh reading plus what was
    /// sent since; without one, what this gateway has in flight there.
    pub fn used_tokens(&self, capacity: u64) -> u128 {
        match self.basis_points() {
            Some(bp) => {
                u128::from(bp.min(10_000)) * u128::from(capacity) / 10_000
                    + u128::from(self.sent_since.load(Ordering::Relaxed))
            }
            None => u128::from(self.in_flight.load(Ordering::Relaxed)),
        }
    }

    /// Whether a request of a class with `threshold_percent` may be sent.
    pub fn admits(&self, threshold_percent: u64) -> bool {
        self.basis_points()
            .is_none_or(|bp| bp < threshold_percent * 100)
    }
}

/// The KV usage of `model` in a Prometheus text exposition, in basis
/// points: the sample of the first known metric whose `model_name` label is
/// `model` (or that has no `model_name` label). Values are fractions (0–1).
pub fn parse(exposition: &str, model: &str) -> Option<u64> {
    let wanted = format!("model_name=\"{model}\"");
    METRICS.iter().find_map(|metric| {
        exposition.lines().find_map(|line| {
            let rest = line.strip_prefix(metric)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let (labels, value) = r.split_once('}')?;
                    (labels, value)
                }
                None => ("", rest.strip_prefix(' ')?),
            };
            if labels.contains("model_name=") && !labels.contains(&wanted) {
                return None;
            }
            fraction_to_basis_points(value.trim())
        })
    })
}

/// The KV capacity in tokens in a Prometheus text exposition: vLLM's
/// `vllm:cache_config_info` info metric, `num_gpu_blocks` × `block_size`
/// from its labels (the first sample whose `model_name`, if it has one, is
/// `model`). `None` before vLLM has sized its cache (`num_gpu_blocks="None"`).
pub fn parse_kv_tokens(exposition: &str, model: &str) -> Option<u64> {
    let wanted = format!("model_name=\"{model}\"");
    exposition.lines().find_map(|line| {
        let labels = line
            .strip_prefix("vllm:cache_config_info{")?
            .split_once('}')?
            .0;
        if labels.contains("model_name=") && !labels.contains(&wanted) {
            return None;
        }
        let label = |name: &str| -> Option<u64> {
            let at = labels
                .split(',')
                .find_map(|kv| kv.trim().strip_prefix(name)?.strip_prefix("=\""))?;
            at.trim_end_matches('"').parse().ok()
        };
        label("num_gpu_blocks")?.checked_mul(label("block_size")?)
    })
}

/// "0.6123" → 6123, without floating point ("1", "0.5", "6.1e-1" too).
fn fraction_to_basis_points(value: &str) -> Option<u64> {
    let d: rust_decimal::Decimal = value
        .parse()
        .or_else(|_| rust_decimal::Decimal::from_scientific(value))
        .ok()?;
    let bp = (d * rust_decimal::Decimal::from(10_000)).round();
    u64::try_from(bp).ok()
}

/// Polls `metrics_url` every `every` into `occupancy`, for the life of the
/// process; the KV capacity too, unless `capacity_fixed` (an entry's
/// `kv_tokens` set it).
pub fn spawn_poller(
    client: reqwest::Client,
    metrics_url: String,
    model: String,
    every: Duration,
    occupancy: Arc<Occupancy>,
    capacity_fixed: bool,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let read = async {
                let text = client
                    .get(&metrics_url)
                    .timeout(every.max(Duration::from_millis(500)))
                    .send()
                    .await?
                    .error_for_status()?
                    .text()
                    .await?;
                if !capacity_fixed {
                    if let Some(tokens) = parse_kv_tokens(&text, &model) {
                        occupancy.set_kv_tokens(tokens);
                    }
                }
                Ok::<_, reqwest::Error>(parse(&text, &model))
            };
            match read.await {
                Ok(Some(bp)) => occupancy.set(bp),
                Ok(None) => tracing::debug!(url = %metrics_url, "no KV usage metric for {model}"),
                Err(e) => tracing::debug!(url = %metrics_url, error = %e, "KV usage poll failed"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    #[test]
    fn reads_vllm_expositions() {
        let vllm = "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
                    # TYPE vllm:kv_cache_usage_perc gauge\n\
                    vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"meta-llama/Llama-3.1-70B\"} 0.6123\n";
        assert_eq!(parse(vllm, "meta-llama/Llama-3.1-70B"), Some(6123));
        assert_eq!(parse(vllm, "other"), None);
        let old = "vllm:gpu_cache_usage_perc{model_name=\"m\"} 1.0\n";
        assert_eq!(parse(old, "m"), Some(10_000));
        let bare = "vllm:kv_cache_usage_perc 5e-1\n";
        assert_eq!(parse(bare, "anything"), Some(5_000));
        // A longer metric name with the same prefix is not the metric.
        assert_eq!(
            parse("vllm:kv_cache_usage_perc_max{model_name=\"m\"} 0.9\n", "m"),
            None
        );
    }

    #[test]
    fn reads_the_kv_capacity_from_vllms_cache_config_info() {
        let vllm = "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
                    # TYPE vllm:cache_config_info gauge\n\
                    vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"27000\",num_cpu_blocks=\"None\"} 1.0\n";
        assert_eq!(parse_kv_tokens(vllm, "any"), Some(432_000));
        let not_sized = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1.0\n";
        assert_eq!(parse_kv_tokens(not_sized, "m"), None);
        let engine = "vllm:cache_config_info{model_name=\"a\",replica=\"a-r0\",block_size=\"16\",num_gpu_blocks=\"10\"} 1\n\
                      vllm:cache_config_info{model_name=\"b\",replica=\"b-r0\",block_size=\"16\",num_gpu_blocks=\"20\"} 1\n";
        assert_eq!(parse_kv_tokens(engine, "b"), Some(320));
        assert_eq!(parse_kv_tokens("vllm:kv_cache_usage_perc 0.5\n", "m"), None);
    }

    #[test]
    fn what_was_sent_since_the_last_reading_counts_until_the_next() {
        let o = Occupancy::default();
        assert_eq!(o.kv_tokens(), None);
        o.set_kv_tokens(1_000);
        // No reading: what is in flight from here.
        o.sent(100);
        assert_eq!(o.used_tokens(1_000), 100);
        o.set(5_000);
        assert_eq!(o.used_tokens(1_000), 500, "the reading includes it now");
        o.sent(30);
        assert_eq!(o.used_tokens(1_000), 530);
        o.ended(30);
        o.ended(100);
        assert_eq!(o.used_tokens(1_000), 530, "until the next reading");
        o.set(4_000);
        assert_eq!(o.used_tokens(1_000), 400);
        o.sent(50);
        assert_eq!(o.routed_basis_points(), Some(4_500));
    }

    #[test]
    fn thresholds_and_staleness() {
        let o = Occupancy::default();
        assert!(o.admits(60), "unknown admits");
        o.set(6_000);
        assert!(!o.admits(60));
        assert!(o.admits(85));
        let o2 = Occupancy {
            origin: Instant::now() - STALE_AFTER - Duration::from_secs(1),
            ..Occupancy::default()
        };
        o2.basis_points.store(9_900, Ordering::Relaxed);
        assert!(o2.admits(60), "a stale reading is forgotten");
    }
}
