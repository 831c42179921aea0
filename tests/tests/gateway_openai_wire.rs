#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! The OpenAI request shapes through the gateway as a real process: content
//! parts, tool calls and tool messages accepted on a simulated model, image
//! parts counted at their fixed token cost, and everything the simulator
//! cannot do refused with a 400 in OpenAI's shape naming the parameter.

use serde_json::{json, Value};
use tests::gateway::{seed_tenant, start_gateway};
use tests::TestStack;

const KEY: &str = "sk-test-openai-wire-0001";
const MODEL: &str = "llama-3.1-8b";
/// `openai_wire::IMAGE_PART_TOKENS`.
const IMAGE_PART_TOKENS: i64 = 85;

async fn post(url: &str, body: &Value) -> (u16, Value) {
    let res = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap())
}

fn request(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_parameters_are_400_naming_them_and_content_parts_are_counted() {
    let stack = TestStack::new("gwwire").await;
    seed_tenant(&stack, "wire", KEY, Default::default()).await;
    let (_gateway, url) = start_gateway(&stack, 0).await;

    // Each parameter the simulator cannot honour: 400, its name in `param`.
    let refused = [
        ("n", json!({"n": 2})),
        ("logprobs", json!({"logprobs": true})),
        ("tool_choice", json!({"tool_choice": "required"})),
        (
            "tool_choice",
            json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        ),
        (
            "response_format",
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}}),
        ),
        ("modalities", json!({"modalities": ["text", "audio"]})),
        (
            "audio",
            json!({"audio": {"voice": "alloy", "format": "wav"}}),
        ),
    ];
    for (param, extra) in refused {
        let (status, body) = post(&url, &request(extra.clone())).await;
        assert_eq!(status, 400, "{extra}: {body}");
        assert_eq!(body["error"]["param"], param, "{extra}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        assert!(body["error"]["message"].is_string(), "{body}");
    }

    // What the simulator can honour is accepted, not refused.
    let accepted = json!({
        "n": 1, "logprobs": false, "tool_choice": "auto", "temperature": 0.3, "top_p": 0.8,
        "stop": ["\n"], "user": "u-1", "seed": 7, "response_format": {"type": "json_object"},
        "modalities": ["text"],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    });
    let (status, body) = post(&url, &request(accepted)).await;
    assert_eq!(status, 200, "{body}");

    // A tool-call conversation: null content beside tool_calls, a tool message.
    let tools = json!({"messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "14 C"}
    ]});
    let (status, body) = post(&url, &request(tools)).await;
    assert_eq!(status, 200, "{body}");
    let no_id = json!({"messages": [{"role": "tool", "content": "14 C"}]});
    let (status, body) = post(&url, &request(no_id)).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "messages", "{body}");

    // Content parts: a text part counts like string content, an image at
    // its fixed cost (plus the newline that joins the parts).
    let prompt_tokens = |body: &Value| body["usage"]["prompt_tokens"].as_i64().unwrap();
    let (_, plain) = post(&url, &request(json!({}))).await;
    let text_part = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}]});
    let (status, as_part) = post(&url, &request(text_part)).await;
    assert_eq!(status, 200, "{as_part}");
    assert_eq!(prompt_tokens(&as_part), prompt_tokens(&plain));
    let with_image = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hello there"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}}
    ]}]});
    let (status, imaged) = post(&url, &request(with_image)).await;
    assert_eq!(status, 200, "{imaged}");
    assert_eq!(
        prompt_tokens(&imaged),
        prompt_tokens(&plain) + IMAGE_PART_TOKENS + 1,
        "{imaged}"
    );
}

/// What OpenAI refuses with 400 is refused here too, in its shape and
/// naming the parameter, and never billed: an output cap of 0 (it would
/// bill a prompt for an empty answer), `stream_options` without a stream,
/// and a second `Authorization` or `Idempotency-Key` header (a proxy that
/// appends one must not decide who pays or which answer is replayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_parameters_and_repeated_headers_are_400_and_never_billed() {
    const OTHER_KEY: &str = "sk-test-openai-wire-0002";
    let stack = TestStack::new("gwrefuse").await;
    seed_tenant(&stack, "wire", KEY, Default::default()).await;
    seed_tenant(&stack, "other", OTHER_KEY, Default::default()).await;
    let (gateway, url) = start_gateway(&stack, 0).await;
    let ingest = tests::gateway::start_ingest(&stack);

    let refused = [
        ("max_tokens", json!({"max_tokens": 0})),
        ("max_completion_tokens", json!({"max_completion_tokens": 0})),
        (
            "stream_options",
            json!({"stream_options": {"include_usage": true}}),
        ),
        (
            "stream_options",
            json!({"stream": false, "stream_options": {"include_usage": true}}),
        ),
    ];
    for (param, extra) in refused {
        let (status, body) = post(&url, &request(extra.clone())).await;
        assert_eq!(status, 400, "{extra}: {body}");
        assert_eq!(body["error"]["param"], param, "{extra}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    }

    let client = reqwest::Client::new();
    let repeated: [(&str, [(&str, String); 2]); 3] = [
        (
            "Authorization",
            [
                ("authorization", format!("Bearer {KEY}")),
                ("authorization", format!("Bearer {OTHER_KEY}")),
            ],
        ),
        (
            "Authorization",
            [
                ("authorization", format!("Bearer {OTHER_KEY}")),
                ("authorization", "Basic dXNlcjpwYXNz".to_owned()),
            ],
        ),
        (
            "Idempotency-Key",
            [
                ("idempotency-key", "retry-a".to_owned()),
                ("idempotency-key", "retry-b".to_owned()),
            ],
        ),
    ];
    for (param, headers) in repeated {
        let mut req = client
            .post(format!("{url}/v1/chat/completions"))
            .json(&request(json!({})));
        if param != "Authorization" {
            req = req.bearer_auth(KEY);
        }
        for (name, value) in &headers {
            req = req.header(*name, value);
        }
        let res = req.send().await.unwrap();
        let status = res.status().as_u16();
        let body: Value = res.json().await.unwrap();
        assert_eq!(status, 400, "{headers:?}: {body}");
        assert_eq!(body["error"]["param"], param, "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    }
    // Models too: two keys are no key.
    let res = client
        .get(format!("{url}/v1/models"))
        .header("authorization", format!("Bearer {KEY}"))
        .header("authorization", format!("Bearer {OTHER_KEY}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 400);

    // One request that is answered: the only one billed, to its own tenant.
    let res = client
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&request(json!({"max_tokens": 1})))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let answered = res.headers()["x-request-id"].to_str().unwrap().to_owned();
    let billed = tests::gateway::wait_for_log(&stack, "wire", 1, &[&gateway, &ingest]).await;
    assert!(
        billed.contains_key(&answered),
        "{answered} not in {billed:?}"
    );
    let other: i64 =
        sqlx::query_scalar("SELECT count(*) FROM request_log WHERE tenant_id = 'other'")
            .fetch_one(&stack.pool)
            .await
            .unwrap();
    assert_eq!(other, 0, "a refused request was billed to the other tenant");
}
