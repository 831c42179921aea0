//! billing-api's pages as a browser uses them (form posts, the session
//! cookie, redirects), against a real billing-api on real Postgres: sign-in
//! and sign-out, totals on the pages equal to the API's, a team lead's 404
//! for another tenant's page and request, CSRF and confirmation on every
//! form, finalize, close-the-month (idempotent, reporting what it did),
//! budgets with their warnings, the printable invoice, and token issue and
//! revocation (which ends the token's sessions). Plain HTTP, no browser.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use chrono::{TimeZone, Utc};
use reqwest::redirect::Policy;
use reqwest::{Client, StatusCode};
use rust_decimal::Decimal;
use serde_json::Value;
use tests::stack::fresh_database;

const FINANCE: &str = "finance-token-for-page-tests-01";

struct Pages {
    url: String,
    client: Client,
}

/// A signed-in browser: its session cookie.
struct Browser {
    cookie: String,
}

impl Pages {
    async fn api(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(FINANCE);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.unwrap();
        let status = res.status();
        let text = res.text().await.unwrap();
        assert_eq!(status, 200, "{path}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    async fn sign_in(&self, token: &str) -> Browser {
        let res = self
            .client
            .post(format!("{}/sign-in", self.url))
            .form(&[("token", token)])
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::SEE_OTHER);
        let set = res.headers()["set-cookie"].to_str().unwrap().to_owned();
        for attr in ["HttpOnly", "SameSite=Strict", "Max-Age="] {
            assert!(set.contains(attr), "{set}");
        }
        Browser {
            cookie: set.split(';').next().unwrap().to_owned(),
        }
    }

    async fn get(&self, b: &Browser, path: &str) -> (StatusCode, String) {
        let res = self
            .client
            .get(format!("{}{path}", self.url))
            .header("cookie", &b.cookie)
            .send()
            .await
            .unwrap();
        (res.status(), res.text().await.unwrap())
    }

    async fn post(&self, b: &Browser, path: &str, form: &[(&str, &str)]) -> (StatusCode, String) {
        let res = self
            .client
            .post(format!("{}{path}", self.url))
            .header("cookie", &b.cookie)
            .form(form)
            .send()
            .await
            .unwrap();
        (res.status(), res.text().await.unwrap())
    }
}

/// The CSRF token in a page's forms.
fn csrf(html: &str) -> String {
    let at = html
        .find(r#"name="csrf" value=""#)
        .expect("a form with csrf")
        + 19;
    html[at..].split('"').next().unwrap().to_owned()
}

/// The amount shown in the element with this id (`$1,234.56` → 1234.56).
fn shown(html: &str, id: &str) -> Decimal {
    let at = html
        .find(&format!(r#"id="{id}""#))
        .unwrap_or_else(|| panic!("no #{id}"));
    let text = html[at..]
        .split('>')
        .nth(1)
        .unwrap()
        .split('<')
        .next()
        .unwrap();
    text.replace(['$', ','], "")
        .parse()
        .unwrap_or_else(|_| panic!("#{id}: {text}"))
}

fn dec(v: &Value) -> Decimal {
    v.as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn pages_for_every_role_agree_with_the_api() {
    let db = fresh_database("billing_pages").await;
    let tenants_file = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/tenants.yaml");
    let api = tests::billing::start_billing_api_with(
        &db.url,
        FINANCE,
        &[("BILLING_TENANTS_FILE", tenants_file.to_owned())],
    )
    .await;
    let p = Pages {
        url: api.url.clone(),
        client: Client::builder().redirect(Policy::none()).build().unwrap(),
    };
    // October 2026 usage for every reference tenant, peak and off-peak.
    let tenants = [
        "acme-corp",
        "codegen-platform",
        "finserv-team",
        "medai-labs",
        "research-squad",
    ];
    for (i, t) in tenants.iter().enumerate() {
        for (day, hour) in [(5, 15), (5, 3), (12, 14), (20, 23)] {
            sqlx::query(
                "INSERT INTO usage_hourly (tenant_id, model, priority, hour, requests, prompt_tokens,
                     cached_tokens, completion_tokens, gpu_seconds)
                 VALUES ($1, $2, 3, $3, 120, 1500000, 200000, 400000, $4)",
            )
            .bind(t)
            .bind(if hour % 2 == 0 { "llama-3.1-70b" } else { "llama-3.1-8b" })
            .bind(Utc.with_ymd_and_hms(2026, 10, day, hour, 0, 0).unwrap())
            .bind(Decimal::from(3600 * (i as i64 + 1)))
            .execute(&db.pool)
            .await
            .unwrap();
        }
    }
    // A request of medai-labs, for lookups.
    let id = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(
        uuid::NoContext,
        1_791_000_000,
        0,
    ));
    sqlx::query(
        "SELECT ensure_request_log_partition((to_timestamp(1791000000) AT TIME ZONE 'UTC')::date)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO request_log (request_id, tenant_id, api_key_id, model, model_version, priority,
             started_at, finished_at, prompt_tokens, cached_tokens, completion_tokens, gpu_seconds,
             preempted_gpu_seconds, finish_reason, replica_id, gateway_id, stream, content_hash,
             kafka_partition, kafka_offset)
         VALUES ($1, 'medai-labs', 'key_medai_demo', 'llama-3.1-70b', 'v', 4, to_timestamp(1791000000),
             to_timestamp(1791000001), 10, 0, 5, 1.5, 0, 'stop', 'r', 'g', false, '\\x00', 0, 0)",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();

    // Tokens through the API (finance), one per role.
    let issue = |role: &'static str, tenant: Option<&'static str>| {
        let p = &p;
        async move {
            p.api(
                reqwest::Method::POST,
                "/v1/tokens",
                Some(serde_json::json!({"role": role, "tenant_id": tenant, "label": "page test"})),
            )
            .await
        }
    };
    let lead = issue("team_lead", Some("acme-corp")).await;
    let support = issue("support", None).await;
    let lead_token = lead["token"].as_str().unwrap();

    // Not signed in: every page sends the browser to the sign-in page.
    let anon = Browser {
        cookie: "meterline_session=nope".into(),
    };
    let (status, _) = p.get(&anon, "/pages/invoices").await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let res = p
        .client
        .post(format!("{}/sign-in", p.url))
        .form(&[("token", "not-a-token-at-all-0000")])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);

    // The team lead's shadow bill equals the API's.
    let lb = p.sign_in(lead_token).await;
    let (status, page) = p
        .get(
            &lb,
            "/pages/tenants/acme-corp/shadow-bill?period=2026-10&shift=40",
        )
        .await;
    assert_eq!(status, 200, "{page}");
    let bill = p
        .api(
            reqwest::Method::GET,
            "/v1/tenants/acme-corp/shadow-bill?period=2026-10&shift=0.4",
            None,
        )
        .await;
    assert_eq!(
        shown(&page, "month-to-date"),
        dec(&bill["month_to_date"]["total"])
    );
    assert_eq!(shown(&page, "peak"), dec(&bill["peak"]["amount"]));
    assert_eq!(shown(&page, "off-peak"), dec(&bill["off_peak"]["amount"]));
    assert_eq!(shown(&page, "shift-saving"), dec(&bill["shift"]["saving"]));
    assert!(!dec(&bill["shift"]["saving"]).is_zero());
    assert!(
        page.contains("America/New_York") && page.contains("<svg"),
        "zones named, charts drawn"
    );
    assert!(page.contains(r#"class="offpeak""#), "off-peak hours shaded");
    // No per-key rows for October (this data did not come through ingest):
    // the page says there is no per-key split.
    assert!(
        page.contains("no-key-split"),
        "the page says there is no per-key split"
    );
    // ... and a bad shift is a 400 naming it.
    let (status, body) = p
        .get(&lb, "/pages/tenants/acme-corp/shadow-bill?shift=140")
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("shift"), "{body}");
    // Another tenant's page and request do not exist for this team lead.
    let (status, _) = p.get(&lb, "/pages/tenants/medai-labs/shadow-bill").await;
    assert_eq!(status, 404);
    let (status, _) = p
        .get(&lb, &format!("/pages/lookup?request_id=req_{id}"))
        .await;
    assert_eq!(status, 404);
    let (status, _) = p.get(&lb, "/pages/invoices").await;
    assert_eq!(status, 403);

    // Support finds the request and its invoice.
    let sb = p.sign_in(support["token"].as_str().unwrap()).await;
    let (status, page) = p
        .get(&sb, &format!("/pages/lookup?request_id=req_{id}"))
        .await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("medai-labs") && page.contains("2026-10"),
        "{page}"
    );
    let (status, _) = p.get(&sb, "/pages/tenants/medai-labs/shadow-bill").await;
    assert_eq!(status, 403, "support sees no money");

    // Finance: the invoice list's totals equal the API's.
    let fb = p.sign_in(FINANCE).await;
    let (status, page) = p.get(&fb, "/pages/invoices?period=2026-10").await;
    assert_eq!(status, 200, "{page}");
    let listed = p
        .api(reqwest::Method::GET, "/v1/invoices?period=2026-10", None)
        .await;
    let api_total: Decimal = listed["invoices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| dec(&i["total"]))
        .sum();
    assert_eq!(shown(&page, "grand-total"), api_total);
    let token = csrf(&page);

    // A budget set from the page warns on the page and in the API.
    // A budget covers usage and reserved capacity, not the overhead share.
    let mtd = &bill["month_to_date"];
    let spent = dec(&mtd["subtotal"]) + mtd.get("reserved").map(dec).unwrap_or_default();
    let budget = (spent * Decimal::new(11, 1)).round_dp(2); // ~91% used
    let (status, _) = p
        .post(
            &fb,
            "/pages/tenants/acme-corp/budget",
            &[
                ("csrf", &token),
                ("period", "2026-10"),
                ("amount", &budget.to_string()),
            ],
        )
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let bill = p
        .api(
            reqwest::Method::GET,
            "/v1/tenants/acme-corp/shadow-bill?period=2026-10",
            None,
        )
        .await;
    assert_eq!(bill["budget"]["level"], "warning", "{bill}");
    let (_, page) = p
        .get(&lb, "/pages/tenants/acme-corp/shadow-bill?period=2026-10")
        .await;
    assert!(page.contains("Budget warning"), "{page}");

    // Finalize from the page: CSRF and the confirmation are required.
    let path = "/pages/tenants/acme-corp/invoices/2026-10/finalize";
    let (status, _) = p
        .post(&fb, path, &[("csrf", "forged"), ("confirm", "on")])
        .await;
    assert_eq!(status, 403, "a forged CSRF token");
    let (status, body) = p.post(&fb, path, &[("csrf", &token)]).await;
    assert_eq!(status, 400, "unconfirmed: {body}");
    let (status, _) = p
        .post(&fb, path, &[("csrf", &token), ("confirm", "on")])
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let inv = p
        .api(
            reqwest::Method::GET,
            "/v1/tenants/acme-corp/invoices/2026-10",
            None,
        )
        .await;
    assert_eq!(inv["status"], "finalized");
    // The payable invoice prints.
    let (status, page) = p
        .get(&fb, "/pages/tenants/acme-corp/invoices/2026-10/print")
        .await;
    assert_eq!(status, 200);
    assert_eq!(shown(&page, "invoice-total"), dec(&inv["total"]));
    assert!(page.contains("@media print"));

    // Close the month: finalizes the other four, then nothing, and says so.
    let close = "/pages/periods/2026-10/close";
    let (status, page) = p
        .post(&fb, close, &[("csrf", &token), ("confirm", "on")])
        .await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("Finalized 4 invoice(s); 1 were already finalized."),
        "{page}"
    );
    let (_, page) = p
        .post(&fb, close, &[("csrf", &token), ("confirm", "on")])
        .await;
    assert!(
        page.contains("Finalized 0 invoice(s); 5 were already finalized."),
        "{page}"
    );

    // Closed, October's budget is history: the page refuses to change it.
    let (status, page) = p
        .post(
            &fb,
            "/pages/tenants/acme-corp/budget",
            &[("csrf", &token), ("period", "2026-10"), ("amount", "1.00")],
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{page}");
    assert!(page.contains("finalized"), "{page}");

    // Tokens: issued from the page (shown once), revoked from the page; the
    // revoked token's session ends at once.
    let (status, page) = p
        .post(
            &fb,
            "/pages/tokens",
            &[
                ("csrf", &token),
                ("role", "support"),
                ("tenant_id", ""),
                ("label", "from page"),
            ],
        )
        .await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("new-token"));
    let revoke = format!(
        "/pages/tokens/{}/revoke",
        lead["token_id"].as_str().unwrap()
    );
    let (status, _) = p
        .post(&fb, &revoke, &[("csrf", &token), ("confirm", "on")])
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (status, _) = p.get(&lb, "/pages/tenants/acme-corp/shadow-bill").await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "the revoked token's session ended"
    );
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM audit_log WHERE action IN ('issue_token', 'revoke_token')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(n, 4, "every issue and revoke audited");

    // Sign-out ends the session.
    let (_, page) = p.get(&sb, "/pages/lookup").await;
    let (status, _) = p.post(&sb, "/sign-out", &[("csrf", &csrf(&page))]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (status, _) = p.get(&sb, "/pages/lookup").await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    drop(api);
}
