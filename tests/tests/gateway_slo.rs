#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! A tenant's typed SLO and its 60 s window: `GET /v1/slo` answers the
//! caller's own tenant (percentiles and compliance), `/metrics` carries
//! `slo_compliance_ratio{tenant,metric}`, and a bad `slo:` in the tenants
//! file stops the gateway with the tenant and the field named.

use serde_json::{json, Value};
use tests::gateway::{metrics, seed_tenant, start_gateway};
use tests::TestStack;

const KEY: &str = "sk-test-slo-0001";
const OTHER: &str = "sk-test-slo-other-0001";

/// `GET /v1/slo` with `key`.
async fn slo_window(client: &reqwest::Client, url: &str, key: &str) -> Value {
    let res = client
        .get(format!("{url}/v1/slo"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slo_window_is_reported_per_tenant() {
    let stack = TestStack::new("gwslo").await;
    seed_tenant(&stack, "slo", KEY, Default::default()).await;
    seed_tenant(&stack, "slo-other", OTHER, Default::default()).await;
    sqlx::query(
        "UPDATE tenants SET slo_ttft_p95_ms = 100, slo_e2e_p95_ms = 600000,
                slo_availability_bp = 9990 WHERE tenant_id = 'slo'",
    )
    .execute(&stack.pool)
    .await
    .unwrap();
    let (_gateway, url) = start_gateway(&stack, 0).await;
    let client = reqwest::Client::new();
    let send = |content: String, key: &'static str| {
        client
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth(key)
            .json(&json!({
                "model": "llama-3.1-70b",
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 5,
            }))
            .send()
    };
    // Three short prompts (TTFT well under 100 ms) and one long one
    // (a ~20k-token prefill takes the 70B most of a second).
    for n in 0..3 {
        assert_eq!(send(format!("short {n}"), KEY).await.unwrap().status(), 200);
    }
    let long = "lorem ipsum dolor sit amet ".repeat(4_000);
    assert_eq!(send(long, KEY).await.unwrap().status(), 200);
    assert_eq!(send("other".into(), OTHER).await.unwrap().status(), 200);

    let window = slo_window(&client, &url, KEY).await;
    assert_eq!(window["tenant"], "slo", "{window}");
    assert_eq!(window["requests"], 4, "its own requests only: {window}");
    assert_eq!(window["objectives"]["ttft_p95_ms"], 100);
    assert_eq!(window["compliance"]["ttft"], 0.75, "{window}");
    assert_eq!(window["compliance"]["e2e"], 1.0);
    assert_eq!(window["compliance"]["availability"], 1.0);
    assert!(window["ttft"]["p95_ms"].as_u64().unwrap() > 100, "{window}");
    let other = slo_window(&client, &url, OTHER).await;
    assert_eq!(other["tenant"], "slo-other");
    assert_eq!(other["requests"], 1);
    assert!(
        other["compliance"]["ttft"].is_null(),
        "no objective: {other}"
    );
    let unauthenticated = client.get(format!("{url}/v1/slo")).send().await.unwrap();
    assert_eq!(unauthenticated.status(), 401);
    // Another tenant cannot be asked for: a parameter is refused, by name.
    let asked = client
        .get(format!("{url}/v1/slo?tenant=slo-other"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(asked.status(), 400);
    let v: Value = asked.json().await.unwrap();
    assert_eq!(v["error"]["param"], "tenant", "{v}");

    let m = metrics(&url).await;
    assert!(
        m.lines()
            .any(|l| l == "slo_compliance_ratio{tenant=\"slo\",metric=\"ttft\"} 0.75"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_slo_in_the_tenants_file_names_the_tenant_and_the_field() {
    let stack = TestStack::new("gwslobad").await;
    let file = stack.dir.path().join("tenants.yaml");
    std::fs::write(
        &file,
        "tenants:
  - name: bad-slo
    plan: standard
    priority: 3
    weight: 1
    rateLimit: { requestsPerSecond: 1, burst: 1 }
    maxConcurrency: 1
    billingMode: per_token
    slo: { e2eP95Ms: 1500, availability: \"100.5\" }
",
    )
    .unwrap();
    let out = std::process::Command::new(tests::process::bin_dir().join("billing-api"))
        .args(["tenants", "apply"])
        .arg(&file)
        .env("DATABASE_URL", &stack.database_url)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad-slo") && err.contains("slo") && err.contains("availability"),
        "{err}"
    );
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tenants WHERE tenant_id = 'bad-slo'")
            .fetch_one(&stack.pool)
            .await
            .unwrap();
    assert_eq!(stored, 0, "a refused file writes nothing");
}
