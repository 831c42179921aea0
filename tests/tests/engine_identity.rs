#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! Tenant isolation at the upstream: the real `engine` binary answers a
//! chat completion only with an `x-meterline-identity` signed by the secret
//! it was started with. An unsigned request (a plain `x-tenant-id` too), one
//! signed with another secret and an expired token are 401
//! `invalid_identity` (so is a read of its replicas' GPU time); the
//! gateway, given the same secret through its upstreams file, gets through;
//! without a valid `ENGINE_IDENTITY_SECRET` the binary does not start.

use std::collections::HashMap;
use std::time::Duration;

use engine::identity::SKEW_SECS;
use engine::ServiceClass;
use serde_json::{json, Value};
use tests::engine::{now, random_secret, signer, start_engine, HEADER, SECRET_ENV};
use tests::gateway::{seed_tenant, start_gateway_with};
use tests::process::free_port;
use tests::{Service, TestStack};

const KEY: &str = "sk-test-identity-0001";
const MODEL: &str = "llama-3.1-8b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_serves_only_identities_signed_with_its_secret() {
    let stack = TestStack::new("engine_identity").await;
    seed_tenant(&stack, "signed-corp", KEY, Default::default()).await;
    let secret = random_secret();
    let (engine, engine_url) = start_engine(stack.dir.path(), 0, &secret).await;
    let client = reqwest::Client::new();
    let body =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});

    let expired = signer(&secret).sign_until(
        "signed-corp",
        ServiceClass::Standard,
        now() - SKEW_SECS - 60,
    );
    let wrong = signer(&random_secret()).sign("signed-corp", ServiceClass::Standard, now());
    let cases = [
        ("unsigned", None, "x-meterline-identity is missing"),
        (
            "another secret",
            Some(wrong),
            "x-meterline-identity has a bad signature",
        ),
        ("expired", Some(expired), "x-meterline-identity has expired"),
    ];
    for (what, identity, message) in cases {
        let mut req = client
            .post(format!("{engine_url}/v1/chat/completions"))
            .header("x-tenant-id", "signed-corp")
            .json(&body);
        if let Some(identity) = identity {
            req = req.header(HEADER, identity);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), 401, "{what}");
        let err: Value = res.json().await.unwrap();
        assert_eq!(err["error"]["code"], "invalid_identity", "{what}: {err}");
        assert_eq!(
            err["error"]["type"], "invalid_request_error",
            "{what}: {err}"
        );
        assert_eq!(err["error"]["message"], message, "{what}: {err}");
    }
    // Its replicas' GPU time (what idle capacity is billed from) is
    // signed too; with the identity, it is every replica's counters.
    let gpu_time = format!("{engine_url}{}", engine::GPU_TIME_PATH);
    let res = client.get(&gpu_time).send().await.unwrap();
    assert_eq!(res.status(), 401);
    let err: Value = res.json().await.unwrap();
    assert_eq!(err["error"]["code"], "invalid_identity", "{err}");
    let signed_get = |url: String| {
        client.get(url).header(
            HEADER,
            signer(&secret).sign("reporter", ServiceClass::Standard, now()),
        )
    };
    let res = signed_get(gpu_time.clone()).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let readings: engine::GpuTimeReadings = res.json().await.unwrap();
    // It takes no parameters; one is refused, not ignored.
    let res = signed_get(format!("{gpu_time}?model={MODEL}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let err: Value = res.json().await.unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("?model="),
        "{err}"
    );
    assert!(
        readings.replicas.iter().any(|r| r.model == MODEL),
        "{readings:?}"
    );
    // The read-only endpoints need no identity.
    for path in ["/v1/models", "/metrics", "/health"] {
        let res = client
            .get(format!("{engine_url}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{path}");
    }

    // Through the gateway, which signs with the same secret: served, and
    // billed on the engine to the tenant the gateway authenticated.
    let upstreams = stack.dir.path().join("upstreams.yaml");
    std::fs::write(
        &upstreams,
        format!(
            "upstreams:\n  - model: {MODEL}\n    url: {engine_url}\n    gpus: 1\n    max_context: 131072\n    kv_poll_ms: 0\n    identity_secret_env: {SECRET_ENV}\n    cache_salt: true\n"
        ),
    )
    .unwrap();
    let (gateway, url) = start_gateway_with(
        &stack,
        0,
        &[
            ("GATEWAY_UPSTREAMS", upstreams.display().to_string()),
            (SECRET_ENV, secret.clone()),
        ],
    )
    .await;
    let res = client
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        200,
        "{}\ngateway:\n{}\nengine:\n{}",
        res.text().await.unwrap_or_default(),
        gateway.log_tail(),
        engine.log_tail()
    );
    let answer: Value = res.json().await.unwrap();
    assert_eq!(answer["usage"]["completion_tokens"], 4, "{answer}");
    let metrics = tests::gateway::metrics(&engine_url).await;
    assert!(
        metrics.contains("tenant=\"signed-corp\""),
        "the engine billed the signed tenant:\n{metrics}"
    );
}

#[tokio::test]
async fn the_engine_without_a_valid_identity_secret_exits_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    for secret in [None, Some("too-short")] {
        let mut env = HashMap::from([(
            "ENGINE_ADDR".to_owned(),
            format!("127.0.0.1:{}", free_port()),
        )]);
        if let Some(secret) = secret {
            env.insert(SECRET_ENV.to_owned(), secret.to_owned());
        }
        let mut svc = Service::start("engine", "engine", &[], env, dir.path())
            .unwrap_or_else(|e| panic!("{e}"));
        let status = svc
            .wait_exit(Duration::from_secs(30))
            .await
            .expect("the engine exits by itself");
        assert!(!status.success(), "{secret:?}: exited {status}");
        let log = svc.log_text();
        assert!(log.contains("ENGINE_IDENTITY_SECRET"), "{secret:?}:\n{log}");
    }
}
