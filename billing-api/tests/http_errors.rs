//! billing-api's HTTP edge in process, on a real socket, against a fresh
//! database per test: every error in `{"error": {"code", "message"}}`
//! (unknown paths, wrong methods, malformed JSON, queries and paths, wrong
//! content types), a NUL in a path, query, JSON or price-book field refused
//! with 400 naming it, the `Bearer` scheme matched case-insensitively, and
//! a request with two `Authorization` headers refused (400) rather than
//! judged by either.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use billing_api::auth::hash_token;
use billing_api::rating::PriceBook;
use billing_api::store;
use billing_api::{app, AppState};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use sqlx::PgPool;

const FINANCE: &str = "finance-token-http-errors-0001";
const SUPPORT: &str = "support-token-http-errors-0001";
const METRICS: &str = "metrics-token-http-errors-0001";

struct Api {
    url: String,
    client: reqwest::Client,
}

async fn start(pool: PgPool) -> Api {
    sqlx::query(
        "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode, shadow, time_zone)
         VALUES ('acme-corp', 'Acme', 'standard', 3, 'per_token', false, 'UTC')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    for (id, token, role) in [
        ("finance", FINANCE, "finance"),
        ("support", SUPPORT, "support"),
    ] {
        store::access::insert_token(&mut conn, id, &hash_token(token), role, None, "", None)
            .await
            .unwrap();
    }
    let book = PriceBook::from_yaml(include_str!("../../config/price-book.yaml")).unwrap();
    store::price_books::put(&mut conn, &book).await.unwrap();
    drop(conn);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = AppState {
        metrics_token_hash: Some(hash_token(METRICS)),
        ..AppState::new(pool)
    };
    // Served as the binary serves it: through the shared serving layer.
    tokio::spawn(serving::serve(
        listener,
        app(state),
        serving::HttpSettings::default(),
        std::future::pending(),
    ));
    Api {
        url: format!("http://{addr}"),
        client: reqwest::Client::new(),
    }
}

impl Api {
    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(FINANCE)
    }
}

/// Asserts the API's error shape and status; returns (code, message).
async fn api_error(res: reqwest::Response, status: StatusCode) -> (String, String) {
    assert_eq!(res.status(), status, "{}", res.url());
    assert_eq!(res.headers()["content-type"], "application/json");
    let body: Value = res.json().await.unwrap();
    let (code, message) = (&body["error"]["code"], &body["error"]["message"]);
    assert!(code.is_string() && message.is_string(), "{body}");
    (
        code.as_str().unwrap().to_owned(),
        message.as_str().unwrap().to_owned(),
    )
}

#[sqlx::test(migrator = "schema::MIGRATOR")]
async fn a_nul_in_a_path_or_query_parameter_is_a_400_naming_it(pool: PgPool) {
    let api = start(pool).await;
    for (method, path, param) in [
        (
            Method::GET,
            "/v1/tenants/acme%00/usage?from=2026-11-01T00:00:00Z&to=2026-12-01T00:00:00Z",
            "tenant",
        ),
        (
            Method::GET,
            "/v1/tenants/acme-corp/usage?from=2026-11-01T00:00:00Z%00&to=2026-12-01T00:00:00Z",
            "from",
        ),
        (Method::GET, "/v1/tenants/%00/invoices/2026-11", "tenant"),
        (
            Method::POST,
            "/v1/tenants/acme%00corp/invoices/2026-11/finalize",
            "tenant",
        ),
        (
            Method::POST,
            "/v1/tenants/acme-corp/invoices/2026-11%00/void",
            "period",
        ),
        (
            Method::GET,
            "/v1/tenants/acme-corp/shadow-bill?period=2026-11&shift=0.1%00",
            "shift",
        ),
        (
            Method::GET,
            "/v1/invoices?period=2026-11&cursor=%00",
            "cursor",
        ),
        (
            Method::GET,
            "/v1/exports/focus?period=2026-11&format=csv%00",
            "format",
        ),
        (Method::GET, "/v1/requests/req_%00", "request_id"),
        (Method::POST, "/v1/price-books?x%00=1", "x\0"),
    ] {
        let res = api.request(method.clone(), path).send().await.unwrap();
        let (code, message) = api_error(res, StatusCode::BAD_REQUEST).await;
        assert_eq!(code, "bad_request", "{method} {path}");
        assert!(
            message.contains(&format!("`{param}`")) && message.contains("NUL"),
            "{method} {path}: {message}"
        );
    }
}

#[sqlx::test(migrator = "schema::MIGRATOR")]
async fn a_nul_in_a_json_or_price_book_field_is_a_400_naming_it(pool: PgPool) {
    let api = start(pool).await;
    let res = api
        .request(Method::POST, "/v1/tenants/acme-corp/invoices/2026-11/void")
        .header("content-type", "application/json")
        .body(r#"{"reason": "wrong\u0000rate"}"#)
        .send()
        .await
        .unwrap();
    let (_, message) = api_error(res, StatusCode::BAD_REQUEST).await;
    assert!(
        message.contains("reason") && message.contains("NUL"),
        "{message}"
    );
    let book = include_str!("../../config/price-book.yaml")
        .replace("version: ref-2026-11", "version: \"ref\\0\"");
    let res = api
        .request(Method::POST, "/v1/price-books")
        .body(book)
        .send()
        .await
        .unwrap();
    let (_, message) = api_error(res, StatusCode::BAD_REQUEST).await;
    assert!(
        message.contains("version") && message.contains("NUL"),
        "{message}"
    );
}

#[sqlx::test(migrator = "schema::MIGRATOR")]
async fn malformed_json_queries_and_paths_answer_in_the_error_shape(pool: PgPool) {
    let api = start(pool).await;
    let void = "/v1/tenants/acme-corp/invoices/2026-11/void";
    for body in [r#"{"reason": "#, r#"{"reason": 5}"#, r#"{}"#] {
        let res = api
            .request(Method::POST, void)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(
            api_error(res, StatusCode::BAD_REQUEST).await.0,
            "bad_request",
            "{body}"
        );
    }
    let res = api
        .request(Method::POST, void)
        .header("content-type", "text/plain")
        .body(r#"{"reason": "x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        api_error(res, StatusCode::UNSUPPORTED_MEDIA_TYPE).await.0,
        "unsupported_media_type"
    );
    let res = api
        .request(Method::POST, void)
        .header("content-type", "application/json")
        .body(format!(r#"{{"reason": "{}"}}"#, "a".repeat(3 << 20)))
        .send()
        .await
        .unwrap();
    assert_eq!(
        api_error(res, StatusCode::PAYLOAD_TOO_LARGE).await.0,
        "payload_too_large"
    );
    for path in [
        "/v1/invoices",
        "/v1/invoices?period=2026-11&limit=many",
        "/v1/invoices?period=2026-11&format=xml",
        "/v1/invoices?period=2026-11&cursor=Not-A-Tenant",
        "/v1/tenants/ACME/invoices/2026-11",
        "/v1/tenants/acme-corp/invoices/2026-13",
        "/v1/tenants/acme-corp/shadow-bill?shift=2",
        "/v1/requests/req_6ba7b810-9dad-41d1-80b4-00c04fd430c8",
    ] {
        let res = api.request(Method::GET, path).send().await.unwrap();
        assert_eq!(
            api_error(res, StatusCode::BAD_REQUEST).await.0,
            "bad_request",
            "{path}"
        );
    }
}

#[sqlx::test(migrator = "schema::MIGRATOR")]
async fn unknown_paths_are_404_and_wrong_methods_405_in_the_error_shape(pool: PgPool) {
    let api = start(pool).await;
    for path in ["/nothing", "/v1/tenants", "/v1/tenants/acme-corp/invoices"] {
        let res = api.request(Method::GET, path).send().await.unwrap();
        assert_eq!(
            api_error(res, StatusCode::NOT_FOUND).await.0,
            "not_found",
            "{path}"
        );
    }
    for (method, path, allow) in [
        (Method::DELETE, "/v1/invoices", "GET,HEAD"),
        (Method::GET, "/v1/price-books", "POST"),
        (
            Method::PUT,
            "/v1/tenants/acme-corp/invoices/2026-11/finalize",
            "POST",
        ),
    ] {
        let res = api.request(method.clone(), path).send().await.unwrap();
        assert_eq!(res.headers()["allow"], allow, "{method} {path}");
        assert_eq!(
            api_error(res, StatusCode::METHOD_NOT_ALLOWED).await.0,
            "method_not_allowed"
        );
    }
}

#[sqlx::test(migrator = "schema::MIGRATOR")]
async fn the_bearer_scheme_is_case_insensitive(pool: PgPool) {
    let api = start(pool).await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let res = api
            .client
            .get(format!("{}/v1/invoices?period=2026-11", api.url))
            .header("authorization", format!("{scheme} {FINANCE}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{scheme}");
    }
    let res = api
        .client
        .get(format!("{}/v1/invoices?period=2026-11", api.url))
        .header("authorization", format!("Basic {FINANCE}"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        api_error(res, StatusCode::UNAUTHORIZED).await.0,
        "unauthenticated"
    );
}

#[sqlx::test(migrator = "schema::MIGRATOR")]
async fn two_authorization_headers_are_refused_naming_the_header(pool: PgPool) {
    let api = start(pool).await;
    let bearer = |t: &str| format!("Bearer {t}");
    let basic = "Basic ZmluYW5jZTpzZWNyZXQ=".to_owned();
    // GET /v1/tokens is finance's alone: alone, finance gets 200 and
    // support 403; together, in either order, neither counts.
    for (path, alone, pairs) in [
        (
            "/v1/tokens",
            bearer(FINANCE),
            vec![
                [bearer(FINANCE), bearer(SUPPORT)],
                [bearer(SUPPORT), bearer(FINANCE)],
                [bearer(FINANCE), basic.clone()],
                [basic.clone(), bearer(FINANCE)],
            ],
        ),
        (
            "/metrics",
            bearer(METRICS),
            vec![
                [bearer(METRICS), bearer(FINANCE)],
                [bearer(FINANCE), bearer(METRICS)],
                [bearer(METRICS), basic.clone()],
            ],
        ),
    ] {
        let url = format!("{}{path}", api.url);
        let res = api
            .client
            .get(&url)
            .header("authorization", &alone)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path} with one header");
        for [first, second] in pairs {
            let res = api
                .client
                .get(&url)
                .header("authorization", &first)
                .header("authorization", &second)
                .send()
                .await
                .unwrap();
            let (code, message) = api_error(res, StatusCode::BAD_REQUEST).await;
            assert_eq!(code, "bad_request", "{path}: {first} + {second}");
            assert!(
                message.contains("Authorization"),
                "{path}: {first} + {second}: {message}"
            );
        }
    }
}

/// Requests the OpenAPI document calls valid that the database would have
/// refused with a 500: a budget past what its column holds, a second price
/// book taking effect on a day another version already does. And a token
/// for a tenant that does not exist is 404 naming the field.
#[sqlx::test(migrator = "schema::MIGRATOR")]
async fn valid_requests_the_database_would_refuse_get_4xx_naming_why(pool: PgPool) {
    let api = start(pool).await;
    let res = api
        .request(Method::PUT, "/v1/tenants/acme-corp/budgets/2026-11")
        .json(&serde_json::json!({"amount": "1000000000000"}))
        .send()
        .await
        .unwrap();
    let (code, message) = api_error(res, StatusCode::BAD_REQUEST).await;
    assert_eq!(code, "bad_request");
    assert!(message.contains("999999999999.99"), "{message}");

    let reference = include_str!("../../config/price-book.yaml");
    let other = reference.replacen("version: ref-2026-11", "version: other", 1);
    let res = api
        .request(Method::POST, "/v1/price-books")
        .header("content-type", "application/yaml")
        .body(other)
        .send()
        .await
        .unwrap();
    let (code, message) = api_error(res, StatusCode::CONFLICT).await;
    assert_eq!(code, "conflict");
    assert!(message.contains("2026-01-01"), "{message}");
    // The same version again replaces it, as before.
    let res = api
        .request(Method::POST, "/v1/price-books")
        .header("content-type", "application/yaml")
        .body(reference)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    let res = api
        .request(Method::POST, "/v1/tokens")
        .json(&serde_json::json!({"role": "team_lead", "tenant_id": "no-such-team"}))
        .send()
        .await
        .unwrap();
    let (code, message) = api_error(res, StatusCode::NOT_FOUND).await;
    assert_eq!(code, "not_found");
    assert!(
        message.contains("tenant_id") && message.contains("no-such-team"),
        "{message}"
    );
}
