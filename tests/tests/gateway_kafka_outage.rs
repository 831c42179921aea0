#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! The broker stopped in the middle of traffic: the gateway keeps answering,
//! its outbox grows, and once the broker is back every answered request is
//! billed exactly once.
//!
//! The broker is the test's own (a private Nisshi on a free port), so
//! stopping it touches no other test.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tests::gateway::{outbox_depth, seed_tenant, start_gateway, start_ingest, wait_for, Told};
use tests::stack::Private;
use tests::TestStack;

const TENANTS: [&str; 5] = [
    "outage-acme",
    "outage-medai",
    "outage-finserv",
    "outage-research",
    "outage-codegen",
];
fn key(tenant: &str) -> String {
    format!("sk-test-{tenant}-0001")
}

/// What the clients were told, and the request ids they got.
#[derive(Default)]
struct Answers {
    told: Told,
    ids: Vec<String>,
}

/// Sends a request every `pause` for `tenant` until `stop`; each must be answered 200.
async fn client_loop(
    url: String,
    tenant: &'static str,
    pause: Duration,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    answers: Arc<std::sync::Mutex<Answers>>,
) {
    let client = reqwest::Client::new();
    let key = key(tenant);
    let mut n = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let body = json!({
            "model": if n % 3 == 0 { "llama-3.1-8b" } else { "llama-3.1-70b" },
            "messages": [{"role": "user", "content": format!("{tenant} request {n}: is the broker up?")}],
            "max_tokens": 16 + n % 48,
            "seed": n,
        });
        let res = client
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .await
            .expect("gateway reachable");
        assert_eq!(res.status(), 200, "{tenant} request {n}");
        let id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
        let v: Value = res.json().await.unwrap();
        let u = &v["usage"];
        {
            let mut a = answers.lock().unwrap();
            let e = a.told.entry(tenant.to_owned()).or_default();
            e.0 += 1;
            e.1 += u["prompt_tokens"].as_i64().unwrap();
            e.2 += u["prompt_tokens_details"]["cached_tokens"]
                .as_i64()
                .unwrap();
            e.3 += u["completion_tokens"].as_i64().unwrap();
            a.ids.push(id);
        }
        answered.fetch_add(1, Ordering::Relaxed);
        n += 1;
        tokio::time::sleep(pause).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_down_during_traffic_loses_nothing() {
    let mut stack = TestStack::with(
        "kafkaout",
        Private {
            broker: true,
            ..Private::default()
        },
    )
    .await;
    for tenant in TENANTS {
        seed_tenant(&stack, tenant, &key(tenant), Default::default()).await;
    }
    let (gateway, url) = start_gateway(&stack, 0).await;
    let ingest = start_ingest(&stack);

    // Five clients, ~10 requests a second each, for ~10 s.
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let answers = Arc::new(std::sync::Mutex::new(Answers::default()));
    let clients: Vec<_> = TENANTS
        .iter()
        .map(|tenant| {
            tokio::spawn(client_loop(
                url.clone(),
                tenant,
                Duration::from_millis(100),
                stop.clone(),
                answered.clone(),
                answers.clone(),
            ))
        })
        .collect();

    tokio::time::sleep(Duration::from_secs(3)).await;
    let before_outage = answered.load(Ordering::Relaxed);
    assert!(before_outage > 0, "traffic flows before the outage");

    stack.broker().stop().await;
    // Let whatever was acknowledged before the stop be deleted from the outbox.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let depth_start = outbox_depth(&url).await;
    let answered_start = answered.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let answered_end = answered.load(Ordering::Relaxed);
    let depth_end = outbox_depth(&url).await;
    let during = answered_end - answered_start;
    assert!(
        during >= 50,
        "the gateway keeps answering while the broker is down: {during} answers in 4 s"
    );
    assert!(
        depth_end >= depth_start + during,
        "the outbox holds every event answered during the outage: depth {depth_start} -> {depth_end}, {during} answered"
    );
    stack
        .broker()
        .restart()
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("client task");
    }
    let Answers { told, ids } = std::mem::take(&mut *answers.lock().unwrap());
    let total: i64 = told.values().map(|t| t.0).sum();
    assert_eq!(total as usize, ids.len());
    assert!(
        total as u64 > answered_end,
        "traffic continued after the broker came back"
    );

    eprintln!(
        "answered {total}: {before_outage} before the outage, {during} while the broker was down \
         (outbox depth {depth_start} -> {depth_end})"
    );
    wait_for(&stack, &told, &gateway, &ingest).await;
    // Each answered request is in request_log once, under its X-Request-Id, and nothing else.
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
    let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM request_log")
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    assert_eq!(rows as usize, ids.len());
    // And the outbox drains by itself.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while outbox_depth(&url).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "outbox never drained:\n{}",
            gateway.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
