#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! Three gateways on one private Redis that loses its state (`FLUSHALL`,
//! or SIGKILL and an empty restart), or a gateway SIGKILLed: an idempotent
//! request refused before it is answered keeps one `X-Request-Id` and is
//! billed once wherever its retries land; a tenant's concurrency cap holds
//! across each reset with streams in flight; a gateway killed at the cap
//! frees its tenant within the liveness interval, restarted under its id
//! or replaced by one of a new id.

use std::time::{Duration, Instant};

use devstack::PrivateRedis;
use futures_util::future::join_all;
use serde_json::{json, Value};
use tests::gateway::{
    metrics, seed_tenant, start_gateway_named, start_ingest, wait_for_log, TenantLimits,
};
use tests::process::wait_healthy;
use tests::{Service, TestStack};

/// The liveness interval: what a dead gateway held returns within it.
const RECLAIM: Duration = Duration::from_secs(15);

async fn gateway(stack: &TestStack, id: &str, redis: &PrivateRedis) -> (Service, String) {
    start_gateway_named(stack, id, 1, &[("REDIS_URL", redis.url())]).await
}

/// Waits until the gateway at `url` leases from Redis again.
async fn wait_shared(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !metrics(url)
        .await
        .lines()
        .any(|l| l == "gateway_limits_mode{mode=\"shared\"} 1")
    {
        assert!(Instant::now() < deadline, "{url} never back in shared mode");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Kills Redis and starts it again, empty; returns once every gateway
/// leases from it again.
async fn restart_empty(redis: &mut PrivateRedis, urls: &[String]) {
    redis.kill9().await;
    redis.restart().await.unwrap();
    for url in urls {
        wait_shared(url).await;
    }
}

/// A streamed request on the 70B that runs about 15 s (600 tokens at its
/// real-time pace) for `key`: a short request of the same prompt picks
/// the seed of a long answer.
async fn long_stream(client: &reqwest::Client, url: &str, key: &str) -> Value {
    let mut body = json!({
        "model": "llama-3.1-70b",
        "messages": [{"role": "user", "content": "hold the line"}],
        "max_tokens": 1,
    });
    let res = client
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let v: Value = res.json().await.unwrap();
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    body["seed"] = json!(tests::engine::seed_for_long_answer(prompt, 590));
    body["max_tokens"] = json!(4000);
    body["stream"] = json!(true);
    body
}

/// Sends `body` to `url`: the stream once its first chunk arrived, or the
/// 429's body (any other answer fails the test).
async fn try_open(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: &Value,
) -> Result<reqwest::Response, Value> {
    let mut res = client
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap();
    match res.status().as_u16() {
        200 => {
            assert!(res.chunk().await.unwrap().is_some(), "the stream started");
            Ok(res)
        }
        429 => {
            let v: Value = res.json().await.unwrap();
            assert_eq!(v["error"]["type"], "concurrency", "{v}");
            Err(v)
        }
        s => panic!("{url}: status {s}: {}", res.text().await.unwrap()),
    }
}

/// Whether `res`'s body has ended: reads what it sends for 100 ms (a
/// stream the simulator finished early is all there, in a few ms; one
/// still running sends a token every ~25 ms and is not over by then).
async fn ended(res: &mut reqwest::Response) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
    loop {
        match tokio::time::timeout_at(deadline, res.chunk()).await {
            Err(_) => return false,
            Ok(Ok(Some(_))) => {}
            Ok(_) => return true,
        }
    }
}

/// Opens `n` streams on `url`, retrying refusals for up to 10 s (units a
/// gateway let go of come back within a second or two).
async fn open_n(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: &Value,
    n: usize,
) -> Vec<reqwest::Response> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut open = Vec::new();
    while open.len() < n {
        match try_open(client, url, key, body).await {
            Ok(res) => open.push(res),
            Err(v) => {
                assert!(Instant::now() < deadline, "{url} refused for 10 s: {v}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    open
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_concurrency_cap_holds_across_a_redis_flush_and_an_empty_restart() {
    let mut redis = PrivateRedis::start().await.unwrap();
    let stack = TestStack::new("gwcapreset").await;
    const KEY: &str = "sk-test-capreset-0001";
    const CAP: usize = 2;
    let limits = TenantLimits {
        max_concurrency: Some(CAP as i32),
        ..Default::default()
    };
    seed_tenant(&stack, "capreset", KEY, limits).await;
    let mut gateways = Vec::new();
    for id in ["gw-a", "gw-b", "gw-c"] {
        gateways.push(gateway(&stack, id, &redis).await);
    }
    let urls: Vec<String> = gateways.iter().map(|(_, u)| u.clone()).collect();
    let client = reqwest::Client::new();
    let body = long_stream(&client, &urls[0], KEY).await;
    let logs = |gateways: &[(Service, String)]| {
        let tails: Vec<String> = gateways.iter().map(|(s, _)| s.log_tail()).collect();
        tails.join("\n---\n")
    };

    for (holder, reset) in [(0, "a FLUSHALL"), (1, "an empty restart")] {
        // The tenant at its cap: two streams in flight on one gateway.
        let held = open_n(&client, &urls[holder], KEY, &body, CAP).await;
        if holder == 0 {
            redis.flushall().await.unwrap();
        } else {
            restart_empty(&mut redis, &urls).await;
        }
        // Redis forgot the two; at once, six more round robin: none may
        // run beside them.
        let wave = join_all((0..6).map(|n| try_open(&client, &urls[n % 3], KEY, &body))).await;
        let admitted = wave.into_iter().filter(Result::is_ok).count();
        assert_eq!(
            admitted,
            0,
            "after {reset}, {admitted} admitted beside the {CAP} in flight\n{}",
            logs(&gateways)
        );
        // The two end. New streams keep coming round robin for 11 s, each
        // admitted one kept open until it ends: never more than the cap in
        // flight at once, and the cap is usable again once Redis settled.
        drop(held);
        let mut open: Vec<(usize, reqwest::Response)> = Vec::new();
        let mut admitted = 0;
        let until = Instant::now() + Duration::from_secs(11);
        while Instant::now() < until {
            let wave = join_all(urls.iter().map(|u| try_open(&client, u, KEY, &body))).await;
            let before = open.len();
            open.extend(
                wave.into_iter()
                    .enumerate()
                    .filter_map(|(g, r)| Some((g, r.ok()?))),
            );
            admitted += open.len() - before;
            // A stream that ended (its gateway let its slot go as the last
            // bytes left) is no longer in flight.
            let mut running = Vec::new();
            for (g, mut res) in open {
                if !ended(&mut res).await {
                    running.push((g, res));
                }
            }
            open = running;
            assert!(
                open.len() <= CAP,
                "after {reset}: {} streams admitted at once (on gateways {:?}), cap {CAP}\n{}",
                open.len(),
                open.iter().map(|(g, _)| *g).collect::<Vec<_>>(),
                logs(&gateways)
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        assert!(
            admitted >= CAP,
            "after {reset} the cap is in use again: {admitted} admitted\n{}",
            logs(&gateways)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_killed_at_the_cap_frees_its_tenant_under_its_id_or_a_new_one() {
    let redis = PrivateRedis::start().await.unwrap();
    let stack = TestStack::new("gwkillcap").await;
    const KEY: &str = "sk-test-killcap-0001";
    let limits = TenantLimits {
        max_concurrency: Some(3),
        ..Default::default()
    };
    seed_tenant(&stack, "killcap", KEY, limits).await;
    let (mut a, url_a) = gateway(&stack, "gw-a", &redis).await;
    let (mut b, url_b) = gateway(&stack, "gw-b", &redis).await;
    let client = reqwest::Client::new();
    let body = long_stream(&client, &url_a, KEY).await;

    // a holds the whole cap, is SIGKILLed and comes back under its id:
    // what its previous life held no longer counts, on a or on b.
    let held = open_n(&client, &url_a, KEY, &body, 3).await;
    assert!(try_open(&client, &url_b, KEY, &body).await.is_err());
    a.kill9().await;
    let killed = Instant::now();
    drop(held);
    a.restart().unwrap_or_else(|e| panic!("{e}"));
    wait_healthy(&format!("{url_a}/healthz"), &mut a, Duration::from_secs(60)).await;
    wait_shared(&url_a).await;
    let admitted = loop {
        if let Ok(res) = try_open(&client, &url_a, KEY, &body).await {
            break res;
        }
        assert!(
            killed.elapsed() < RECLAIM,
            "a restarted under its id is still refused {:?} after the kill\n{}",
            killed.elapsed(),
            a.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let on_b = try_open(&client, &url_b, KEY, &body)
        .await
        .unwrap_or_else(|v| panic!("b refused beside one stream on a: {v}"));
    eprintln!("same id: admitted {:?} after the kill", killed.elapsed());
    drop((admitted, on_b));

    // b holds the whole cap and is SIGKILLed for good; a gateway of a new
    // id admits the tenant once b's liveness lapsed.
    let held = open_n(&client, &url_b, KEY, &body, 3).await;
    b.kill9().await;
    let killed = Instant::now();
    drop(held);
    let (c, url_c) = gateway(&stack, "gw-c", &redis).await;
    wait_shared(&url_c).await;
    let returned = loop {
        if try_open(&client, &url_c, KEY, &body).await.is_ok() {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < RECLAIM + Duration::from_secs(1),
            "the tenant is still refused {:?} after b's kill\n{}",
            killed.elapsed(),
            c.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("new id: admitted {returned:?} after the kill");
}

/// An `Idempotency-Key` request's answer: status, `X-Request-Id`, whether
/// it was a replay, and the body.
async fn send_key(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: &Value,
) -> (u16, String, bool, Value) {
    let res = client
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .header("idempotency-key", "order-7")
        .json(body)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
    let replayed = res.headers().get("idempotent-replayed").is_some();
    (status, id, replayed, res.json().await.unwrap())
}

/// Sends the keyed request to `urls` in turn until one answers 200 (429s
/// while the tenant's cap is held or Redis settles); every answer's id
/// goes to `ids`. Returns the answering gateway's index, and its answer.
async fn until_answered(
    client: &reqwest::Client,
    urls: &[&str],
    key: &str,
    body: &Value,
    ids: &mut Vec<String>,
) -> (usize, bool, Value) {
    let deadline = Instant::now() + Duration::from_secs(25);
    for n in 0.. {
        let (status, id, replayed, answer) =
            send_key(client, urls[n % urls.len()], key, body).await;
        ids.push(id);
        match status {
            200 => return (n % urls.len(), replayed, answer),
            429 => assert_eq!(answer["error"]["type"], "concurrency", "{answer}"),
            s => panic!("status {s}: {answer}"),
        }
        assert!(Instant::now() < deadline, "never answered: {ids:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idempotent_request_refused_then_answered_is_billed_once_whatever_redis_forgets() {
    let mut redis = PrivateRedis::start().await.unwrap();
    let stack = TestStack::new("gwidemreset").await;
    const KEY: &str = "sk-test-idemreset-0001";
    let limits = TenantLimits {
        max_concurrency: Some(1),
        ..Default::default()
    };
    seed_tenant(&stack, "idemreset", KEY, limits).await;
    let mut gateways = Vec::new();
    for id in ["gw-a", "gw-b", "gw-c"] {
        gateways.push(gateway(&stack, id, &redis).await);
    }
    let ingest = start_ingest(&stack);
    let urls: Vec<String> = gateways.iter().map(|(_, u)| u.clone()).collect();
    let client = reqwest::Client::new();
    let order = json!({
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": "order 7"}],
        "max_tokens": 5,
    });
    // The tenant's one slot is taken by a long stream.
    let blocker = long_stream(&client, &urls[0], KEY).await;
    let held = open_n(&client, &urls[0], KEY, &blocker, 1).await;

    // Refused on two gateways, then on the third after a FLUSHALL: each
    // refusal carries the id the answer will have, and uses no attempt.
    let mut ids = Vec::new();
    for url in [&urls[0], &urls[1]] {
        let (status, id, _, answer) = send_key(&client, url, KEY, &order).await;
        assert_eq!(status, 429, "{answer}");
        ids.push(id);
    }
    redis.flushall().await.unwrap();
    let (status, id, _, answer) = send_key(&client, &urls[2], KEY, &order).await;
    assert_eq!(status, 429, "{answer}");
    ids.push(id);

    // The slot frees and Redis restarts empty before the answer.
    drop(held);
    restart_empty(&mut redis, &urls).await;
    let round: Vec<&str> = [2, 0, 1].iter().map(|&i| urls[i].as_str()).collect();
    let (answered_at, replayed, answer) =
        until_answered(&client, &round, KEY, &order, &mut ids).await;
    assert!(!replayed);
    let answered = urls.iter().position(|u| u == round[answered_at]).unwrap();
    let first = ids[0].clone();
    assert!(
        ids.iter().all(|id| *id == first),
        "refusals and the answer under one X-Request-Id: {ids:?}"
    );

    // Redis forgets the claim again: a retry on another gateway runs again
    // under the same id; on the answering gateway it is a replay.
    redis.flushall().await.unwrap();
    let others: Vec<&str> = (1..3).map(|k| urls[(answered + k) % 3].as_str()).collect();
    let mut rerun_ids = Vec::new();
    let (_, replayed, _) = until_answered(&client, &others, KEY, &order, &mut rerun_ids).await;
    assert!(!replayed, "another gateway has no answer to replay");
    assert!(
        rerun_ids.iter().all(|id| *id == first),
        "the re-run and its refusals under the answer's id {first}: {rerun_ids:?}"
    );
    let (status, id, replayed, again) = send_key(&client, &urls[answered], KEY, &order).await;
    assert_eq!((status, id.as_str(), replayed), (200, first.as_str(), true));
    assert_eq!(again, answer);

    // Billed: the seed request, the blocker (cancelled) and the order
    // once, under its id.
    let services: Vec<&Service> = gateways.iter().map(|(s, _)| s).chain([&ingest]).collect();
    let rows = wait_for_log(&stack, "idemreset", 3, &services).await;
    assert!(rows.contains_key(&first), "{first} not billed: {rows:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_for_log(&stack, "idemreset", 3, &services).await;
}
