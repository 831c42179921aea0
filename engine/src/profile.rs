//! Model profiles: what a replica of a model is made of (GPUs, weights,
//! KV bytes per token, KV budget, HBM bandwidth, compute) and the roofline
//! that turns a step's work into its duration.
//!
//! Profiles are configuration: [`ModelProfile::reference`] holds the
//! defaults from the reference fleet and [`ModelProfile::load`] reads a YAML
//! or JSON file of them. Every figure is an integer; a step's duration is
//! computed in integer picoseconds and rounded up to the microsecond, so the
//! same work always costs the same time.
//!
//! The roofline: a step reads the weights once plus the KV of every token
//! the step attends to, and does `flops_per_token` for each token it
//! processes. Its time is the larger of bytes over realized bandwidth
//! (`hbm_bytes_per_second` × `bandwidth_efficiency_percent`) and FLOPs over
//! `flops_per_second`. The compute figure is the realized one: on the 70B
//! profile it makes a 4,096-token prefill take about 146 ms (~28,000
//! tokens/s), and the 40% bandwidth efficiency makes decode realize about
//! 2,259 of the theoretical 5,647 tokens/s.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Tokens per paged KV block.
pub const BLOCK_TOKENS: u32 = 16;

const GIB: u64 = 1 << 30;
const KIB: u64 = 1 << 10;
const PS_PER_SECOND: u128 = 1_000_000_000_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelProfile {
    /// The model name clients send.
    pub name: String,
    /// Reported as `model_version` on usage events; part of every prefix-cache key.
    pub version: String,
    /// GPUs per replica: every busy second of a replica is this many GPU-seconds.
    pub gpus: u32,
    /// Bytes of weights read by every step (all GPUs together).
    pub weight_bytes: u64,
    /// FLOPs per processed token (about 2 × parameters).
    pub flops_per_token: u64,
    /// KV cache bytes per token of context.
    pub kv_bytes_per_token: u64,
    /// KV cache memory per replica after weights and activations.
    pub kv_budget_bytes: u64,
    /// Aggregate HBM bandwidth of the replica, bytes per second (theoretical).
    pub hbm_bytes_per_second: u64,
    /// Share of the bandwidth roofline a real engine realizes, percent.
    pub bandwidth_efficiency_percent: u32,
    /// Realized aggregate compute, FLOPs per second.
    pub flops_per_second: u64,
    /// The longest prompt plus output a replica accepts.
    pub max_context: u32,
    /// Tokens one step may process (decodes count one each; prefill is chunked to fit).
    #[serde(default = "default_step_tokens")]
    pub step_token_budget: u32,
    /// Most sequences running at once (vLLM's `max_num_seqs`).
    #[serde(default = "default_max_running")]
    pub max_running: u32,
    /// A replica refuses a request while the prompts waiting to start
    /// ahead of it (its class and the higher ones) hold this many full
    /// steps of prefill (`step_token_budget` tokens each); 0: no such
    /// limit. See `scheduler`.
    #[serde(default = "default_backlog_steps")]
    pub backlog_steps: u32,
    /// Share of the KV blocks one tenant's prefix-cache entries may hold, percent.
    #[serde(default = "default_tenant_quota")]
    pub tenant_cache_quota_percent: u32,
    /// Replicas of this model the simulator runs, one pool (each request
    /// routed by power of two choices on KV headroom; see `simulator`).
    #[serde(default = "default_replicas")]
    pub replicas: u32,
    /// Replicas dedicated to a tenant, by tenant id: the first replicas of
    /// the pool, in the order of the tenants' names. No other tenant's
    /// request starts on them while the owner has work there; while it has
    /// none they are lent.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub dedicated: std::collections::BTreeMap<String, u32>,
}

/// The most replicas one profile may ask for.
pub const MAX_REPLICAS: u32 = 256;

fn default_step_tokens() -> u32 {
    512
}

/// About 4 s of prefill on the reference 70B profile.
fn default_backlog_steps() -> u32 {
    128
}

fn default_max_running() -> u32 {
    256
}

fn default_tenant_quota() -> u32 {
    25
}

fn default_replicas() -> u32 {
    1
}

/// A profile file: `profiles: [...]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    profiles: Vec<ModelProfile>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("reading profiles from {path}: {message}")]
    Read { path: String, message: String },
    #[error("profile {name:?}: {message}")]
    Invalid { name: String, message: String },
    #[error("two profiles are named {0:?}")]
    Duplicate(String),
    #[error("no profiles configured")]
    Empty,
}

/// The integer cost constants of a profile, precomputed for the step loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepCosts {
    /// Picoseconds to read the weights once at realized bandwidth.
    pub weight_ps: u64,
    /// Picoseconds to read one token's KV at realized bandwidth.
    pub kv_token_ps: u64,
    /// Picoseconds of compute per processed token.
    pub token_ps: u64,
}

impl StepCosts {
    /// A step's duration in microseconds from its processed tokens and the
    /// KV tokens it reads: the roofline, rounded up, at least 1 µs.
    pub fn step_micros(&self, tokens: u64, kv_tokens_read: u64) -> u64 {
        let memory = self
            .weight_ps
            .saturating_add(kv_tokens_read.saturating_mul(self.kv_token_ps));
        let compute = tokens.saturating_mul(self.token_ps);
        memory.max(compute).div_ceil(1_000_000).max(1)
    }

    /// One request's own work in a step, picoseconds: its compute plus its
    /// KV reads. The step's shared weight read is split in proportion.
    pub fn work_ps(&self, tokens: u64, kv_tokens_read: u64) -> u64 {
        tokens
            .saturating_mul(self.token_ps)
            .saturating_add(kv_tokens_read.saturating_mul(self.kv_token_ps))
            .max(1)
    }
}

impl ModelProfile {
    /// The reference profiles: 8B on 1 GPU, 70B on 4, a frontier model on 8
    /// (H100-class: 3.35 TB/s HBM and ~989 dense TFLOPs per GPU).
    pub fn reference() -> Vec<Self> {
        let gpu_bw = 3_350_000_000_000;
        let gpu_flops = 989_000_000_000_000;
        vec![
            Self {
                name: "llama-3.1-8b".into(),
                version: "8b-2026.10".into(),
                gpus: 1,
                weight_bytes: 16_060_000_000,
                flops_per_token: 16_060_000_000,
                kv_bytes_per_token: 128 * KIB,
                kv_budget_bytes: 50 * GIB,
                hbm_bytes_per_second: gpu_bw,
                bandwidth_efficiency_percent: 40,
                flops_per_second: gpu_flops,
                max_context: 131_072,
                step_token_budget: 512,
                max_running: 256,
                backlog_steps: default_backlog_steps(),
                tenant_cache_quota_percent: 25,
                replicas: 1,
                dedicated: Default::default(),
            },
            Self {
                name: "llama-3.1-70b".into(),
                version: "70b-2026.10".into(),
                gpus: 4,
                weight_bytes: 141_000_000_000,
                flops_per_token: 141_000_000_000,
                kv_bytes_per_token: 320 * KIB,
                kv_budget_bytes: 172 * GIB + GIB / 2,
                hbm_bytes_per_second: 4 * gpu_bw,
                bandwidth_efficiency_percent: 40,
                flops_per_second: 4 * gpu_flops,
                max_context: 131_072,
                step_token_budget: 512,
                max_running: 256,
                backlog_steps: default_backlog_steps(),
                tenant_cache_quota_percent: 25,
                replicas: 1,
                dedicated: Default::default(),
            },
            Self {
                name: "frontier-405b".into(),
                version: "405b-2026.10".into(),
                gpus: 8,
                // FP8 weights and KV.
                weight_bytes: 405_000_000_000,
                flops_per_token: 810_000_000_000,
                kv_bytes_per_token: 252 * KIB,
                kv_budget_bytes: 160 * GIB,
                hbm_bytes_per_second: 8 * gpu_bw,
                bandwidth_efficiency_percent: 40,
                flops_per_second: 8 * gpu_flops,
                max_context: 131_072,
                step_token_budget: 512,
                max_running: 256,
                backlog_steps: default_backlog_steps(),
                tenant_cache_quota_percent: 25,
                replicas: 1,
                dedicated: Default::default(),
            },
        ]
    }

    /// Reads profiles from a YAML or JSON file (`profiles: [...]`), validated.
    pub fn load(path: &Path) -> Result<Vec<Self>, ProfileError> {
        let read_err = |message: String| ProfileError::Read {
            path: path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| read_err(e.to_string()))?;
        let file: ProfileFile = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| read_err(e.to_string()))?
        } else {
            serde_norway::from_str(&text).map_err(|e| read_err(e.to_string()))?
        };
        Self::validate_all(&file.profiles)?;
        Ok(file.profiles)
    }

    /// Sets replica counts from `spec`, `model=count` pairs separated by
    /// commas (`llama-3.1-70b=12,llama-3.1-8b=2`; the `ENGINE_REPLICAS`
    /// setting), on top of the profiles' own. A model not in `profiles`,
    /// or a count outside 1..=[`MAX_REPLICAS`], is an error naming it.
    pub fn set_replicas(profiles: &mut [Self], spec: &str) -> Result<(), ProfileError> {
        for pair in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = |message: String| ProfileError::Invalid {
                name: pair.to_owned(),
                message,
            };
            let (model, count) = pair
                .split_once('=')
                .ok_or_else(|| bad("expected model=count".into()))?;
            let count: u32 = count
                .trim()
                .parse()
                .ok()
                .filter(|n| (1..=MAX_REPLICAS).contains(n))
                .ok_or_else(|| bad(format!("the count must be 1 to {MAX_REPLICAS}")))?;
            let profile = profiles
                .iter_mut()
                .find(|p| p.name == model.trim())
                .ok_or_else(|| bad(format!("no profile is named {:?}", model.trim())))?;
            profile.replicas = count;
        }
        Ok(())
    }

    /// Dedicates replicas to tenants from `spec`, `model:tenant=count`
    /// triples separated by commas (`llama-3.1-70b:acme-corp=4`; the
    /// `ENGINE_DEDICATED` setting). Checked like the profiles themselves
    /// (at most the pool's replicas in all).
    pub fn set_dedicated(profiles: &mut [Self], spec: &str) -> Result<(), ProfileError> {
        for triple in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = |message: String| ProfileError::Invalid {
                name: triple.to_owned(),
                message,
            };
            let parsed = triple.split_once(':').and_then(|(model, rest)| {
                let (tenant, count) = rest.split_once('=')?;
                Some((
                    model.trim(),
                    tenant.trim(),
                    count.trim().parse::<u32>().ok()?,
                ))
            });
            let (model, tenant, count) =
                parsed.ok_or_else(|| bad("expected model:tenant=count".into()))?;
            if tenant.is_empty() {
                return Err(bad("the tenant is empty".into()));
            }
            let profile = profiles
                .iter_mut()
                .find(|p| p.name == model)
                .ok_or_else(|| bad(format!("no profile is named {model:?}")))?;
            profile.dedicated.insert(tenant.to_owned(), count);
            profile.validate()?;
        }
        Ok(())
    }

    /// Checks a set of profiles: each valid, names unique, not empty.
    pub fn validate_all(profiles: &[Self]) -> Result<(), ProfileError> {
        if profiles.is_empty() {
            return Err(ProfileError::Empty);
        }
        for (i, p) in profiles.iter().enumerate() {
            p.validate()?;
            if profiles[..i].iter().any(|q| q.name == p.name) {
                return Err(ProfileError::Duplicate(p.name.clone()));
            }
        }
        Ok(())
    }

    /// Checks one profile: positive figures, and one full-length context
    /// fits under the lowest admission threshold, so it can always run.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let bad = |message: String| ProfileError::Invalid {
            name: self.name.clone(),
            message,
        };
        if self.name.is_empty() || self.version.is_empty() {
            return Err(bad("name and version must not be empty".into()));
        }
        for (field, value) in [
            ("gpus", u64::from(self.gpus)),
            ("weight_bytes", self.weight_bytes),
            ("flops_per_token", self.flops_per_token),
            ("kv_bytes_per_token", self.kv_bytes_per_token),
            ("hbm_bytes_per_second", self.hbm_bytes_per_second),
            ("flops_per_second", self.flops_per_second),
            ("max_context", u64::from(self.max_context)),
            ("step_token_budget", u64::from(self.step_token_budget)),
            ("max_running", u64::from(self.max_running)),
        ] {
            if value == 0 {
                return Err(bad(format!("{field} must be positive")));
            }
        }
        if !(1..=100).contains(&self.bandwidth_efficiency_percent) {
            return Err(bad(format!(
                "bandwidth_efficiency_percent must be between 1 and 100, got {}",
                self.bandwidth_efficiency_percent
            )));
        }
        if self.backlog_steps > 1_000_000 {
            return Err(bad(format!(
                "backlog_steps must be 0 (no limit) to 1000000, got {}",
                self.backlog_steps
            )));
        }
        if !(1..=100).contains(&self.tenant_cache_quota_percent) {
            return Err(bad(format!(
                "tenant_cache_quota_percent must be between 1 and 100, got {}",
                self.tenant_cache_quota_percent
            )));
        }
        if !(1..=MAX_REPLICAS).contains(&self.replicas) {
            return Err(bad(format!(
                "replicas must be between 1 and {MAX_REPLICAS}, got {}",
                self.replicas
            )));
        }
        let dedicated: u64 = self.dedicated.values().map(|&n| u64::from(n)).sum();
        if dedicated > u64::from(self.replicas) || self.dedicated.values().any(|&n| n == 0) {
            return Err(bad(format!(
                "dedicated replicas ({dedicated} in all, each tenant at least 1) must fit in its {} replicas",
                self.replicas
            )));
        }
        if self.total_blocks() > u64::from(u32::MAX) {
            return Err(bad("kv_budget_bytes holds more than 2^32 blocks".into()));
        }
        let context_blocks = u64::from(self.max_context.div_ceil(BLOCK_TOKENS));
        if context_blocks * 100 > self.total_blocks() * 60 {
            return Err(bad(format!(
                "one {}-token context needs {context_blocks} KV blocks, more than 60% of the {} the budget holds",
                self.max_context,
                self.total_blocks()
            )));
        }
        Ok(())
    }

    /// KV blocks of [`BLOCK_TOKENS`] tokens the budget holds.
    pub fn total_blocks(&self) -> u64 {
        self.kv_budget_bytes / (self.kv_bytes_per_token.max(1) * u64::from(BLOCK_TOKENS))
    }

    /// GPU-seconds of a request its replica could not account for (it
    /// failed mid-way), from the roofline: its own compute and KV reads for
    /// the prefill and each decoded token, times the GPUs (its share of the
    /// weight reads is left out, so batched neighbours are not billed to it).
    pub fn estimated_gpu_seconds(&self, prompt: u64, produced: u64) -> rust_decimal::Decimal {
        let c = self.costs();
        let (p, n) = (u128::from(prompt), u128::from(produced));
        let (tok, kv) = (u128::from(c.token_ps), u128::from(c.kv_token_ps));
        let prefill = p * tok + p * kv;
        let decode = n * tok + kv * (n * p + n * n.saturating_sub(1) / 2);
        let micros = (prefill + decode).div_ceil(1_000_000) * u128::from(self.gpus);
        crate::attribution::to_gpu_seconds(u64::try_from(micros).unwrap_or(u64::MAX))
    }

    /// The integer cost constants of the roofline.
    pub fn costs(&self) -> StepCosts {
        let bw = u128::from(self.hbm_bytes_per_second.max(1))
            * u128::from(self.bandwidth_efficiency_percent.max(1));
        let mem_ps = |bytes: u64| {
            let ps = u128::from(bytes) * PS_PER_SECOND * 100 / bw;
            u64::try_from(ps).unwrap_or(u64::MAX)
        };
        let token_ps = u128::from(self.flops_per_token) * PS_PER_SECOND
            / u128::from(self.flops_per_second.max(1));
        StepCosts {
            weight_ps: mem_ps(self.weight_bytes),
            kv_token_ps: mem_ps(self.kv_bytes_per_token),
            token_ps: u64::try_from(token_ps).unwrap_or(u64::MAX),
        }
    }

    /// Unchunked prefill time for `tokens` (attending to themselves), µs.
    pub fn prefill_micros(&self, tokens: u64) -> u64 {
        self.costs().step_micros(tokens, tokens)
    }

    /// KV bytes `tokens` of context hold.
    pub fn kv_bytes(&self, tokens: u64) -> u64 {
        tokens.saturating_mul(self.kv_bytes_per_token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p70() -> ModelProfile {
        ModelProfile::reference().swap_remove(1)
    }

    #[test]
    fn a_4k_prefill_on_70b_takes_about_146_ms() {
        let ms = p70().prefill_micros(4096) / 1000;
        assert!((143..=149).contains(&ms), "took {ms} ms");
    }

    #[test]
    fn a_512_token_chunk_computes_in_about_18_ms() {
        let c = p70().costs();
        let compute_ms = 512 * c.token_ps / 1_000_000_000;
        assert!((17..=19).contains(&compute_ms), "{compute_ms} ms");
    }

    #[test]
    fn decode_realizes_about_2259_of_5647_tokens_per_second() {
        // The reference's theoretical figure is a weight-bound batch of 59
        // short sequences; 40% of the roofline realizes ~2,259 tokens/s.
        let p = p70();
        let step = p.costs().step_micros(59, 59);
        let realized = 59 * 1_000_000 / step;
        assert!((2_200..=2_320).contains(&realized), "{realized} tokens/s");
        let mut ideal = p.clone();
        ideal.bandwidth_efficiency_percent = 100;
        let theoretical = 59 * 1_000_000 / ideal.costs().step_micros(59, 59);
        assert!((5_500..=5_800).contains(&theoretical), "{theoretical}");
    }

    #[test]
    fn a_128k_context_holds_about_40_gib_and_23_percent_of_the_replica() {
        let p = p70();
        let bytes = p.kv_bytes(131_072);
        assert_eq!(bytes, 40 * GIB);
        let percent = bytes * 1000 / p.kv_budget_bytes;
        assert!((228..=234).contains(&percent), "{percent} per mille");
    }

    #[test]
    fn reference_profiles_are_valid() {
        ModelProfile::validate_all(&ModelProfile::reference()).unwrap();
        assert_eq!(p70().total_blocks(), 35_328);
    }

    #[test]
    fn profiles_load_from_yaml_and_reject_unknown_keys() {
        let dir = std::env::temp_dir().join(format!("engine-profiles-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.yaml");
        let yaml = serde_norway::to_string(&serde_json::json!({
            "profiles": ModelProfile::reference()
        }))
        .unwrap();
        std::fs::write(&good, yaml).unwrap();
        assert_eq!(
            ModelProfile::load(&good).unwrap(),
            ModelProfile::reference()
        );
        let bad = dir.join("bad.json");
        std::fs::write(&bad, r#"{"profiles": [], "extra": 1}"#).unwrap();
        assert!(matches!(
            ModelProfile::load(&bad),
            Err(ProfileError::Read { .. })
        ));
        let mut zero = p70();
        zero.gpus = 0;
        assert!(zero.validate().unwrap_err().to_string().contains("gpus"));
    }

    #[test]
    fn replica_counts_are_set_by_model_and_checked() {
        let mut profiles = ModelProfile::reference();
        ModelProfile::set_replicas(&mut profiles, "llama-3.1-70b=12, llama-3.1-8b=2").unwrap();
        let counts: Vec<u32> = profiles.iter().map(|p| p.replicas).collect();
        assert_eq!(counts, [2, 12, 1]);
        for (spec, named) in [
            ("gpt-5=3", "gpt-5"),
            ("llama-3.1-70b=0", "1 to 256"),
            ("llama-3.1-70b=257", "1 to 256"),
            ("llama-3.1-70b", "model=count"),
        ] {
            let err = ModelProfile::set_replicas(&mut profiles, spec)
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{spec}: {err}");
        }
        ModelProfile::set_dedicated(&mut profiles, "llama-3.1-70b:acme-corp=4").unwrap();
        assert_eq!(profiles[1].dedicated["acme-corp"], 4);
        for (spec, named) in [
            ("llama-3.1-70b:medai=9", "must fit in its 12 replicas"),
            ("llama-3.1-70b:medai=0", "at least 1"),
            ("llama-3.1-70b=4", "model:tenant=count"),
            ("gpt-5:acme-corp=1", "gpt-5"),
        ] {
            let err = ModelProfile::set_dedicated(&mut profiles.clone(), spec)
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{spec}: {err}");
        }
        let mut none = p70();
        none.replicas = 0;
        assert!(none
            .validate()
            .unwrap_err()
            .to_string()
            .contains("replicas"));
    }
}
