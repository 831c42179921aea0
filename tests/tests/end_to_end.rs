//! One request path, end to end, across real processes: gateway-lite →
//! outbox → relay → broker → ingest → Postgres → billing-api. What clients
//! were told they used must be exactly what usage_hourly and billing-api say.

use std::time::Duration;

use rust_decimal::Decimal;
use serde_json::{json, Value};
use tests::gateway::{outbox_depth, wait_for, Told};
use tests::process::{free_port, wait_healthy};
use tests::{Service, TestStack};

const TENANTS: [(&str, &str); 5] = [
    ("acme-corp", "sk-demo-acme-corp-0001"),
    ("medai-labs", "sk-demo-medai-labs-0001"),
    ("finserv-team", "sk-demo-finserv-team-0001"),
    ("research-squad", "sk-demo-research-squad-0001"),
    ("codegen-platform", "sk-demo-codegen-platform-0001"),
];
const FINANCE_TOKEN: &str = "finance-token-for-e2e-tests";

struct Running {
    gateway: Service,
    ingest: Service,
    billing: Service,
    gateway_url: String,
    billing_url: String,
}

async fn start_all(stack: &TestStack) -> Running {
    tests::billing::apply_tenants(&stack.database_url, tests::billing::REFERENCE_TENANTS);
    let gw_port = free_port();
    let billing_port = free_port();
    let mut env = stack.env();
    env.insert("GATEWAY_ADDR".into(), format!("127.0.0.1:{gw_port}"));
    env.insert(
        "GATEWAY_OUTBOX".into(),
        stack.dir.path().join("outbox").display().to_string(),
    );
    env.insert("ENGINE_SPEEDUP".into(), "0".into());
    env.insert("BILLING_ADDR".into(), format!("127.0.0.1:{billing_port}"));
    env.insert(
        "BILLING_BOOTSTRAP_FINANCE_TOKEN".into(),
        FINANCE_TOKEN.into(),
    );
    env.insert(
        "INGEST_METRICS_ADDR".into(),
        format!("127.0.0.1:{}", free_port()),
    );
    env.insert("INGEST_LINGER_MS".into(), "50".into());
    let log_dir = stack.dir.path();
    let mut gateway = Service::start("gateway", "gateway-lite", &[], env.clone(), log_dir)
        .unwrap_or_else(|e| panic!("{e}"));
    let gateway_url = format!("http://127.0.0.1:{gw_port}");
    wait_healthy(
        &format!("{gateway_url}/healthz"),
        &mut gateway,
        Duration::from_secs(60),
    )
    .await;
    let ingest = Service::start("ingest", "ingest", &[], env.clone(), log_dir)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut billing = Service::start("billing", "billing-api", &[], env, log_dir)
        .unwrap_or_else(|e| panic!("{e}"));
    let billing_url = format!("http://127.0.0.1:{billing_port}");
    wait_healthy(
        &format!("{billing_url}/healthz"),
        &mut billing,
        Duration::from_secs(60),
    )
    .await;
    Running {
        gateway,
        ingest,
        billing,
        gateway_url,
        billing_url,
    }
}

/// Sends requests from every tenant; returns what each was told, and the request ids.
async fn send_requests(
    client: &reqwest::Client,
    gateway_url: &str,
    per_tenant: usize,
) -> (Told, Vec<String>) {
    let mut told = Told::new();
    let mut ids = Vec::new();
    for (i, (tenant, key)) in TENANTS.iter().enumerate() {
        for n in 0..per_tenant {
            let body = json!({
                "model": if n % 3 == 0 { "llama-3.1-8b" } else { "llama-3.1-70b" },
                "messages": [{"role": "user", "content": format!("tenant {i} request {n}: summarize the quarterly GPU bill")}],
                "max_tokens": 64 + n as u32,
                "seed": n,
            });
            // The reference tenants have request buckets (research-squad:
            // 10/s, burst 5): back off as told, like a well-behaved client.
            let res = loop {
                let res = client
                    .post(format!("{gateway_url}/v1/chat/completions"))
                    .bearer_auth(key)
                    .json(&body)
                    .send()
                    .await
                    .expect("gateway reachable");
                if res.status() != 429 {
                    break res;
                }
                let wait: u64 = res.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                tokio::time::sleep(Duration::from_secs(wait)).await;
            };
            assert_eq!(res.status(), 200);
            let id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
            assert!(id.starts_with("req_"), "X-Request-Id {id}");
            ids.push(id);
            let v: Value = res.json().await.unwrap();
            let u = &v["usage"];
            let entry = told.entry(tenant.to_string()).or_default();
            entry.0 += 1;
            entry.1 += u["prompt_tokens"].as_i64().unwrap();
            entry.2 += u["prompt_tokens_details"]["cached_tokens"]
                .as_i64()
                .unwrap();
            entry.3 += u["completion_tokens"].as_i64().unwrap();
            assert_eq!(
                u["total_tokens"].as_i64().unwrap(),
                u["prompt_tokens"].as_i64().unwrap() + u["completion_tokens"].as_i64().unwrap()
            );
        }
    }
    (told, ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_clients_were_told_are_exactly_what_is_billed() {
    let stack = TestStack::new("e2e").await;
    let running = start_all(&stack).await;
    let client = reqwest::Client::new();
    let (told, ids) = send_requests(&client, &running.gateway_url, 8).await;
    wait_for(&stack, &told, &running.gateway, &running.ingest).await;

    // Each answered request is in request_log exactly once, under its X-Request-Id.
    let uuids: Vec<uuid::Uuid> = ids
        .iter()
        .map(|id| id.strip_prefix("req_").unwrap().parse().unwrap())
        .collect();
    let (found,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM request_log WHERE request_id = ANY($1)")
            .bind(&uuids)
            .fetch_one(&stack.pool)
            .await
            .unwrap();
    assert_eq!(found as usize, ids.len());
    let (total,): (i64,) = sqlx::query_as("SELECT count(*) FROM request_log")
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    assert_eq!(total as usize, ids.len());

    // billing-api returns the same figures, and GPU-seconds agree with request_log.
    let now = chrono::Utc::now();
    let from =
        (now - chrono::Duration::hours(2)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let to = (now + chrono::Duration::hours(2)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    for (tenant, (requests, prompt, cached, completion)) in &told {
        let v: Value = client
            .get(format!("{}/v1/tenants/{tenant}/usage", running.billing_url))
            .query(&[("from", &from), ("to", &to)])
            .bearer_auth(FINANCE_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let t = &v["totals"];
        assert_eq!(t["requests"].as_i64().unwrap(), *requests, "{tenant}: {v}");
        assert_eq!(t["prompt_tokens"].as_i64().unwrap(), *prompt, "{tenant}");
        assert_eq!(t["cached_tokens"].as_i64().unwrap(), *cached, "{tenant}");
        assert_eq!(
            t["completion_tokens"].as_i64().unwrap(),
            *completion,
            "{tenant}"
        );
        let (log_gpu,): (Decimal,) =
            sqlx::query_as("SELECT sum(gpu_seconds) FROM request_log WHERE tenant_id = $1")
                .bind(tenant)
                .fetch_one(&stack.pool)
                .await
                .unwrap();
        let api_gpu: Decimal = t["gpu_seconds"].as_str().unwrap().parse().unwrap();
        assert_eq!(api_gpu, log_gpu, "{tenant}");
        assert!(api_gpu > Decimal::ZERO);
    }
    // Ingest kept the per-key rollup in the same transactions: it equals
    // request_log grouped by tenant, key, model, priority and hour, row for row.
    let (differ, keyed): (i64, i64) = sqlx::query_as(
        "WITH r AS (
             SELECT tenant_id, api_key_id, model, priority,
                    date_trunc('hour', started_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour,
                    count(*) AS requests, sum(prompt_tokens) AS prompt, sum(cached_tokens) AS cached,
                    sum(completion_tokens) AS completion, sum(gpu_seconds) AS gpu
             FROM request_log GROUP BY 1, 2, 3, 4, 5)
         SELECT count(*) FILTER (WHERE r.requests IS DISTINCT FROM k.requests
                    OR r.prompt IS DISTINCT FROM k.prompt_tokens
                    OR r.cached IS DISTINCT FROM k.cached_tokens
                    OR r.completion IS DISTINCT FROM k.completion_tokens
                    OR r.gpu IS DISTINCT FROM k.gpu_seconds),
                count(k.requests)
         FROM r FULL JOIN usage_key_hourly k USING (tenant_id, api_key_id, model, priority, hour)",
    )
    .fetch_one(&stack.pool)
    .await
    .unwrap();
    assert_eq!(differ, 0, "usage_key_hourly disagrees with request_log");
    assert!(keyed > 0);
    drop(running.billing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_and_are_not_billed() {
    let stack = TestStack::new("errors").await;
    let running = start_all(&stack).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", running.gateway_url);
    let ok_body = json!({"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]});

    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (client.post(&url).json(&ok_body), 401, "invalid_api_key"),
        (client.post(&url).bearer_auth("sk-wrong").json(&ok_body), 401, "invalid_api_key"),
        (
            client.post(&url).bearer_auth(TENANTS[0].1).header("content-type", "application/json").body("{not json"),
            400,
            "",
        ),
        (
            client.post(&url).bearer_auth(TENANTS[0].1).json(&json!({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]})),
            404,
            "model_not_found",
        ),
        (
            client.post(&url).bearer_auth(TENANTS[2].1).json(&json!({"model": "llama-3.1-8b", "max_tokens": 999_999, "messages": [{"role": "user", "content": "hi"}]})),
            400,
            "",
        ),
    ];
    for (req, status, code) in cases {
        let res = req.send().await.unwrap();
        assert_eq!(res.status().as_u16(), status);
        assert!(
            res.headers().contains_key("x-request-id"),
            "every response carries X-Request-Id"
        );
        let v: Value = res.json().await.unwrap();
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        assert!(v["error"]["type"].is_string(), "{v}");
        if !code.is_empty() {
            assert_eq!(v["error"]["code"], code, "{v}");
        }
    }
    // One good request, so we know the pipeline is flowing, then nothing else is billed.
    let res = client
        .post(&url)
        .bearer_auth(TENANTS[0].1)
        .json(&ok_body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let v: Value = res.json().await.unwrap();
    let mut expected = Told::new();
    expected.insert(
        "acme-corp".into(),
        (
            1,
            v["usage"]["prompt_tokens"].as_i64().unwrap(),
            0,
            v["usage"]["completion_tokens"].as_i64().unwrap(),
        ),
    );
    wait_for(&stack, &expected, &running.gateway, &running.ingest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn team_lead_cannot_see_other_tenant() {
    let stack = TestStack::new("roles").await;
    let running = start_all(&stack).await;
    sqlx::query(
        "INSERT INTO billing_tokens (token_id, token_hash, role, tenant_id)
         VALUES ('lead-acme', sha256('lead-token-acme-0001'::bytea), 'team_lead', 'acme-corp'),
                ('support-1', sha256('support-token-0001'::bytea), 'support', NULL)",
    )
    .execute(&stack.pool)
    .await
    .unwrap();
    let client = reqwest::Client::new();
    let get = |tenant: &str, token: &str| {
        client
            .get(format!("{}/v1/tenants/{tenant}/usage", running.billing_url))
            .query(&[
                ("from", "2026-01-01T00:00:00Z"),
                ("to", "2026-02-01T00:00:00Z"),
            ])
            .bearer_auth(token)
            .send()
    };
    assert_eq!(
        get("acme-corp", "lead-token-acme-0001")
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        get("medai-labs", "lead-token-acme-0001")
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(
        get("no-such-tenant", "lead-token-acme-0001")
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(
        get("acme-corp", "support-token-0001")
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(get("acme-corp", "not-a-token").await.unwrap().status(), 401);
    assert_eq!(get("acme-corp", FINANCE_TOKEN).await.unwrap().status(), 200);
    let (audited,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM audit_log WHERE action = 'read_usage'")
            .fetch_one(&stack.pool)
            .await
            .unwrap();
    assert_eq!(
        audited, 2,
        "each read of usage is audited, refusals are not reads"
    );
    drop(running.gateway);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_sigkill_loses_no_answered_event() {
    let stack = TestStack::new("gwkill").await;
    tests::billing::apply_tenants(&stack.database_url, tests::billing::REFERENCE_TENANTS);
    let port = free_port();
    let mut env = stack.env();
    env.insert("GATEWAY_ADDR".into(), format!("127.0.0.1:{port}"));
    env.insert(
        "GATEWAY_OUTBOX".into(),
        stack.dir.path().join("outbox").display().to_string(),
    );
    env.insert("ENGINE_SPEEDUP".into(), "0".into());
    // The broker is unreachable at first: every answered request's event can
    // only be in the outbox when the gateway is killed.
    env.insert("KAFKA_BROKERS".into(), format!("127.0.0.1:{}", free_port()));
    let mut gateway = Service::start("gateway", "gateway-lite", &[], env, stack.dir.path())
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!("http://127.0.0.1:{port}");
    wait_healthy(
        &format!("{url}/healthz"),
        &mut gateway,
        Duration::from_secs(60),
    )
    .await;
    let client = reqwest::Client::new();
    let (told, _) = send_requests(&client, &url, 4).await;
    assert_eq!(
        outbox_depth(&url).await,
        20,
        "all 20 events wait in the outbox"
    );
    let age = tests::gateway::gauge(&url, "gateway_outbox_age_seconds").await;
    assert!(age > 0.0, "the oldest waiting event has an age, got {age}");
    kill_and_restart(&mut gateway, &url, &stack.brokers).await;
    let mut ingest_env = stack.env();
    ingest_env.insert(
        "INGEST_METRICS_ADDR".into(),
        format!("127.0.0.1:{}", free_port()),
    );
    ingest_env.insert("INGEST_LINGER_MS".into(), "50".into());
    let ingest = Service::start("ingest", "ingest", &[], ingest_env, stack.dir.path())
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for(&stack, &told, &gateway, &ingest).await;

    // Killed again just after the relay published everything: the deletions
    // of published events need not be on disk yet (they ride on the next
    // durable commit), so the restarted relay may publish some again.
    // Ingest must still count each request once.
    let (more, _) = send_requests(&client, &url, 4).await;
    wait_outbox_drained(&url).await;
    kill_and_restart(&mut gateway, &url, &stack.brokers).await;
    let mut told = told;
    for (tenant, (r, p, c, o)) in more {
        let t = told.entry(tenant).or_default();
        *t = (t.0 + r, t.1 + p, t.2 + c, t.3 + o);
    }
    wait_for(&stack, &told, &gateway, &ingest).await;
    // And it stays so once whatever the restarted relay re-sent is in.
    wait_outbox_drained(&url).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(tests::gateway::hourly(&stack).await, told);
}

/// SIGKILLs the gateway and starts it again, now with the broker.
async fn kill_and_restart(gateway: &mut Service, url: &str, brokers: &str) {
    gateway.kill9().await;
    gateway
        .restart_with(&[("KAFKA_BROKERS", brokers)])
        .unwrap_or_else(|e| panic!("{e}"));
    wait_healthy(&format!("{url}/healthz"), gateway, Duration::from_secs(60)).await;
}

/// Waits until the gateway's relay has published everything in its outbox.
async fn wait_outbox_drained(url: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while outbox_depth(url).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the outbox never drained"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_stops_working_within_seconds() {
    let stack = TestStack::new("revoke").await;
    let running = start_all(&stack).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", running.gateway_url);
    let body = json!({"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]});
    let ask = || {
        client
            .post(&url)
            .bearer_auth(TENANTS[1].1)
            .json(&body)
            .send()
    };
    assert_eq!(ask().await.unwrap().status(), 200);
    sqlx::query("UPDATE api_keys SET revoked_at = now() WHERE api_key_id = 'key_medai_demo'")
        .execute(&stack.pool)
        .await
        .unwrap();
    let revoked = tokio::time::Instant::now();
    loop {
        let status = ask().await.unwrap().status();
        if status == 401 {
            break;
        }
        assert_eq!(status, 200);
        assert!(
            revoked.elapsed() < Duration::from_secs(5),
            "the key still works 5 s after it was revoked"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Other tenants' keys are unaffected.
    let other = client
        .post(&url)
        .bearer_auth(TENANTS[0].1)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);
}

/// The gateway SIGKILLed three times while clients keep sending: appends in
/// flight, a group half written, the relay publishing. Every request a
/// client got a 200 for is billed exactly once; nothing is billed that was
/// not sent (a request whose answer the kill cut off may or may not be:
/// its event may have reached the disk first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_sigkill_mid_traffic_bills_each_answered_request_once() {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let stack = TestStack::new("gwkillmid").await;
    tests::billing::apply_tenants(&stack.database_url, tests::billing::REFERENCE_TENANTS);
    let (mut gateway, url) = tests::gateway::start_gateway(&stack, 0).await;
    let ingest = tests::gateway::start_ingest(&stack);
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for w in 0..8usize {
        let (stop, endpoint) = (stop.clone(), format!("{url}/v1/chat/completions"));
        clients.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            // (request ids answered 200, 429s, requests without an answer)
            let (mut answered, mut limited, mut cut) = (Vec::new(), 0usize, 0usize);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let body = json!({
                    "model": "llama-3.1-8b",
                    "messages": [{"role": "user", "content": format!("kill test {w} {i}")}],
                    "max_tokens": 8,
                });
                let sent = client
                    .post(&endpoint)
                    .bearer_auth(TENANTS[w % TENANTS.len()].1)
                    .json(&body)
                    .send()
                    .await;
                let Ok(res) = sent else {
                    cut += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                let status = res.status().as_u16();
                let id = res
                    .headers()
                    .get("x-request-id")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                match (status, res.bytes().await) {
                    (200, Ok(_)) => answered.push(id.expect("a 200 carries X-Request-Id")),
                    (200, Err(_)) => cut += 1,
                    (429, _) => limited += 1,
                    (other, _) => panic!("unexpected status {other}"),
                }
            }
            (answered, limited, cut)
        }));
    }
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(800)).await;
        gateway.kill9().await;
        gateway.restart_with(&[]).unwrap_or_else(|e| panic!("{e}"));
        wait_healthy(
            &format!("{url}/healthz"),
            &mut gateway,
            Duration::from_secs(60),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut answered, mut cut) = (HashSet::new(), 0usize);
    for c in clients {
        let (ids, _limited, lost) = c.await.unwrap();
        answered.extend(ids.into_iter().map(|id| {
            id.parse::<usage_contract::RequestId>()
                .expect("request id")
                .as_uuid()
        }));
        cut += lost;
    }
    assert!(answered.len() > 100, "only {} answered", answered.len());
    eprintln!("{} answered, {cut} cut off by the kills", answered.len());
    wait_outbox_drained(&url).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let stored: HashSet<uuid::Uuid> = loop {
        let ids: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT request_id FROM request_log")
            .fetch_all(&stack.pool)
            .await
            .unwrap();
        let ids: HashSet<uuid::Uuid> = ids.into_iter().collect();
        if answered.is_subset(&ids) {
            break ids;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} answered requests never billed (gateway log: {}, ingest log: {})",
            answered.difference(&ids).count(),
            gateway.log_tail(),
            ingest.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        stored.len() <= answered.len() + cut,
        "{} billed, but only {} answered and {cut} cut off",
        stored.len(),
        answered.len()
    );
    eprintln!("{} billed", stored.len());
    // Whatever the restarted relays sent again is in by now: counted once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let requests: i64 = tests::gateway::hourly(&stack)
        .await
        .values()
        .map(|t| t.0)
        .sum();
    assert_eq!(requests, stored.len() as i64);
}
