//! The five reference tenants as the generator needs them.
//!
//! Names, key ids, priorities, requests/s, time zones and per-request
//! limits are those of `config/tenants.yaml` (a test reads the file and
//! compares). The rest is our own choice, made to look like each tenant's
//! description in `../shared/REFERENCE.md`:
//!
//! | tenant | models | load | prefix-cache hits | streamed |
//! |---|---|---|---|---|
//! | acme-corp | 80% llama-3.1-70b, 20% llama-3.1-8b | interactive, weekends at 70% | 90% of prompts, 20–60% of each | 70% |
//! | medai-labs | 100% llama-3.1-70b | interactive, weekends at 50% | 60%, 0–30% | 50% |
//! | finserv-team | 85% llama-3.1-8b, 15% llama-3.1-70b | interactive, weekends at 30% | 50%, 0–40% | 30% |
//! | research-squad | 40% frontier-405b, 60% llama-3.1-70b | interactive, weekends at 60% | 30%, 0–20% | 50% |
//! | codegen-platform | 60% llama-3.1-8b, 40% llama-3.1-70b | batch, in the off-peak window | 90%, 30–60% | 5% |
//!
//! acme-corp and codegen-platform send the same long system prompts over
//! and over, hence their high cache shares. The lower a tenant's priority,
//! the longer it waits in the queue and the more often it is preempted.

use chrono_tz::Tz;

/// One tenant's traffic.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// `tenant_id` on every event (`tenants[].name`).
    pub name: String,
    /// `api_key_id` on every event (`tenants[].keys[].id`).
    pub api_key_id: String,
    /// 1 lowest … 5 highest.
    pub priority: i16,
    /// The reference rate; tenants share a sample's events in proportion to it.
    pub requests_per_second: u32,
    /// The models the tenant calls and the share of its requests each gets;
    /// the percents sum to 100.
    pub models: Vec<ModelShare>,
    /// The tenant's own zone (`timeZone`): an interactive tenant's day.
    pub zone: Tz,
    /// When in the day the tenant's requests arrive.
    pub load: Load,
    /// Longest prompt plus output a request may have (`limits[].maxContext`).
    pub max_context: u32,
    /// Most output tokens a request may produce (`limits[].maxOutput`).
    pub max_output: u32,
    /// How much of its prompts the prefix cache holds.
    pub cache: PrefixCache,
    /// Share of requests sent with `stream: true`, percent.
    pub stream_percent: u32,
    /// Mean wait in the engine's queue before prefill starts, milliseconds
    /// (exponentially distributed; wall time only, never GPU time).
    pub queue_mean_ms: u32,
    /// Requests per thousand that are preempted once mid-decode and
    /// recompute what they had.
    pub preempted_per_mille: u32,
}

/// A model a tenant calls and the share of the tenant's requests it gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelShare {
    /// A model of the [`Fleet`](crate::Fleet).
    pub model: String,
    /// Percent of the tenant's requests.
    pub percent: u32,
}

/// The shape of a tenant's day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// People and their products: high in 08:00–20:00 of the tenant's zone,
    /// low at night; Saturdays and Sundays at `weekend_percent` of a weekday.
    Interactive { weekend_percent: u32 },
    /// Jobs scheduled into the price book's off-peak window (22:00–06:00 in
    /// [`OFF_PEAK_ZONE`](crate::diurnal::OFF_PEAK_ZONE)), where they are
    /// 30% cheaper; a trickle the rest of the day, weekends alike.
    Batch,
}

/// What share of a tenant's prompts the prefix cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCache {
    /// Share of prompts that find a cached prefix at all, percent.
    pub hit_percent: u32,
    /// A hit covers a share of the prompt drawn uniformly from
    /// `min_share_percent..=max_share_percent`, in whole 16-token blocks,
    /// and never the whole prompt.
    pub min_share_percent: u32,
    pub max_share_percent: u32,
}

impl Tenant {
    /// The five reference tenants, in the order of `config/tenants.yaml`.
    pub fn reference() -> Vec<Self> {
        let share = |model: &str, percent| ModelShare {
            model: model.into(),
            percent,
        };
        let cache = |hit_percent, min_share_percent, max_share_percent| PrefixCache {
            hit_percent,
            min_share_percent,
            max_share_percent,
        };
        vec![
            Self {
                name: "acme-corp".into(),
                api_key_id: "key_acme_demo".into(),
                priority: 5,
                requests_per_second: 200,
                models: vec![share("llama-3.1-70b", 80), share("llama-3.1-8b", 20)],
                zone: chrono_tz::America::New_York,
                load: Load::Interactive {
                    weekend_percent: 70,
                },
                max_context: 131_072,
                max_output: 4_096,
                cache: cache(90, 20, 60),
                stream_percent: 70,
                queue_mean_ms: 15,
                preempted_per_mille: 2,
            },
            Self {
                name: "medai-labs".into(),
                api_key_id: "key_medai_demo".into(),
                priority: 4,
                requests_per_second: 50,
                models: vec![share("llama-3.1-70b", 100)],
                zone: chrono_tz::Europe::Berlin,
                load: Load::Interactive {
                    weekend_percent: 50,
                },
                max_context: 131_072,
                max_output: 4_096,
                cache: cache(60, 0, 30),
                stream_percent: 50,
                queue_mean_ms: 25,
                preempted_per_mille: 5,
            },
            Self {
                name: "finserv-team".into(),
                api_key_id: "key_finserv_demo".into(),
                priority: 3,
                requests_per_second: 30,
                models: vec![share("llama-3.1-8b", 85), share("llama-3.1-70b", 15)],
                zone: chrono_tz::America::New_York,
                load: Load::Interactive {
                    weekend_percent: 30,
                },
                max_context: 32_768,
                max_output: 2_048,
                cache: cache(50, 0, 40),
                stream_percent: 30,
                queue_mean_ms: 40,
                preempted_per_mille: 10,
            },
            Self {
                name: "research-squad".into(),
                api_key_id: "key_research_demo".into(),
                priority: 2,
                requests_per_second: 10,
                models: vec![share("frontier-405b", 40), share("llama-3.1-70b", 60)],
                zone: chrono_tz::UTC,
                load: Load::Interactive {
                    weekend_percent: 60,
                },
                max_context: 131_072,
                max_output: 2_048,
                cache: cache(30, 0, 20),
                stream_percent: 50,
                queue_mean_ms: 200,
                preempted_per_mille: 40,
            },
            Self {
                name: "codegen-platform".into(),
                api_key_id: "key_codegen_demo".into(),
                priority: 1,
                requests_per_second: 100,
                models: vec![share("llama-3.1-8b", 60), share("llama-3.1-70b", 40)],
                zone: chrono_tz::UTC,
                load: Load::Batch,
                max_context: 131_072,
                max_output: 4_096,
                cache: cache(90, 30, 60),
                stream_percent: 5,
                queue_mean_ms: 800,
                preempted_per_mille: 50,
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_norway::Value;

    fn yaml(file: &str) -> Value {
        let path = format!("{}/../config/{file}", env!("CARGO_MANIFEST_DIR"));
        serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn reference_tenants_match_config_tenants_yaml() {
        let config = yaml("tenants.yaml");
        let listed = config["tenants"].as_sequence().unwrap();
        let ours = Tenant::reference();
        assert_eq!(listed.len(), ours.len());
        for (t, c) in ours.iter().zip(listed) {
            assert_eq!(c["name"].as_str(), Some(t.name.as_str()));
            assert_eq!(c["keys"][0]["id"].as_str(), Some(t.api_key_id.as_str()));
            assert_eq!(c["priority"].as_i64(), Some(i64::from(t.priority)));
            assert_eq!(
                c["rateLimit"]["requestsPerSecond"].as_u64(),
                Some(u64::from(t.requests_per_second))
            );
            assert_eq!(c["timeZone"].as_str(), Some(t.zone.name()));
            let limits = &c["limits"][0];
            assert_eq!(limits["model"].as_str(), Some("*"), "{}", t.name);
            assert_eq!(
                limits["maxContext"].as_u64(),
                Some(u64::from(t.max_context))
            );
            assert_eq!(limits["maxOutput"].as_u64(), Some(u64::from(t.max_output)));
        }
    }

    #[test]
    fn every_tenant_calls_priced_models_with_shares_summing_to_100() {
        let book = yaml("price-book.yaml");
        for t in Tenant::reference() {
            assert_eq!(t.models.iter().map(|m| m.percent).sum::<u32>(), 100);
            for m in &t.models {
                assert!(
                    book["tokenRates"][m.model.as_str()].is_mapping(),
                    "{} is not in the price book",
                    m.model
                );
            }
        }
    }
}
