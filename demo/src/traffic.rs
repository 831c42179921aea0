//! The live part of the demo: the five reference tenants call the gateway
//! at their reference request rates (scaled down), then the demo waits
//! until billing-api shows every answered request and compares, exactly,
//! what billing counted with the `usage` the gateway returned to clients.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use rust_decimal::Decimal;
use serde_json::{json, Value};

use crate::client::Billing;

/// (tenant, demo key, reference requests/s, favourite model)
pub const TENANTS: [(&str, &str, u32, &str); 5] = [
    ("acme-corp", "sk-demo-acme-corp-0001", 200, "llama-3.1-70b"),
    ("medai-labs", "sk-demo-medai-labs-0001", 50, "llama-3.1-70b"),
    (
        "finserv-team",
        "sk-demo-finserv-team-0001",
        30,
        "llama-3.1-8b",
    ),
    (
        "research-squad",
        "sk-demo-research-squad-0001",
        10,
        "frontier-405b",
    ),
    (
        "codegen-platform",
        "sk-demo-codegen-platform-0001",
        100,
        "llama-3.1-8b",
    ),
];

/// Requests and tokens, as clients were told or as billing counted them.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Used {
    pub requests: i64,
    pub prompt: i64,
    pub completion: i64,
}

/// One tenant's line of the "matches" table.
pub struct Matched {
    pub tenant: &'static str,
    pub billed: Used,
    pub gpu_seconds: Decimal,
    pub matches: bool,
}

/// Drives `seconds` of traffic at 1/`divisor` of the reference rates and
/// returns, per tenant, what billing counted and whether it matches.
pub async fn drive(
    gateway: &str,
    billing: &Billing,
    seconds: u64,
    divisor: u32,
) -> anyhow::Result<Vec<Matched>> {
    let client = reqwest::Client::new();
    let started = chrono::Utc::now();
    let window = |h: i64| {
        (started + chrono::Duration::hours(h)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    let (from, to) = (window(-1), window(2));
    let before = billed(billing, &from, &to).await?;
    println!("demo: driving {seconds} s of traffic from five tenants at 1/{divisor} of their reference rates");
    let mut tasks = Vec::new();
    for (i, (tenant, key, rps, model)) in TENANTS.into_iter().enumerate() {
        let client = client.clone();
        let url = format!("{gateway}/v1/chat/completions");
        tasks.push(tokio::spawn(async move {
            let rate = (rps / divisor).max(1);
            let mut tick =
                tokio::time::interval(Duration::from_micros(1_000_000 / u64::from(rate)));
            // A steady rate: ticks missed while this machine was busy are
            // not sent later in one burst (the reference tenants' rates
            // are averages, not catch-up bursts above the global burst).
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let end = Instant::now() + Duration::from_secs(seconds);
            let mut inflight = tokio::task::JoinSet::new();
            let mut n = 0u64;
            while Instant::now() < end {
                tick.tick().await;
                n += 1;
                let body = json!({
                    "model": model,
                    "messages": [{"role": "user", "content": format!(
                        "[{tenant} #{n}] Review this change and list the risks. {}",
                        "context ".repeat((n % 40) as usize * 10 + i))}],
                    "max_tokens": 128 + (n % 5) * 64,
                    "seed": n,
                });
                let req = client.post(&url).bearer_auth(key).json(&body);
                inflight.spawn(async move {
                    req.send().await?.error_for_status()?.json::<Value>().await
                });
            }
            let (mut used, mut failed) = (Used::default(), 0u64);
            while let Some(done) = inflight.join_next().await {
                match done {
                    Ok(Ok(v)) => {
                        used.requests += 1;
                        used.prompt += v["usage"]["prompt_tokens"].as_i64().unwrap_or(0);
                        used.completion += v["usage"]["completion_tokens"].as_i64().unwrap_or(0);
                    }
                    _ => failed += 1,
                }
            }
            (tenant, used, failed)
        }));
    }
    let mut told: BTreeMap<&str, Used> = BTreeMap::new();
    for t in tasks {
        let (tenant, used, failed) = t.await?;
        if failed > 0 {
            eprintln!("demo: {tenant}: {failed} requests failed (not answered, so not billed)");
        }
        told.insert(tenant, used);
    }
    // Wait until billing-api shows every answered request on top of what it showed before.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = billed(billing, &from, &to).await?;
        let delta: BTreeMap<&str, (Used, Decimal)> = now
            .iter()
            .map(|(t, (u, g))| {
                let (b, bg) = before.get(t).copied().unwrap_or_default();
                let used = Used {
                    requests: u.requests - b.requests,
                    prompt: u.prompt - b.prompt,
                    completion: u.completion - b.completion,
                };
                (*t, (used, *g - bg))
            })
            .collect();
        if told
            .iter()
            .all(|(t, u)| delta.get(t).is_some_and(|(b, _)| b.requests >= u.requests))
        {
            return Ok(told
                .iter()
                .map(|(tenant, u)| {
                    let (b, gpu) = delta.get(tenant).copied().unwrap_or_default();
                    Matched {
                        tenant,
                        billed: b,
                        gpu_seconds: gpu,
                        matches: b == *u,
                    }
                })
                .collect());
        }
        if Instant::now() > deadline {
            bail!("billing-api did not show every answered request within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Each tenant's usage totals in billing-api for [from, to).
async fn billed(
    billing: &Billing,
    from: &str,
    to: &str,
) -> anyhow::Result<BTreeMap<&'static str, (Used, Decimal)>> {
    let mut out = BTreeMap::new();
    for (tenant, ..) in TENANTS {
        let t = billing.usage(tenant, from, to).await?;
        let used = Used {
            requests: t.requests,
            prompt: t.prompt_tokens,
            completion: t.completion_tokens,
        };
        out.insert(tenant, (used, t.gpu_seconds));
    }
    Ok(out)
}
