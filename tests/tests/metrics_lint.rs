#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! Every `/metrics` Meterline serves (gateway, engine, billing-api, ingest,
//! archiver) passes `promtool check metrics`, Prometheus' own parser and
//! linter, scraped once before any traffic and once after traffic has given
//! the families samples. Latency and size distributions are histograms with
//! explicit buckets, never summaries: a summary whose window has emptied
//! exports quantiles of 0, which reads as "every request took no time".
//!
//! promtool must be installed (`scripts/ensure-tools.sh`); without it this
//! test fails. The one finding accepted is promtool's lint against colons
//! in the engine's `vllm:` names, which are kept on purpose (see
//! [`accepted`]).

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use tests::gateway::{read_sse, seed_tenant, start_gateway_with, TenantLimits};
use tests::process::{free_port, wait_healthy};
use tests::{Service, TestStack};

const KEY: &str = "sk-test-metrics-lint-0001";
const LIMITED_KEY: &str = "sk-test-metrics-lint-0002";
/// Served by the `engine` binary over HTTP.
const UPSTREAM_MODEL: &str = "llama-3.1-70b";
/// Served by the gateway's in-process simulator.
const SIMULATED_MODEL: &str = "llama-3.1-8b";
const FINANCE_TOKEN: &str = "finance-token-for-metrics-lint";

/// A finding of promtool that is not a defect: the engine exports vLLM's
/// metric names (`vllm:kv_cache_usage_perc`, …) so that dashboards and the
/// gateway's own KV poll read it like a vLLM server. Colons are legal in
/// Prometheus metric names; promtool's linter reserves them for recording
/// rules and says so as a lint (exit code 3), not as a parse error (exit
/// code 1). Only that lint, only on `vllm:` names, only for the engine and
/// the gateway (which serves its in-process simulated replicas' metrics
/// under the engine's names).
fn accepted(service: &str, line: &str) -> bool {
    (service == "engine" || service == "gateway")
        && line.starts_with("vllm:")
        && line.ends_with(" metric names should not contain ':'")
}

/// What promtool says about `body` that is not [`accepted`]; empty when
/// the exposition parses and lints clean.
fn promtool_problems(service: &str, body: &str) -> Vec<String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): scripts/ensure-tools.sh installs it (Debian's prometheus package)")
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said: Vec<String> = [&out.stdout, &out.stderr]
        .iter()
        .flat_map(|b| {
            String::from_utf8_lossy(b)
                .into_owned()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    let mut problems: Vec<String> = said
        .iter()
        .filter(|l| !accepted(service, l))
        .cloned()
        .collect();
    // 0: clean; 3: lint findings only (all of them accepted, or listed
    // above); anything else, such as 1 for text that does not parse, fails
    // whatever was printed.
    match out.status.code() {
        Some(0) => {}
        Some(3) if !said.is_empty() => {}
        other => problems.push(format!("promtool exited with {other:?}")),
    }
    problems
}

/// Families rendered as summaries (`# TYPE <name> summary`).
fn summaries(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter(|l| l.ends_with(" summary"))
        .map(str::to_owned)
        .collect()
}

/// Lints every scrape; returns every problem, named by service and round.
fn lint(round: &str, scrapes: &[(&str, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    for (service, body) in scrapes {
        for p in promtool_problems(service, body) {
            problems.push(format!("{service} ({round}): promtool: {p}"));
        }
        for s in summaries(body) {
            problems.push(format!(
                "{service} ({round}): {s}: a summary, not a histogram with explicit buckets"
            ));
        }
    }
    problems
}

async fn scrape(client: &reqwest::Client, url: &str) -> String {
    // billing-api's cost metrics need their bearer token; the others ignore it.
    let res = client
        .get(url)
        .bearer_auth(tests::billing::METRICS_TOKEN)
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{url}: {}", res.status());
    res.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metrics_endpoint_passes_promtool() {
    // Fail at once, not after starting five services.
    let _ = promtool_problems("none", "");

    let stack = TestStack::new("metrics_lint").await;
    let tpm = TenantLimits {
        tpm: Some(10_000_000),
        ..TenantLimits::default()
    };
    seed_tenant(&stack, "lint-corp", KEY, tpm).await;
    let one_a_minute = TenantLimits {
        rpm: Some(1),
        ..TenantLimits::default()
    };
    seed_tenant(&stack, "lint-limited", LIMITED_KEY, one_a_minute).await;
    let dir = stack.dir.path();

    // The engine binary, as the gateway's HTTP upstream for one model.
    let secret = tests::engine::random_secret();
    let (_engine, engine_url) = tests::engine::start_engine(dir, 20, &secret).await;
    let upstreams = dir.join("upstreams.yaml");
    std::fs::write(
        &upstreams,
        format!(
            "upstreams:\n  - model: {UPSTREAM_MODEL}\n    url: {engine_url}\n    gpus: 4\n    max_context: 131072\n    kv_poll_ms: 200\n    identity_secret_env: {}\n",
            tests::engine::SECRET_ENV
        ),
    )
    .unwrap();
    let (gateway, gateway_url) = start_gateway_with(
        &stack,
        0,
        &[
            ("GATEWAY_UPSTREAMS", upstreams.display().to_string()),
            (tests::engine::SECRET_ENV, secret.clone()),
        ],
    )
    .await;

    let ingest_port = free_port();
    let mut env = stack.env();
    env.extend([
        (
            "INGEST_METRICS_ADDR".to_owned(),
            format!("127.0.0.1:{ingest_port}"),
        ),
        ("INGEST_LINGER_MS".to_owned(), "50".to_owned()),
    ]);
    let mut ingest =
        Service::start("ingest", "ingest", &[], env, dir).unwrap_or_else(|e| panic!("{e}"));
    let ingest_url = format!("http://127.0.0.1:{ingest_port}/metrics");
    wait_healthy(&ingest_url, &mut ingest, Duration::from_secs(60)).await;

    let archiver_port = free_port();
    let mut env = stack.env();
    env.extend([
        (
            "ARCHIVE_URL".to_owned(),
            format!("file://{}", dir.join("archive").display()),
        ),
        (
            "ARCHIVE_METRICS_ADDR".to_owned(),
            format!("127.0.0.1:{archiver_port}"),
        ),
        ("ARCHIVE_LINGER_MS".to_owned(), "300".to_owned()),
    ]);
    let mut archiver =
        Service::start("archiver", "archiver", &[], env, dir).unwrap_or_else(|e| panic!("{e}"));
    let archiver_url = format!("http://127.0.0.1:{archiver_port}/metrics");
    wait_healthy(&archiver_url, &mut archiver, Duration::from_secs(60)).await;

    let tests::billing::BillingApi {
        service: billing,
        url: billing_url,
        dir: _billing_dir,
    } = tests::billing::start_billing_api(&stack.database_url, FINANCE_TOKEN).await;

    let client = reqwest::Client::new();
    let endpoints = [
        ("gateway", format!("{gateway_url}/metrics")),
        ("engine", format!("{engine_url}/metrics")),
        ("billing-api", format!("{billing_url}/metrics")),
        ("ingest", ingest_url.clone()),
        ("archiver", archiver_url.clone()),
    ];
    let scrape_all = || async {
        let mut out = Vec::new();
        for (service, url) in &endpoints {
            out.push((*service, scrape(&client, url).await));
        }
        out
    };

    // Before any traffic: families described, nothing observed yet.
    let mut problems = lint("before traffic", &scrape_all().await);

    // Traffic: plain and streamed, on the simulator and the HTTP upstream,
    // and one request refused by a limit.
    let chat = format!("{gateway_url}/v1/chat/completions");
    let mut answered = 0;
    for i in 0..8 {
        let model = if i % 2 == 0 {
            SIMULATED_MODEL
        } else {
            UPSTREAM_MODEL
        };
        let stream = i % 4 >= 2;
        let mut res = client
            .post(&chat)
            .bearer_auth(KEY)
            .json(&json!({
                "model": model,
                "messages": [{"role": "user", "content": format!("metrics lint request {i}")}],
                "max_tokens": 24,
                "stream": stream,
                // OpenAI refuses stream_options without a stream.
                "stream_options": stream.then(|| json!({"include_usage": true})),
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{}", gateway.log_tail());
        if stream {
            let frames = read_sse(&mut res, 10_000).await;
            assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
        } else {
            res.bytes().await.unwrap();
        }
        answered += 1;
    }
    for expected in [200, 429] {
        let res = client
            .post(&chat)
            .bearer_auth(LIMITED_KEY)
            .json(&json!({
                "model": SIMULATED_MODEL,
                "messages": [{"role": "user", "content": "one a minute"}],
                "max_tokens": 8,
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), expected);
        res.bytes().await.unwrap();
        answered += i64::from(expected == 200);
    }
    stack
        .wait_count(
            "SELECT count(*) FROM request_log",
            answered,
            &ingest,
            Duration::from_secs(90),
        )
        .await;
    stack
        .wait_count(
            "SELECT coalesce(sum(rows), 0)::bigint FROM archive_manifest WHERE retired_at IS NULL",
            answered,
            &archiver,
            Duration::from_secs(90),
        )
        .await;

    // billing-api renders its cost metrics at most every 30 s: wait for a
    // rendering that has this traffic in it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !scrape(&client, &endpoints[2].1)
        .await
        .contains("gpu_seconds_total{tenant=\"lint-corp\"}")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "billing-api's /metrics never showed lint-corp:\n{}",
            billing.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let after = scrape_all().await;
    problems.extend(lint("after traffic", &after));
    // The scrape covered what it is meant to: each service's distributions
    // and cost figures have samples.
    let expected: [(&str, &[&str]); 5] = [
        (
            "gateway",
            &[
                "gateway_e2e_seconds_bucket{",
                "gateway_ttft_seconds_bucket{",
                "gateway_requests_total{",
                "gateway_rejections_total{",
                "gateway_upstream_busy_gpu_seconds_total{",
            ],
        ),
        (
            "engine",
            &[
                "vllm:time_to_first_token_seconds_bucket{",
                "vllm:inter_token_latency_seconds_bucket{",
                "meterline_engine_attributed_gpu_seconds_total{",
            ],
        ),
        (
            "billing-api",
            &[
                "gpu_seconds_total{",
                "preemption_waste_seconds_total{",
                "request_cost_dollars_total{",
            ],
        ),
        (
            "ingest",
            &[
                "ingest_batch_size_bucket{",
                "ingest_commit_seconds_bucket{",
                "ingest_events_total{",
            ],
        ),
        (
            "archiver",
            &[
                "archive_commit_seconds_bucket{",
                "archive_batch_seconds_bucket{",
                "archive_rows_total",
            ],
        ),
    ];
    for ((service, body), (named, samples)) in after.iter().zip(expected) {
        assert_eq!(*service, named);
        for prefix in samples {
            if !body.lines().any(|l| l.starts_with(prefix)) {
                problems.push(format!("{service} (after traffic): no sample `{prefix}…`"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}\n\nafter traffic:\n{}",
        problems.len(),
        problems.join("\n"),
        after
            .iter()
            .map(|(s, b)| format!("== {s}\n{b}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
