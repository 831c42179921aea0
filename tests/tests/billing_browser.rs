//! billing-api's pages in a real browser (headless Chromium over
//! WebDriver, `tests::browser`), on usage that came through the real
//! pipeline: an ended month of the reference tenants' traffic produced to
//! the topic as gateways would, live requests through gateway-lite, both
//! ingested exactly once into Postgres, and billing-api on top. Every role
//! signs in through the sign-in form; the figures the pages show are read
//! off the rendered page as exact decimals and compared with the JSON
//! API's; a team lead gets a 404 for another tenant; finalizing, closing
//! the month, setting a budget and revoking a token are done by clicking,
//! confirmation included; the payable invoice is printed to PDF by the
//! browser and its text read back. Screenshots (and the PDF) are kept in
//! `target/screenshots/<test>/`.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::time::Duration;

use chrono::{TimeZone, Utc};
use reqwest::StatusCode;
use rust_decimal::Decimal;
use serde_json::{json, Value};
use tests::billing::{start_billing_api_with, BillingApi};
use tests::browser::{Browser, Chromedriver};
use tests::gateway::{start_gateway, start_ingest};
use tests::{Service, TestStack};

const FINANCE: &str = "finance-token-for-browser-tests-01";
/// The ended month the backfill fills (every tenant's zone has left it).
const MONTH: &str = "2026-10";
const BACKFILL_EVENTS: u64 = 3_000;
/// Live requests through the gateway: (tenant, API key), each sent twice.
const LIVE: [(&str, &str); 2] = [
    ("acme-corp", "sk-demo-acme-corp-0001"),
    ("medai-labs", "sk-demo-medai-labs-0001"),
];
const TENANTS: usize = 5;

/// The whole stack, a chromedriver, and a token per role. Dropped in
/// field order: the browser's driver and the services before their
/// database and topic.
struct Site {
    driver: Chromedriver,
    api: BillingApi,
    _gateway: Service,
    _ingest: Service,
    stack: TestStack,
    http: reqwest::Client,
    test: &'static str,
    /// A team lead of acme-corp: (token id, token).
    lead: (String, String),
    support: String,
    /// X-Request-Ids the gateway answered, by tenant (in LIVE's order).
    live_ids: Vec<(String, String)>,
}

impl Site {
    async fn start(test: &'static str) -> Self {
        let stack = TestStack::new(test).await;
        // billing-api owns tenants and keys: it seeds the reference tenants
        // before the gateway reads their keys.
        let tenants_file = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/tenants.yaml");
        let api = start_billing_api_with(
            &stack.database_url,
            FINANCE,
            &[("BILLING_TENANTS_FILE", tenants_file.to_owned())],
        )
        .await;
        let (gateway, gateway_url) = start_gateway(&stack, 0).await;
        let ingest = start_ingest(&stack);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();

        // The ended month, through the topic as a gateway would send it.
        let from = Utc.with_ymd_and_hms(2026, 10, 2, 0, 0, 0).unwrap();
        let to = Utc.with_ymd_and_hms(2026, 10, 30, 0, 0, 0).unwrap();
        let events: Vec<(String, Vec<u8>)> =
            workload::Generator::reference(17, from, to, BACKFILL_EVENTS)
                .expect("the reference sample")
                .map(|e| (e.tenant_id.clone(), e.to_json()))
                .collect();
        let producer = stack.producer();
        stack.produce(&producer, &events).await;

        // Live requests through gateway-lite (this month).
        let mut live_ids = Vec::new();
        for (tenant, key) in LIVE {
            for n in 0..2 {
                let res = http
                    .post(format!("{gateway_url}/v1/chat/completions"))
                    .bearer_auth(key)
                    .json(&json!({
                        "model": "llama-3.1-8b",
                        "messages": [{"role": "user", "content": format!("browser test {n}: what did our GPUs cost?")}],
                        "max_tokens": 32,
                    }))
                    .send()
                    .await
                    .expect("gateway reachable");
                assert_eq!(res.status(), 200, "{}", res.text().await.unwrap());
                let id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
                live_ids.push((tenant.to_owned(), id));
            }
        }
        let expected = i64::try_from(BACKFILL_EVENTS).unwrap() + 2 * LIVE.len() as i64;
        stack
            .wait_count(
                "SELECT count(*) FROM request_log",
                expected,
                &ingest,
                Duration::from_secs(120),
            )
            .await;

        let driver = Chromedriver::start(stack.dir.path()).await;
        let mut site = Self {
            stack,
            _gateway: gateway,
            _ingest: ingest,
            api,
            http,
            driver,
            test,
            lead: (String::new(), String::new()),
            support: String::new(),
            live_ids,
        };
        let lead = site
            .api_post(
                "/v1/tokens",
                json!({"role": "team_lead", "tenant_id": "acme-corp", "label": "browser test lead"}),
            )
            .await;
        site.lead = (
            lead["token_id"].as_str().unwrap().to_owned(),
            lead["token"].as_str().unwrap().to_owned(),
        );
        let support = site
            .api_post(
                "/v1/tokens",
                json!({"role": "support", "label": "browser test support"}),
            )
            .await;
        site.support = support["token"].as_str().unwrap().to_owned();
        site
    }

    /// A new browser session, its screenshots under `<test>/<who>/`.
    async fn browser(&self, who: &str) -> Browser {
        self.driver
            .browser(&self.api.url, &format!("{}/{who}", self.test))
            .await
    }

    async fn api_call(&self, req: reqwest::RequestBuilder, what: &str) -> Value {
        let res = req.bearer_auth(FINANCE).send().await.unwrap();
        let status = res.status();
        let text = res.text().await.unwrap();
        assert_eq!(
            status,
            StatusCode::OK,
            "{what}: {text}\n{}",
            self.api.service.log_tail()
        );
        serde_json::from_str(&text).unwrap()
    }

    /// GET `path` on the JSON API as finance.
    async fn api(&self, path: &str) -> Value {
        self.api_call(self.http.get(format!("{}{path}", self.api.url)), path)
            .await
    }

    async fn api_post(&self, path: &str, body: Value) -> Value {
        self.api_call(
            self.http
                .post(format!("{}{path}", self.api.url))
                .json(&body),
            path,
        )
        .await
    }

    /// The status `token` gets from the JSON API on `path`.
    async fn api_status_as(&self, token: &str, path: &str) -> StatusCode {
        self.http
            .get(format!("{}{path}", self.api.url))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .status()
    }
}

fn dec(v: &Value) -> Decimal {
    v.as_str()
        .unwrap_or_else(|| panic!("{v} is not a decimal string"))
        .parse()
        .unwrap_or_else(|e| panic!("{v}: {e}"))
}

/// A table's rows as (first cell, the amount in the last cell).
async fn rows(b: &Browser, table: &str) -> Vec<(String, Decimal)> {
    let mut out = Vec::new();
    for row in b.find_all(&format!("{table} tbody tr")).await {
        let cells = row
            .find_all(fantoccini::Locator::Css("td"))
            .await
            .expect("cells");
        let first = cells.first().expect("a first cell").text().await.unwrap();
        let last = cells.last().expect("a last cell").text().await.unwrap();
        let amount = tests::browser::parse_amount(&last)
            .unwrap_or_else(|| panic!("{table}: {last:?} is not an amount"));
        out.push((first, amount));
    }
    out
}

/// (key, amount) of a shadow bill's `by_model` / `by_api_key` map.
fn amounts(map: &Value) -> Vec<(String, Decimal)> {
    map.as_object()
        .unwrap_or_else(|| panic!("{map} is not a map"))
        .iter()
        .map(|(k, v)| (k.clone(), dec(&v["amount"])))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_team_leads_shadow_bill_shows_the_apis_figures() {
    let site = Site::start("lead_shadow_bill").await;

    // The team lead signs in through the form and lands on their shadow
    // bill; October's figures are the API's.
    let lead = site.browser("team-lead").await;
    lead.sign_in(&site.lead.1).await;
    assert!(
        lead.path()
            .await
            .starts_with("/pages/tenants/acme-corp/shadow-bill"),
        "{}",
        lead.path().await
    );
    lead.open(&format!(
        "/pages/tenants/acme-corp/shadow-bill?period={MONTH}&shift=40"
    ))
    .await;
    assert_eq!(lead.status().await, 200, "{}", lead.source_text().await);
    let bill = site
        .api(&format!(
            "/v1/tenants/acme-corp/shadow-bill?period={MONTH}&shift=0.4"
        ))
        .await;
    assert_eq!(
        lead.amount("#month-to-date").await,
        dec(&bill["month_to_date"]["total"])
    );
    assert!(dec(&bill["month_to_date"]["total"]) > Decimal::ZERO);
    assert_eq!(
        lead.amount("#projected").await,
        dec(&bill["projected_month_total"])
    );
    assert_eq!(lead.amount("#peak").await, dec(&bill["peak"]["amount"]));
    assert_eq!(
        lead.amount("#off-peak").await,
        dec(&bill["off_peak"]["amount"])
    );
    assert!(!dec(&bill["peak"]["amount"]).is_zero() && !dec(&bill["off_peak"]["amount"]).is_zero());
    assert_eq!(
        lead.amount("#shift-saving").await,
        dec(&bill["shift"]["saving"])
    );
    // By model and by API key: every row, in order, as the API has them.
    let tables = lead.find_all("main table").await;
    assert_eq!(tables.len(), 2, "the by-model and by-key tables");
    let by_model = rows(&lead, "main table:not(#by-key)").await;
    assert_eq!(by_model, amounts(&bill["by_model"]));
    assert!(!by_model.is_empty());
    let by_key = rows(&lead, "#by-key").await;
    assert_eq!(by_key, amounts(&bill["by_api_key"]));
    assert!(!by_key.is_empty(), "the ingested month has a per-key split");
    // The charts are drawn by the server, with the off-peak hours shaded.
    assert_eq!(lead.find_all("svg.chart").await.len(), 2, "two charts");
    assert!(
        lead.has("svg.chart rect.offpeak").await,
        "off-peak hours shaded"
    );
    let shot = lead.screenshot_full_page("shadow-bill").await;
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
    // The team lead looks up their own tenant's live request.
    let (tenant, own) = &site.live_ids[0];
    assert_eq!(tenant, "acme-corp");
    lead.open(&format!("/pages/lookup?request_id={own}")).await;
    assert_eq!(lead.status().await, 200);
    assert_eq!(lead.text("#tenant").await, "acme-corp");
    lead.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn support_signs_in_looks_up_a_gateway_request_and_sees_no_money() {
    let site = Site::start("support_lookup").await;

    // A token that is not one: the form says so and nothing opens.
    let nobody = site.browser("nobody").await;
    nobody.open("/sign-in").await;
    nobody
        .fill("input[name=token]", "not-a-billing-token-0000")
        .await;
    nobody
        .click("form[action='/sign-in'] button[type=submit]")
        .await;
    assert_eq!(nobody.status().await, 401);
    assert!(nobody
        .text("p.error")
        .await
        .contains("not a live billing token"));
    nobody.open("/pages/invoices").await;
    assert_eq!(nobody.path().await, "/sign-in", "no session, no page");
    nobody.close().await;

    // Support signs in and looks up a request the gateway answered, through
    // the lookup form; no money.
    let support = site.browser("support").await;
    support.sign_in(&site.support).await;
    assert_eq!(support.path().await, "/pages/lookup");
    // The session cookie the browser keeps is out of scripts' reach and
    // never sent cross-site.
    let cookie = support
        .client
        .get_named_cookie("meterline_session")
        .await
        .expect("a session cookie");
    assert_eq!(cookie.http_only(), Some(true), "{cookie}");
    assert_eq!(
        format!("{:?}", cookie.same_site()),
        "Some(Strict)",
        "{cookie}"
    );
    let seen = support
        .client
        .execute("return document.cookie;", vec![])
        .await
        .unwrap();
    assert_eq!(seen, "", "a script cannot read the session cookie");
    let (tenant, id) = &site.live_ids[2];
    assert_eq!(tenant, "medai-labs");
    support.fill("input[name=request_id]", id).await;
    support.click("main form button[type=submit]").await;
    assert_eq!(
        support.status().await,
        200,
        "{}",
        support.source_text().await
    );
    // What the page shows is what the API answers for that request: this
    // month's (draft) invoice of medai-labs.
    let api_req = site.api(&format!("/v1/requests/{id}")).await;
    assert_eq!(api_req["request"]["tenant_id"], "medai-labs", "{api_req}");
    assert_eq!(support.text("#tenant").await, "medai-labs");
    assert_eq!(
        api_req["invoice"]["status"], "draft",
        "a live request is on this month's draft: {api_req}"
    );
    assert_eq!(
        support.text("#invoice").await,
        format!(
            "{} · {}",
            api_req["invoice"]["period"].as_str().unwrap(),
            api_req["invoice"]["status"].as_str().unwrap()
        )
    );
    support.screenshot("lookup").await;
    support.open("/pages/tenants/medai-labs/shadow-bill").await;
    assert_eq!(support.status().await, 403, "support sees no money");
    support.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finance_signs_in_and_the_invoice_pages_show_the_apis_totals() {
    let site = Site::start("finance_invoices").await;

    // The invoice list's rows and grand total are the API's.
    let finance = site.browser("finance").await;
    finance.sign_in(FINANCE).await;
    assert!(finance.path().await.starts_with("/pages/invoices"));
    finance
        .open(&format!("/pages/invoices?period={MONTH}"))
        .await;
    let listed = site.api(&format!("/v1/invoices?period={MONTH}")).await;
    let invoices = listed["invoices"].as_array().unwrap();
    assert_eq!(invoices.len(), TENANTS);
    let api_total: Decimal = invoices.iter().map(|i| dec(&i["total"])).sum();
    assert!(api_total > Decimal::ZERO);
    assert_eq!(finance.amount("#grand-total").await, api_total);
    for inv in invoices {
        let tenant = inv["tenant_id"].as_str().unwrap();
        assert_eq!(
            finance
                .amount(&format!("#invoices tr[data-tenant='{tenant}'] td.total"))
                .await,
            dec(&inv["total"]),
            "{tenant}"
        );
    }
    finance.screenshot("invoices").await;
    // One invoice: its lines and total.
    finance
        .click("#invoices tr[data-tenant='medai-labs'] a")
        .await;
    assert_eq!(
        finance.path().await,
        format!("/pages/tenants/medai-labs/invoices/{MONTH}")
    );
    let inv = site
        .api(&format!("/v1/tenants/medai-labs/invoices/{MONTH}"))
        .await;
    assert_eq!(finance.amount("#invoice-total").await, dec(&inv["total"]));
    let lines = rows(&finance, "#lines").await;
    let api_lines: Vec<(String, Decimal)> = inv["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["description"].as_str().unwrap().to_owned(),
                dec(&l["amount"]),
            )
        })
        .collect();
    assert_eq!(lines, api_lines);
    assert_eq!(finance.text("#status").await, "draft");
    finance.screenshot("invoice").await;
    finance.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn team_lead_cannot_reach_another_tenants_shadow_bill_or_lookup() {
    let site = Site::start("lead_404").await;
    let lead = site.browser("team-lead").await;
    lead.sign_in(&site.lead.1).await;
    // Another tenant's shadow bill, invoice and printable invoice, and a
    // tenant that does not exist: all 404, with no figure on the page.
    for path in [
        format!("/pages/tenants/medai-labs/shadow-bill?period={MONTH}"),
        "/pages/tenants/medai-labs/shadow-bill".to_owned(),
        format!("/pages/tenants/medai-labs/invoices/{MONTH}"),
        "/pages/tenants/no-such-tenant/shadow-bill".to_owned(),
    ] {
        lead.open(&path).await;
        assert_eq!(
            lead.status().await,
            404,
            "{path}: {}",
            lead.source_text().await
        );
        assert!(lead.text("h1").await.starts_with("404"), "{path}");
        assert!(!lead.has("#month-to-date").await, "{path}");
        assert!(!lead.has("#invoice-total").await, "{path}");
    }
    lead.screenshot("other-tenant-404").await;
    // Another tenant's request, typed into the lookup form: 404, nothing shown.
    let (tenant, theirs) = &site.live_ids[2];
    assert_eq!(tenant, "medai-labs");
    lead.open("/pages/lookup").await;
    lead.fill("input[name=request_id]", theirs).await;
    lead.click("main form button[type=submit]").await;
    assert_eq!(lead.status().await, 404, "{}", lead.source_text().await);
    assert!(!lead.has("#request").await);
    assert!(!lead.source_text().await.contains("medai-labs"));
    // Its own tenant's pages and requests open.
    let (tenant, own) = &site.live_ids[0];
    assert_eq!(tenant, "acme-corp");
    lead.open(&format!("/pages/lookup?request_id={own}")).await;
    assert_eq!(lead.status().await, 200);
    lead.open(&format!(
        "/pages/tenants/acme-corp/shadow-bill?period={MONTH}"
    ))
    .await;
    assert_eq!(lead.status().await, 200);
    // Finance's pages are not the team lead's.
    lead.open("/pages/invoices").await;
    assert_eq!(lead.status().await, 403);
    // The API agrees.
    assert_eq!(
        site.api_status_as(&site.lead.1, "/v1/tenants/medai-labs/shadow-bill")
            .await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        site.api_status_as(&site.lead.1, &format!("/v1/requests/{theirs}"))
            .await,
        StatusCode::NOT_FOUND
    );
    lead.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finance_finalizes_and_closes_the_month_by_clicking_through_the_confirmation() {
    let site = Site::start("finalize_close").await;
    let finance = site.browser("finance").await;
    finance.sign_in(FINANCE).await;
    let path = format!("/pages/tenants/acme-corp/invoices/{MONTH}");
    finance.open(&path).await;
    assert_eq!(finance.text("#status").await, "draft");
    let draft_total = finance.amount("#invoice-total").await;

    // Finalize without ticking the box: refused, nothing changes.
    finance.click("#finalize").await;
    assert_eq!(
        finance.status().await,
        400,
        "{}",
        finance.source_text().await
    );
    assert!(finance.text("p.error").await.contains("confirm"));
    let inv = site
        .api(&format!("/v1/tenants/acme-corp/invoices/{MONTH}"))
        .await;
    assert_eq!(
        inv["status"], "draft",
        "an unconfirmed finalize changed nothing"
    );

    // Tick it and finalize: the page shows the numbered invoice, as the API does.
    finance.open(&path).await;
    finance
        .tick("form[action$='/finalize'] input[name=confirm]")
        .await;
    finance.click("#finalize").await;
    assert_eq!(
        finance.status().await,
        200,
        "{}",
        finance.source_text().await
    );
    assert_eq!(finance.path().await, path, "back on the invoice");
    let inv = site
        .api(&format!("/v1/tenants/acme-corp/invoices/{MONTH}"))
        .await;
    assert_eq!(inv["status"], "finalized", "{inv}");
    assert_eq!(finance.text("#status").await, "finalized · payable");
    assert_eq!(
        finance.text("#number").await,
        inv["number"].as_i64().unwrap().to_string()
    );
    assert_eq!(finance.amount("#invoice-total").await, dec(&inv["total"]));
    assert_eq!(
        dec(&inv["total"]),
        draft_total,
        "finalizing kept the draft's total"
    );
    assert!(
        !finance.has("#finalize").await,
        "a finalized invoice offers no finalize"
    );
    finance.screenshot("finalized").await;

    // Close the month: refused without the box, then finalizes the other four.
    let list = format!("/pages/invoices?period={MONTH}");
    finance.open(&list).await;
    finance.click("#close-month").await;
    assert_eq!(finance.status().await, 400);
    let listed = site.api(&format!("/v1/invoices?period={MONTH}")).await;
    let drafts = listed["invoices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["status"] == "draft")
        .count();
    assert_eq!(drafts, TENANTS - 1, "an unconfirmed close changed nothing");
    finance.open(&list).await;
    finance
        .tick("form[action$='/close'] input[name=confirm]")
        .await;
    finance.click("#close-month").await;
    assert_eq!(
        finance.status().await,
        200,
        "{}",
        finance.source_text().await
    );
    assert_eq!(
        finance.text("#close-report").await,
        format!(
            "Finalized {} invoice(s); 1 were already finalized.",
            TENANTS - 1
        )
    );
    finance.screenshot("month-closed").await;
    let listed = site.api(&format!("/v1/invoices?period={MONTH}")).await;
    for inv in listed["invoices"].as_array().unwrap() {
        assert_eq!(inv["status"], "finalized", "{inv}");
    }
    // The list shows every invoice finalized, with the API's totals.
    finance.open(&list).await;
    let api_total: Decimal = listed["invoices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| dec(&i["total"]))
        .sum();
    assert_eq!(finance.amount("#grand-total").await, api_total);
    for row in finance.find_all("#invoices tbody tr").await {
        let status = row
            .find(fantoccini::Locator::Css("td:nth-child(2)"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(status.starts_with("finalized"), "{status}");
    }
    // A second close finalizes nothing and says so.
    finance
        .tick("form[action$='/close'] input[name=confirm]")
        .await;
    finance.click("#close-month").await;
    assert_eq!(
        finance.text("#close-report").await,
        format!("Finalized 0 invoice(s); {TENANTS} were already finalized.")
    );

    // Void acme-corp's invoice: refused without the box, then voided with
    // its reason; the month is a draft again, to be finalized anew.
    let number = inv["number"].as_i64().unwrap();
    finance.open(&path).await;
    finance
        .fill("input[name=reason]", "wrong rate applied")
        .await;
    finance.click("#void").await;
    assert_eq!(finance.status().await, 400);
    assert!(finance.text("p.error").await.contains("confirm"));
    let voided = |reason: &str| {
        format!(
            "SELECT count(*) FROM invoices WHERE tenant_id = 'acme-corp' AND period = '{MONTH}'
             AND number = {number} AND status = 'voided' AND void_reason = '{reason}'"
        )
    };
    assert_eq!(site.stack.count(&voided("wrong rate applied")).await, 0);
    finance.open(&path).await;
    finance
        .fill("input[name=reason]", "wrong rate applied")
        .await;
    finance
        .tick("form[action$='/void'] input[name=confirm]")
        .await;
    finance.click("#void").await;
    assert_eq!(
        finance.status().await,
        200,
        "{}",
        finance.source_text().await
    );
    assert_eq!(finance.path().await, path, "back on the invoice");
    assert_eq!(site.stack.count(&voided("wrong rate applied")).await, 1);
    let inv = site
        .api(&format!("/v1/tenants/acme-corp/invoices/{MONTH}"))
        .await;
    assert_eq!(
        inv["status"], "draft",
        "voided: the month is open again: {inv}"
    );
    assert_eq!(finance.text("#status").await, "draft");
    assert!(finance.has("#finalize").await, "it can be finalized again");
    assert!(!finance.has("#void").await);
    finance.screenshot("voided").await;
    finance.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_set_in_the_page_warns_on_the_team_leads_page_and_in_the_api() {
    let site = Site::start("budget").await;
    let bill = site
        .api(&format!("/v1/tenants/acme-corp/shadow-bill?period={MONTH}"))
        .await;
    assert!(
        bill["budget"].is_null(),
        "no budget yet: {}",
        bill["budget"]
    );
    // A budget covers usage and reserved capacity, not the overhead share.
    let mtd = &bill["month_to_date"];
    let spent = dec(&mtd["subtotal"]) + mtd.get("reserved").map(dec).unwrap_or_default();
    // A budget the month has used ~91% of: a warning, not over.
    let budget = (spent * Decimal::new(11, 1)).round_dp(2);

    let finance = site.browser("finance").await;
    finance.sign_in(FINANCE).await;
    let page = format!("/pages/tenants/acme-corp/shadow-bill?period={MONTH}");
    finance.open(&page).await;
    assert!(!finance.has("#budget").await);
    finance
        .fill("input[name=amount]", &budget.to_string())
        .await;
    finance
        .click("form[action$='/budget'] button[type=submit]")
        .await;
    assert_eq!(
        finance.status().await,
        200,
        "{}",
        finance.source_text().await
    );
    assert_eq!(finance.path().await, page);
    assert_eq!(finance.amount("#budget").await, budget);
    let bill = site
        .api(&format!("/v1/tenants/acme-corp/shadow-bill?period={MONTH}"))
        .await;
    assert_eq!(bill["budget"]["level"], "warning", "{}", bill["budget"]);
    assert_eq!(dec(&bill["budget"]["amount"]), budget);
    finance.close().await;

    // The team lead sees the warning and the budget on their page.
    let lead = site.browser("team-lead").await;
    lead.sign_in(&site.lead.1).await;
    lead.open(&page).await;
    assert!(
        lead.text("#budget-warning")
            .await
            .starts_with("Budget warning:"),
        "{}",
        lead.source_text().await
    );
    assert_eq!(lead.amount("#budget").await, budget);
    assert!(
        !lead.has("form[action$='/budget']").await,
        "only finance sets budgets"
    );
    lead.screenshot("budget-warning").await;
    assert!(!lead.has("#grace-note").await, "no grace period yet");

    // acme-corp began real chargeback on the month's first day: its whole
    // month is in the grace period. With the budget at half of what it
    // spent, the other half is shown and not invoiced.
    sqlx::query("UPDATE tenants SET chargeback_since = $1 WHERE tenant_id = 'acme-corp'")
        .bind(chrono::NaiveDate::parse_from_str(&format!("{MONTH}-01"), "%Y-%m-%d").unwrap())
        .execute(&site.stack.pool)
        .await
        .unwrap();
    let half = (spent / Decimal::from(2)).round_dp(2);
    let finance = site.browser("finance-grace").await;
    finance.sign_in(FINANCE).await;
    finance.open(&page).await;
    finance.fill("input[name=amount]", &half.to_string()).await;
    finance
        .click("form[action$='/budget'] button[type=submit]")
        .await;
    assert_eq!(
        finance.status().await,
        200,
        "{}",
        finance.source_text().await
    );
    finance.close().await;
    let bill = site
        .api(&format!("/v1/tenants/acme-corp/shadow-bill?period={MONTH}"))
        .await;
    assert_eq!(bill["budget"]["level"], "exceeded", "{}", bill["budget"]);
    assert_eq!(bill["grace"]["this_month"], true, "{}", bill["grace"]);
    assert_eq!(dec(&bill["grace"]["waived"]), spent - half);
    let invoice = &bill["month_to_date"];
    assert_eq!(dec(&invoice["waived"]), half - spent, "{invoice}");
    lead.open(&page).await;
    let note = lead.text("#grace-note").await;
    assert!(
        note.starts_with("Grace period: real chargeback since"),
        "{note}"
    );
    assert_eq!(lead.amount("#grace-waived").await, spent - half);
    assert_eq!(lead.amount("#month-to-date").await, dec(&invoice["total"]));
    lead.screenshot("grace-period").await;
    // The invoice page shows the waiver among the lines and totals.
    lead.open(&format!("/pages/tenants/acme-corp/invoices/{MONTH}"))
        .await;
    assert_eq!(lead.amount("#waived").await, half - spent);
    assert_eq!(lead.amount("#invoice-total").await, dec(&invoice["total"]));
    lead.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_token_in_the_page_ends_that_tokens_session() {
    let site = Site::start("revoke").await;
    let (lead_id, lead_token) = &site.lead;
    let lead = site.browser("team-lead").await;
    lead.sign_in(lead_token).await;
    let own = "/pages/tenants/acme-corp/shadow-bill";
    lead.open(own).await;
    assert_eq!(lead.status().await, 200);

    let finance = site.browser("finance").await;
    finance.sign_in(FINANCE).await;
    finance.open("/pages/tokens").await;
    let row = format!("#tokens tr[data-token='{lead_id}']");
    assert_eq!(
        finance.text(&format!("{row} td:nth-child(6)")).await,
        "live"
    );
    // Revoke without ticking "sure": refused; the lead is still signed in.
    finance.click(&format!("{row} button[type=submit]")).await;
    assert_eq!(finance.status().await, 400);
    lead.open(own).await;
    assert_eq!(
        lead.path().await,
        own,
        "an unconfirmed revoke changed nothing"
    );
    // Tick it and revoke.
    finance.open("/pages/tokens").await;
    finance.tick(&format!("{row} input[name=confirm]")).await;
    finance.click(&format!("{row} button[type=submit]")).await;
    assert_eq!(finance.path().await, "/pages/tokens");
    assert_eq!(
        finance.text(&format!("{row} td:nth-child(6)")).await,
        "revoked"
    );
    assert!(!finance.has(&format!("{row} form")).await);
    finance.screenshot("token-revoked").await;
    finance.close().await;

    // The lead's session is gone: the next page is the sign-in page ...
    lead.open(own).await;
    assert_eq!(
        lead.path().await,
        "/sign-in",
        "the revoked token's session ended"
    );
    // ... the token no longer signs in ...
    lead.fill("input[name=token]", lead_token).await;
    lead.click("form[action='/sign-in'] button[type=submit]")
        .await;
    assert_eq!(lead.status().await, 401);
    assert_eq!(lead.path().await, "/sign-in");
    // ... and the API refuses it.
    assert_eq!(
        site.api_status_as(lead_token, "/v1/tenants/acme-corp/shadow-bill")
            .await,
        StatusCode::UNAUTHORIZED
    );
    lead.close().await;
    let (n,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM audit_log WHERE action = 'revoke_token'")
            .fetch_one(&site.stack.pool)
            .await
            .unwrap();
    assert_eq!(n, 1, "the revocation is audited once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payable_invoice_prints_to_a_pdf_with_its_number_tenant_and_total() {
    let site = Site::start("print").await;
    let inv = site
        .api_post(
            &format!("/v1/tenants/acme-corp/invoices/{MONTH}/finalize"),
            json!({}),
        )
        .await;
    let number = inv["number"].as_i64().unwrap().to_string();
    let total = dec(&inv["total"]);
    assert!(total > Decimal::ZERO);

    let finance = site.browser("finance").await;
    finance.sign_in(FINANCE).await;
    finance
        .open(&format!("/pages/tenants/acme-corp/invoices/{MONTH}"))
        .await;
    finance.click("#print-link").await;
    assert_eq!(
        finance.path().await,
        format!("/pages/tenants/acme-corp/invoices/{MONTH}/print")
    );
    assert_eq!(finance.status().await, 200);
    assert_eq!(finance.amount("#invoice-total").await, total);
    finance.screenshot("printable").await;
    let pdf = finance.print_pdf("invoice").await;
    assert!(pdf.starts_with(b"%PDF-"), "a PDF");
    let text = pdf_extract::extract_text_from_mem(&pdf).expect("the PDF's text");
    // The extracted text's spacing follows the glyph positions (`4 0 4`),
    // so compare with every whitespace removed.
    let squeeze = |t: &str| t.split_whitespace().collect::<String>();
    let flat = squeeze(&text);
    assert!(
        flat.contains(&format!("Invoice{number}")),
        "number {number} in:\n{text}"
    );
    assert!(flat.contains("acme-corp"), "tenant in:\n{text}");
    assert!(flat.contains("AcmeCorp"), "tenant's name in:\n{text}");
    let shown = finance.text("#invoice-total").await;
    assert_eq!(tests::browser::parse_amount(&shown), Some(total));
    assert!(
        flat.contains(&squeeze(&format!("Total {shown}"))),
        "total {shown} in:\n{text}"
    );
    // The print stylesheet hides the navigation and the forms.
    assert!(!flat.contains("Signout"), "no navigation in print:\n{text}");
    finance.close().await;
}
