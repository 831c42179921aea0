//! Prometheus metrics under vLLM's names (`vllm:kv_cache_usage_perc`,
//! `vllm:num_requests_running`, `vllm:num_requests_waiting`,
//! `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
//! `vllm:prefix_cache_hits_total`, TTFT and inter-token histograms), plus
//! Meterline's own: GPU-seconds attributed per tenant, idle and busy
//! GPU-seconds. Rendered by hand from replica snapshots, so several engines
//! in one process (tests, the gateway) never share a global registry.
//! Labels are bounded: model, replica, tenant.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::attribution::to_gpu_seconds;
use crate::histogram::Histogram;
use crate::replica::{Replica, ReplicaStats};

/// A replica's figures at one moment.
#[derive(Debug, Clone, Default)]
pub struct ReplicaSnapshot {
    pub model: String,
    pub replica_id: String,
    pub gpus: u64,
    pub kv_usage: f64,
    /// KV blocks in use (the router's reading of the replica).
    pub kv_used_blocks: u64,
    /// KV blocks it holds in all.
    pub kv_total_blocks: u64,
    pub running: usize,
    pub waiting: usize,
    pub prompt_tokens: u64,
    pub prefix_cache_hits: u64,
    pub preemptions: u64,
    pub stats: ReplicaStats,
    pub tenants: Vec<Arc<str>>,
}

impl ReplicaSnapshot {
    pub fn of(r: &Replica) -> Self {
        let (prompt_tokens, prefix_cache_hits) = r.prompt_tokens_and_hits();
        Self {
            model: r.model().to_owned(),
            replica_id: r.id().to_owned(),
            gpus: r.gpus(),
            kv_usage: r.kv().usage(),
            kv_used_blocks: r.kv().used(),
            kv_total_blocks: r.kv().total(),
            running: r.running(),
            waiting: r.waiting(),
            prompt_tokens,
            prefix_cache_hits,
            preemptions: r.preemptions(),
            stats: r.stats().clone(),
            tenants: r.tenant_names().to_vec(),
        }
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// The Prometheus text exposition of these replicas.
pub fn render(snaps: &[ReplicaSnapshot]) -> String {
    let mut out = String::new();
    let labels =
        |s: &ReplicaSnapshot| format!("model_name=\"{}\",replica=\"{}\"", s.model, s.replica_id);
    type Pick = fn(&ReplicaSnapshot) -> String;
    let simple: [(&str, &str, &str, Pick); 10] = [
        (
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV cache usage, 1 = full",
            |s| s.kv_usage.to_string(),
        ),
        (
            "vllm:num_requests_running",
            "gauge",
            "requests in the running batch",
            |s| s.running.to_string(),
        ),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "requests waiting to start",
            |s| s.waiting.to_string(),
        ),
        (
            "vllm:prompt_tokens_total",
            "counter",
            "prompt tokens started",
            |s| s.prompt_tokens.to_string(),
        ),
        (
            "vllm:generation_tokens_total",
            "counter",
            "tokens generated",
            |s| s.stats.generation_tokens.to_string(),
        ),
        (
            "vllm:prefix_cache_queries_total",
            "counter",
            "prompt tokens looked up in the prefix cache",
            |s| s.prompt_tokens.to_string(),
        ),
        (
            "vllm:prefix_cache_hits_total",
            "counter",
            "prompt tokens served from the prefix cache",
            |s| s.prefix_cache_hits.to_string(),
        ),
        (
            "vllm:num_preemptions_total",
            "counter",
            "sequences preempted for recompute",
            |s| s.preemptions.to_string(),
        ),
        (
            "meterline_engine_busy_gpu_seconds_total",
            "counter",
            "busy time times GPUs; equals the sum attributed to requests",
            |s| to_gpu_seconds(s.stats.busy_micros * s.gpus).to_string(),
        ),
        (
            "meterline_engine_idle_gpu_seconds_total",
            "counter",
            "idle time times GPUs, never attributed to a request",
            |s| to_gpu_seconds(s.stats.idle_micros * s.gpus).to_string(),
        ),
    ];
    for (name, kind, help, pick) in simple {
        family(&mut out, name, kind, help);
        for s in snaps {
            let _ = writeln!(out, "{name}{{{}}} {}", labels(s), pick(s));
        }
    }
    // vLLM's info metric of its KV cache's size (a gateway reads the
    // replica's capacity in tokens from it for the pool's reserved floors).
    family(
        &mut out,
        "vllm:cache_config_info",
        "gauge",
        "the KV cache's configuration: num_gpu_blocks blocks of block_size tokens",
    );
    for s in snaps {
        let _ = writeln!(
            out,
            "vllm:cache_config_info{{{},block_size=\"{}\",num_gpu_blocks=\"{}\"}} 1",
            labels(s),
            crate::profile::BLOCK_TOKENS,
            s.kv_total_blocks
        );
    }
    for (name, help, pick) in [
        (
            "meterline_engine_attributed_gpu_seconds_total",
            "GPU-seconds attributed to each tenant's requests, running ones included",
            (|s: &ReplicaStats| &s.tenant_gpu_micros) as fn(&ReplicaStats) -> &Vec<u64>,
        ),
        (
            "meterline_engine_preempted_gpu_seconds_total",
            "GPU-seconds lost to preemption, by tenant, for finished requests",
            |s: &ReplicaStats| &s.tenant_preempted_micros,
        ),
    ] {
        family(&mut out, name, "counter", help);
        for s in snaps {
            for (tenant, micros) in s.tenants.iter().zip(pick(&s.stats)) {
                let _ = writeln!(
                    out,
                    "{name}{{{},tenant=\"{tenant}\"}} {}",
                    labels(s),
                    to_gpu_seconds(*micros)
                );
            }
        }
    }
    for (name, help, pick) in [
        (
            "vllm:time_to_first_token_seconds",
            "time to first token",
            (|s: &ReplicaStats| &s.ttft) as fn(&ReplicaStats) -> &Histogram,
        ),
        (
            "vllm:inter_token_latency_seconds",
            "time between tokens of a request",
            |s: &ReplicaStats| &s.inter_token,
        ),
    ] {
        family(&mut out, name, "histogram", help);
        for s in snaps {
            pick(&s.stats).render(&mut out, name, &labels(s));
        }
    }
    out
}
