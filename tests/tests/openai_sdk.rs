#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! The official OpenAI Python SDK against the gateway as a real process:
//! `tests/python/openai_sdk_check.py` runs with the SDK's typed client and
//! checks plain, streamed (usage on the last chunk), content-part and
//! tool-call completions, the tool conversation going to an HTTP upstream
//! (the `engine` binary, signed), the parameters the simulator refuses as
//! `BadRequestError` naming them, a wrong key as `AuthenticationError` and
//! an exhausted rpm as `RateLimitError` with consistent `retry-after` and
//! `retry-after-ms`. The usage the SDK parsed from every 200 then equals
//! what usage_hourly holds per tenant.
//!
//! The SDK comes from `scripts/ensure-tools.sh` (a virtualenv
//! `openai-<version>` under the Meterline cache); without it this test
//! fails.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use tests::gateway::{hourly, seed_tenant, start_gateway_with, start_ingest, TenantLimits};
use tests::TestStack;

const KEY: &str = "sk-test-openai-sdk-0001";
const LIMITED_KEY: &str = "sk-test-openai-sdk-rpm1";
const SIMULATED: &str = "llama-3.1-8b";
const UPSTREAM: &str = "llama-3.1-70b";
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/openai_sdk_check.py");

/// The SDK's python: `$OPENAI_SDK_PYTHON`, else that of the newest
/// `openai-*` virtualenv ensure-tools.sh makes.
fn sdk_python() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("OPENAI_SDK_PYTHON") {
        return Some(path.into());
    }
    let cache = std::env::var_os("METERLINE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/meterline"));
    let mut venvs: Vec<PathBuf> = std::fs::read_dir(&cache)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("openai-"))
        .map(|e| e.path().join("bin/python"))
        .filter(|p| p.exists())
        .collect();
    venvs.sort();
    venvs.pop()
}

/// (requests, prompt, completion) per tenant.
type Totals = std::collections::BTreeMap<String, (i64, i64, i64)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_sdk_gets_typed_answers_and_errors_and_its_usage_is_billed() {
    let python = sdk_python();
    let version = python.as_ref().map(|p| {
        std::process::Command::new(p)
            .args(["-c", "import openai; print(openai.__version__)"])
            .output()
    });
    let python = match (python, version) {
        (Some(p), Some(Ok(out))) if out.status.success() => p,
        (p, v) => {
            panic!("the OpenAI Python SDK is missing ({p:?}: {v:?}): run scripts/ensure-tools.sh")
        }
    };

    let stack = TestStack::new("openaisdk").await;
    seed_tenant(&stack, "sdk", KEY, TenantLimits::default()).await;
    let limited = TenantLimits {
        rpm: Some(1),
        ..TenantLimits::default()
    };
    seed_tenant(&stack, "sdk-rpm1", LIMITED_KEY, limited).await;

    // One model behind the engine binary over HTTP, which checks the
    // identity the gateway signs; the other on the gateway's simulator.
    let secret = tests::engine::random_secret();
    let (_engine, engine_url) = tests::engine::start_engine(stack.dir.path(), 0, &secret).await;
    let upstreams = stack.dir.path().join("upstreams.yaml");
    std::fs::write(
        &upstreams,
        format!(
            "upstreams:
  - model: {UPSTREAM}
    url: {engine_url}
    gpus: 4
    max_context: 131072
    identity_secret_env: {env}
",
            env = tests::engine::SECRET_ENV
        ),
    )
    .unwrap();
    let (gateway, url) = start_gateway_with(
        &stack,
        0,
        &[
            ("GATEWAY_UPSTREAMS", upstreams.display().to_string()),
            (tests::engine::SECRET_ENV, secret),
        ],
    )
    .await;
    let ingest = start_ingest(&stack);

    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new(&python)
            .arg(SCRIPT)
            .env("SDK_CHECK_BASE_URL", format!("{url}/v1"))
            .env("SDK_CHECK_KEY", KEY)
            .env("SDK_CHECK_LIMITED_KEY", LIMITED_KEY)
            .env("SDK_CHECK_SIMULATED_MODEL", SIMULATED)
            .env("SDK_CHECK_UPSTREAM_MODEL", UPSTREAM)
            .env_remove("OPENAI_BASE_URL")
            .env_remove("OPENAI_API_KEY")
            .output(),
    )
    .await
    .expect("the SDK check ran over 5 minutes")
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the SDK check failed ({}):\n{stderr}\n--- its results\n{stdout}\n--- gateway\n{}",
        out.status,
        gateway.log_tail()
    );

    // What the SDK was told for every 200, per tenant.
    let results: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let mut told = Totals::new();
    for r in results.iter().filter(|r| r["status"] == 200) {
        let tenant = match r["key"].as_str() {
            Some("main") => "sdk",
            Some("limited") => "sdk-rpm1",
            other => panic!("a 200 for key {other:?}: {r}"),
        };
        let usage = &r["usage"];
        let e = told.entry(tenant.to_owned()).or_default();
        e.0 += 1;
        e.1 += usage["prompt_tokens"].as_i64().unwrap();
        e.2 += usage["completion_tokens"].as_i64().unwrap();
    }
    // plain, stream, content parts, tools upstream; the rpm-1 key's one.
    assert_eq!(told["sdk"].0, 4, "{stdout}");
    assert_eq!(told["sdk-rpm1"].0, 1, "{stdout}");
    let refused = results.iter().filter(|r| r["status"] == 400).count();
    assert_eq!(refused, 8, "{stdout}");

    // Billed exactly what the SDK reported; refusals and errors not at all.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let billed: Totals = hourly(&stack)
            .await
            .into_iter()
            .map(|(t, (r, p, _, c))| (t, (r, p, c)))
            .collect();
        if billed == told {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "usage_hourly never matched the SDK's usage.\nSDK    {told:?}\nbilled {billed:?}\n--- gateway\n{}\n--- ingest\n{}",
            gateway.log_tail(),
            ingest.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Nothing more arrives later (a refusal billed late).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let billed: Totals = hourly(&stack)
        .await
        .into_iter()
        .map(|(t, (r, p, _, c))| (t, (r, p, c)))
        .collect();
    assert_eq!(billed, told);
}
