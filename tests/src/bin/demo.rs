//! The demo's traffic: the five reference tenants call the gateway at their
//! reference request rates (scaled), then the demo waits until billing-api
//! shows every answered request and prints what each tenant used, next to
//! what the clients were told.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rust_decimal::Decimal;
use serde_json::{json, Value};

/// (tenant, demo key, reference requests/s, favourite model)
const TENANTS: [(&str, &str, u32, &str); 5] = [
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

#[derive(Default, Clone, Copy, Debug)]
struct Used {
    requests: i64,
    prompt: i64,
    completion: i64,
}

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let gateway = env("DEMO_GATEWAY_URL", "http://127.0.0.1:8080");
    let billing = env("DEMO_BILLING_URL", "http://127.0.0.1:8082");
    let token = env("BILLING_BOOTSTRAP_FINANCE_TOKEN", "demo-finance-token-0001");
    let seconds: u64 = env("DEMO_SECONDS", "10")
        .parse()
        .context("DEMO_SECONDS must be a number")?;
    // The reference rates add up to 390 requests/s; the demo runs a tenth of that.
    let scale: u32 = env("DEMO_RATE_DIVISOR", "10")
        .parse()
        .context("DEMO_RATE_DIVISOR must be a number")?;
    let client = reqwest::Client::new();
    let started = chrono::Utc::now();
    let from =
        (started - chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let to =
        (started + chrono::Duration::hours(2)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let before = billed_totals(&client, &billing, &token, &from, &to).await?;

    println!(
        "driving {seconds}s of traffic from five tenants at 1/{scale} of their reference rates"
    );
    let mut tasks = Vec::new();
    for (i, (tenant, key, rps, model)) in TENANTS.into_iter().enumerate() {
        let client = client.clone();
        let url = format!("{gateway}/v1/chat/completions");
        tasks.push(tokio::spawn(async move {
            let rate = (rps / scale).max(1);
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / u64::from(rate)));
            let end = Instant::now() + Duration::from_secs(seconds);
            let mut used = Used::default();
            let mut inflight = tokio::task::JoinSet::new();
            let mut n = 0u64;
            while Instant::now() < end {
                tick.tick().await;
                n += 1;
                let body = json!({
                    "model": model,
                    "messages": [{"role": "user", "content": format!(
                        "[{tenant} #{n}] Review this change and list the risks. {}", "context ".repeat((n % 40) as usize * 10 + i))}],
                    "max_tokens": 128 + (n % 5) * 64,
                    "seed": n,
                });
                let req = client.post(&url).bearer_auth(key).json(&body);
                inflight.spawn(async move { req.send().await?.error_for_status()?.json::<Value>().await });
            }
            let mut failed = 0u64;
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
            eprintln!("{tenant}: {failed} requests failed (not answered, so not billed)");
        }
        told.insert(tenant, used);
    }

    // Wait until billing-api shows every answered request on top of what it showed before.
    let deadline = Instant::now() + Duration::from_secs(60);
    let billed = loop {
        let now = billed_totals(&client, &billing, &token, &from, &to).await?;
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
        let caught_up = told
            .iter()
            .all(|(t, u)| delta.get(t).is_some_and(|(b, _)| b.requests >= u.requests));
        if caught_up {
            break delta;
        }
        if Instant::now() > deadline {
            bail!("billing-api did not show every answered request within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };

    println!();
    println!(
        "{:<18} {:>9} {:>12} {:>12} {:>14} {:>10}",
        "tenant", "requests", "prompt tok", "output tok", "GPU-seconds", "matches"
    );
    let mut all_match = true;
    for (tenant, u) in &told {
        let (b, gpu) = &billed[tenant];
        let same = b.requests == u.requests && b.prompt == u.prompt && b.completion == u.completion;
        all_match &= same;
        println!(
            "{tenant:<18} {:>9} {:>12} {:>12} {:>14} {:>10}",
            b.requests,
            b.prompt,
            b.completion,
            gpu,
            if same { "yes" } else { "NO" }
        );
    }
    println!();
    println!(
        "(\"matches\": billed usage equals the usage the gateway reported to clients, exactly)"
    );
    if !all_match {
        bail!("billed usage differs from what clients were told");
    }

    // What each tenant's month looks like now: the draft invoice behind its shadow bill.
    println!();
    println!(
        "{:<18} {:>10} {:>16} {:>10} {:>12} {:>12}",
        "this month", "billed by", "month-to-date", "overhead", "off-peak", "projected"
    );
    for (tenant, ..) in TENANTS {
        let v: Value = client
            .get(format!("{billing}/v1/tenants/{tenant}/shadow-bill"))
            .bearer_auth(&token)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let inv = &v["month_to_date"];
        let text = |v: &Value| v.as_str().unwrap_or("?").to_owned();
        println!(
            "{tenant:<18} {:>10} {:>16} {:>10} {:>12} {:>12}{}",
            text(&inv["billing_mode"]).replace("per_", ""),
            format!("{} {}", text(&inv["total"]), text(&inv["currency"])),
            text(&inv["overhead"]),
            text(&v["off_peak"]["amount"]),
            text(&v["projected_month_total"]),
            if inv["shadow"] == true {
                "  (shadow)"
            } else {
                ""
            },
        );
    }
    Ok(())
}

/// Each tenant's usage totals in billing-api for [from, to).
async fn billed_totals(
    client: &reqwest::Client,
    billing: &str,
    token: &str,
    from: &str,
    to: &str,
) -> anyhow::Result<BTreeMap<&'static str, (Used, Decimal)>> {
    let mut out = BTreeMap::new();
    for (tenant, ..) in TENANTS {
        let v: Value = client
            .get(format!("{billing}/v1/tenants/{tenant}/usage"))
            .query(&[("from", from), ("to", to)])
            .bearer_auth(token)
            .send()
            .await
            .context("billing-api unreachable")?
            .error_for_status()?
            .json()
            .await?;
        let t = &v["totals"];
        let used = Used {
            requests: t["requests"].as_i64().unwrap_or(0),
            prompt: t["prompt_tokens"].as_i64().unwrap_or(0),
            completion: t["completion_tokens"].as_i64().unwrap_or(0),
        };
        let gpu: Decimal = t["gpu_seconds"].as_str().unwrap_or("0").parse()?;
        out.insert(tenant, (used, gpu));
    }
    Ok(out)
}
