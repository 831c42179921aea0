//! billing-api as a process against real Postgres: the reference figures,
//! off-peak across daylight-saving changes, the invoice lifecycle with late
//! usage, exports, request lookup, and every endpoint × every role.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use chrono::{DateTime, TimeZone, Utc};
use reqwest::{Client, Method, StatusCode};
use rust_decimal::Decimal;
use serde_json::Value;
use sqlx::PgPool;
use tests::stack::fresh_database;
use tests::Service;

const FINANCE: &str = "finance-token-for-billing-tests";
const LEAD: &str = "lead-token-p1-team-0001";
const SUPPORT: &str = "support-token-billing-0001";

struct Billing {
    _svc: Service,
    /// Dropped after the service that uses it.
    _db: devstack::Database,
    url: String,
    pool: PgPool,
    client: Client,
    _dir: tempfile::TempDir,
}

impl Billing {
    async fn call(&self, method: Method, path: &str, token: Option<&str>) -> (StatusCode, String) {
        let mut req = self
            .client
            .request(method.clone(), format!("{}{path}", self.url));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if method == Method::POST && path.ends_with("/void") {
            req = req.json(&serde_json::json!({"reason": "wrong rate applied"}));
        }
        let res = req.send().await.unwrap();
        (res.status(), res.text().await.unwrap())
    }

    async fn json(&self, path: &str) -> Value {
        let (status, body) = self.call(Method::GET, path, Some(FINANCE)).await;
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    async fn post(&self, path: &str) -> Value {
        let (status, body) = self.call(Method::POST, path, Some(FINANCE)).await;
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    }
}

async fn start() -> Billing {
    let fresh_db = fresh_database("billing").await;
    let (url, pool) = (fresh_db.url.clone(), fresh_db.pool.clone());
    for (tenant, mode, shadow, tz) in [
        ("p1-team", "per_gpu_second", false, "America/New_York"),
        ("p5-team", "per_gpu_second", false, "America/New_York"),
        ("night-team", "per_gpu_second", true, "America/New_York"),
        ("api-co", "per_token", false, "UTC"),
    ] {
        sqlx::query(
            "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode, shadow, time_zone)
             VALUES ($1, $1, 'standard', 3, $2, $3, $4)",
        )
        .bind(tenant)
        .bind(mode)
        .bind(shadow)
        .bind(tz)
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO billing_tokens (token_id, token_hash, role, tenant_id) VALUES
           ('lead', sha256($1::bytea), 'team_lead', 'p1-team'),
           ('support', sha256($2::bytea), 'support', NULL)",
    )
    .bind(LEAD.as_bytes())
    .bind(SUPPORT.as_bytes())
    .execute(&pool)
    .await
    .unwrap();
    let tests::billing::BillingApi {
        service: svc,
        url,
        dir,
    } = tests::billing::start_billing_api(&url, FINANCE).await;
    Billing {
        _svc: svc,
        _db: fresh_db,
        url,
        pool,
        client: Client::new(),
        _dir: dir,
    }
}

/// One usage_hourly row, as ingest would have left it.
async fn usage(pool: &PgPool, tenant: &str, priority: i16, hour: DateTime<Utc>, gpu_hours: i64) {
    sqlx::query(
        "INSERT INTO usage_hourly (tenant_id, model, priority, hour, requests, prompt_tokens,
             cached_tokens, completion_tokens, gpu_seconds)
         VALUES ($1, 'llama-3.1-70b', $2, $3, 1, 1000, 200, 500, $4)
         ON CONFLICT (tenant_id, model, priority, hour) DO UPDATE SET
             requests = usage_hourly.requests + 1, gpu_seconds = usage_hourly.gpu_seconds + EXCLUDED.gpu_seconds",
    )
    .bind(tenant)
    .bind(priority)
    .bind(hour)
    .bind(Decimal::from(gpu_hours * 3600))
    .execute(pool)
    .await
    .unwrap();
}

fn utc(y: i32, m: u32, d: u32, h: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, m, d, h, 0, 0).unwrap()
}

fn dec(v: &Value) -> Decimal {
    v.as_str()
        .unwrap_or_else(|| panic!("not a decimal string: {v}"))
        .parse()
        .unwrap()
}

fn lines_of<'a>(inv: &'a Value, kind: &str) -> Vec<&'a Value> {
    inv["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["kind"] == kind)
        .collect()
}

#[tokio::test]
async fn reference_figures_overhead_and_off_peak_to_the_cent() {
    let b = start().await;
    // September 2026 in New York (EDT, UTC-4): 18:00 UTC is 14:00 local (peak),
    // 03:00 UTC is 23:00 local the day before (off-peak).
    usage(&b.pool, "p1-team", 1, utc(2026, 9, 10, 18), 12_400).await;
    usage(&b.pool, "p5-team", 5, utc(2026, 9, 10, 18), 12_400).await;
    usage(&b.pool, "night-team", 3, utc(2026, 9, 11, 3), 100).await;

    let p1 = b.json("/v1/tenants/p1-team/invoices/2026-09").await;
    assert_eq!(p1["status"], "draft");
    assert_eq!(
        dec(&p1["subtotal"]),
        Decimal::new(1_240_000, 2),
        "12,400 GPU-hours at P1 = $12,400.00"
    );
    let p5 = b.json("/v1/tenants/p5-team/invoices/2026-09").await;
    assert_eq!(
        dec(&p5["subtotal"]),
        Decimal::new(4_340_000, 2),
        "at P5 = $43,400.00"
    );
    let night = b.json("/v1/tenants/night-team/invoices/2026-09").await;
    assert_eq!(
        dec(&lines_of(&night, "usage")[0]["amount"]),
        Decimal::new(20_000, 2)
    );
    assert_eq!(
        dec(&lines_of(&night, "discount")[0]["amount"]),
        Decimal::new(-6_000, 2),
        "30% off-peak"
    );
    assert_eq!(night["shadow"], true);
    assert_eq!(night["payable"], false);

    // The $2,800 pool by billable GPU-seconds 12400 : 12400 : 100, largest
    // remainder: 1394.38 + 1394.38 + 11.24 = 2800.00 exactly.
    let shares: Vec<Decimal> = [&p1, &p5, &night]
        .iter()
        .map(|i| dec(&i["overhead"]))
        .collect();
    assert_eq!(
        shares,
        vec![
            Decimal::new(139_438, 2),
            Decimal::new(139_438, 2),
            Decimal::new(1_124, 2)
        ]
    );
    assert_eq!(shares.iter().sum::<Decimal>(), Decimal::new(280_000, 2));
    for inv in [&p1, &p5, &night] {
        let sum: Decimal = inv["lines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| dec(&l["amount"]))
            .sum();
        assert_eq!(dec(&inv["total"]), sum, "total is the sum of the lines");
    }
    // Cost tools see the same figures.
    let metrics = b
        .client
        .get(format!("{}/metrics", b.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        r#"gpu_seconds_total{tenant="p1-team"} 44640000"#,
        r#"preemption_waste_seconds_total{tenant="p1-team"} 0"#,
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(line)),
            "missing {line} in\n{metrics}"
        );
    }
    assert!(metrics.contains("# TYPE request_cost_dollars_total counter"));
    // The same inputs give the same invoice, byte for byte.
    let again = b.json("/v1/tenants/p1-team/invoices/2026-09").await;
    assert_eq!(again, p1);
}

#[tokio::test]
async fn off_peak_follows_local_time_across_daylight_saving_changes() {
    let b = start().await;
    // 2026-11-01 in New York has 25 hours (01:00 twice); 2026-03-08 has 23 (no 02:00).
    let fall_start = utc(2026, 11, 1, 4);
    for h in 0..25 {
        usage(
            &b.pool,
            "p1-team",
            1,
            fall_start + chrono::Duration::hours(h),
            1,
        )
        .await;
    }
    let spring_start = utc(2026, 3, 8, 5);
    for h in 0..23 {
        usage(
            &b.pool,
            "p1-team",
            1,
            spring_start + chrono::Duration::hours(h),
            1,
        )
        .await;
    }
    // Off-peak is 22:00–06:00 local: 00,01,01,02,03,04,05,22,23 in the fall = 9 hours;
    // 00,01,03,04,05,22,23 in the spring = 7 hours.
    for (period, off, peak) in [("2026-11", 9, 16), ("2026-03", 7, 16)] {
        let bill = b
            .json(&format!("/v1/tenants/p1-team/shadow-bill?period={period}"))
            .await;
        assert_eq!(bill["off_peak"]["requests"], off, "{period}: {bill}");
        assert_eq!(bill["peak"]["requests"], peak, "{period}");
        assert_eq!(dec(&bill["peak"]["amount"]), Decimal::from(peak));
        assert_eq!(
            dec(&bill["off_peak"]["amount"]),
            Decimal::from(off) * Decimal::new(70, 2)
        );
        let inv = &bill["month_to_date"];
        let discount: Decimal = lines_of(inv, "discount")
            .iter()
            .map(|l| dec(&l["amount"]))
            .sum();
        assert_eq!(discount, -(Decimal::from(off) * Decimal::new(30, 2)));
        // Savings if a quarter of the peak load moved off-peak: 25% × peak × 30%.
        assert_eq!(
            dec(&bill["shift"]["saving"]),
            Decimal::from(peak) * Decimal::new(25, 2) * Decimal::new(30, 2)
        );
        assert_eq!(
            bill["by_day"].as_object().unwrap().len(),
            1,
            "one local day"
        );
    }
}

#[tokio::test]
async fn finalized_invoices_never_change_and_late_usage_is_adjusted_next_month() {
    let b = start().await;
    usage(&b.pool, "p1-team", 1, utc(2026, 9, 10, 18), 10).await;
    let first = b
        .post("/v1/tenants/p1-team/invoices/2026-09/finalize")
        .await;
    assert_eq!(first["status"], "finalized");
    assert_eq!(first["number"], 1);
    assert_eq!(first["payable"], true);
    let again = b
        .post("/v1/tenants/p1-team/invoices/2026-09/finalize")
        .await;
    assert_eq!(again, first, "finalizing twice gives the same invoice");

    // Usage that arrives late for September.
    usage(&b.pool, "p1-team", 1, utc(2026, 9, 20, 18), 2).await;
    let september = b.json("/v1/tenants/p1-team/invoices/2026-09").await;
    assert_eq!(september, first, "a finalized invoice never changes");
    let october = b.json("/v1/tenants/p1-team/invoices/2026-10").await;
    let adj = lines_of(&october, "adjustment");
    assert_eq!(adj.len(), 1, "{october}");
    assert_eq!(adj[0]["adjusts"], "2026-09");
    assert_eq!(
        dec(&adj[0]["amount"]),
        Decimal::new(200, 2),
        "2 GPU-hours at P1"
    );

    // October finalized with the adjustment: November owes nothing more for September.
    b.post("/v1/tenants/p1-team/invoices/2026-10/finalize")
        .await;
    let november = b.json("/v1/tenants/p1-team/invoices/2026-11").await;
    assert!(lines_of(&november, "adjustment").is_empty(), "{november}");

    // A month that has not ended can't be finalized.
    let (status, _) = b
        .call(
            Method::POST,
            "/v1/tenants/p1-team/invoices/2099-01/finalize",
            Some(FINANCE),
        )
        .await;
    assert_eq!(status, 409);

    // Void with a reason; the month can be finalized again, with a new number.
    let voided = b.post("/v1/tenants/p1-team/invoices/2026-09/void").await;
    assert_eq!(voided["status"], "voided");
    assert_eq!(voided["void_reason"], "wrong rate applied");
    let refinal = b
        .post("/v1/tenants/p1-team/invoices/2026-09/finalize")
        .await;
    assert_eq!(refinal["number"], 3);
}

#[tokio::test]
async fn exports_and_request_lookup() {
    let b = start().await;
    usage(&b.pool, "p1-team", 1, utc(2026, 9, 10, 18), 10).await;
    usage(&b.pool, "night-team", 3, utc(2026, 9, 11, 3), 5).await;
    let (status, csv) = b
        .call(
            Method::GET,
            "/v1/exports/focus?period=2026-09",
            Some(FINANCE),
        )
        .await;
    assert_eq!(status, 200);
    let mut rows = csv::Reader::from_reader(csv.as_bytes());
    let headers = rows.headers().unwrap().clone();
    for col in [
        "BilledCost",
        "EffectiveCost",
        "ListCost",
        "ChargePeriodStart",
        "ChargePeriodEnd",
        "BillingPeriodStart",
        "BillingPeriodEnd",
        "ChargeCategory",
        "SubAccountId",
        "ServiceName",
        "PricingQuantity",
        "PricingUnit",
        "ConsumedQuantity",
        "ConsumedUnit",
    ] {
        assert!(
            headers.iter().any(|h| h == col),
            "FOCUS column {col} missing"
        );
    }
    let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let records: Vec<csv::StringRecord> = rows.records().map(|r| r.unwrap()).collect();
    let night_billed: Decimal = records
        .iter()
        .filter(|r| &r[col("SubAccountId")] == "night-team")
        .map(|r| r[col("BilledCost")].parse::<Decimal>().unwrap())
        .sum();
    assert_eq!(
        night_billed,
        Decimal::ZERO,
        "a shadow tenant is never billed"
    );
    let p1_effective: Decimal = records
        .iter()
        .filter(|r| &r[col("SubAccountId")] == "p1-team")
        .map(|r| r[col("EffectiveCost")].parse::<Decimal>().unwrap())
        .sum();
    let p1 = b.json("/v1/tenants/p1-team/invoices/2026-09").await;
    assert_eq!(p1_effective, dec(&p1["total"]));

    let (status, csv) = b
        .call(
            Method::GET,
            "/v1/invoices?period=2026-09&format=csv",
            Some(FINANCE),
        )
        .await;
    assert_eq!(status, 200);
    assert!(csv.starts_with("tenant_id,period,status"), "{csv}");
    let page = b.json("/v1/invoices?period=2026-09&limit=2").await;
    assert_eq!(page["invoices"].as_array().unwrap().len(), 2);
    let next = page["next_cursor"].as_str().unwrap();
    let rest = b
        .json(&format!(
            "/v1/invoices?period=2026-09&limit=2&cursor={next}"
        ))
        .await;
    assert_eq!(
        rest["invoices"].as_array().unwrap().len(),
        2,
        "four tenants in two pages"
    );

    // Support pastes a request id and finds its invoice, without money.
    let id = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(
        uuid::NoContext,
        1_789_056_000,
        0,
    ));
    sqlx::query(
        "SELECT ensure_request_log_partition((to_timestamp(1789056000) AT TIME ZONE 'UTC')::date)",
    )
    .execute(&b.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO request_log (request_id, tenant_id, api_key_id, model, model_version, priority,
             started_at, finished_at, prompt_tokens, cached_tokens, completion_tokens, gpu_seconds,
             preempted_gpu_seconds, finish_reason, replica_id, gateway_id, stream, content_hash,
             kafka_partition, kafka_offset)
         VALUES ($1, 'p1-team', 'k', 'llama-3.1-70b', 'v', 1, to_timestamp(1789056000),
             to_timestamp(1789056001), 10, 0, 5, 1.5, 0, 'stop', 'r', 'g', false, '\\x00', 0, 0)",
    )
    .bind(id)
    .execute(&b.pool)
    .await
    .unwrap();
    b.post("/v1/tenants/p1-team/invoices/2026-09/finalize")
        .await;
    let (status, body) = b
        .call(
            Method::GET,
            &format!("/v1/requests/req_{id}"),
            Some(SUPPORT),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let found: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(found["request"]["tenant_id"], "p1-team");
    assert_eq!(found["invoice"]["period"], "2026-09");
    assert_eq!(found["invoice"]["status"], "finalized");
    assert!(
        !body.contains("amount") && !body.contains("total"),
        "support sees no money: {body}"
    );
    let (status, _) = b
        .call(Method::GET, "/v1/requests/req_not-an-id", Some(SUPPORT))
        .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn every_endpoint_for_every_role() {
    let b = start().await;
    usage(&b.pool, "p1-team", 1, utc(2026, 9, 10, 18), 1).await;
    usage(&b.pool, "p5-team", 5, utc(2026, 9, 10, 18), 1).await;
    let book = include_str!("../../config/price-book.yaml");
    // (method, path, finance, team lead of p1-team, support)
    let matrix: Vec<(Method, String, u16, u16, u16)> = vec![
        (
            Method::GET,
            "/v1/tenants/p1-team/usage?from=2026-09-01T00:00:00Z&to=2026-10-01T00:00:00Z".into(),
            200,
            200,
            403,
        ),
        (
            Method::GET,
            "/v1/tenants/p5-team/usage?from=2026-09-01T00:00:00Z&to=2026-10-01T00:00:00Z".into(),
            200,
            404,
            403,
        ),
        (
            Method::GET,
            "/v1/tenants/p1-team/invoices/2026-09".into(),
            200,
            200,
            403,
        ),
        (
            Method::GET,
            "/v1/tenants/p5-team/invoices/2026-09".into(),
            200,
            404,
            403,
        ),
        (
            Method::GET,
            "/v1/tenants/no-such-tenant/invoices/2026-09".into(),
            404,
            404,
            403,
        ),
        (
            Method::GET,
            "/v1/tenants/p1-team/shadow-bill?period=2026-09".into(),
            200,
            200,
            403,
        ),
        (
            Method::GET,
            "/v1/tenants/p5-team/shadow-bill?period=2026-09".into(),
            200,
            404,
            403,
        ),
        (
            Method::POST,
            "/v1/tenants/p5-team/invoices/2026-09/finalize".into(),
            200,
            404,
            403,
        ),
        (
            Method::POST,
            "/v1/tenants/p1-team/invoices/2026-09/finalize".into(),
            200,
            403,
            403,
        ),
        (
            Method::POST,
            "/v1/tenants/p5-team/invoices/2026-09/void".into(),
            200,
            404,
            403,
        ),
        (
            Method::GET,
            "/v1/invoices?period=2026-09".into(),
            200,
            403,
            403,
        ),
        (
            Method::GET,
            "/v1/exports/focus?period=2026-09".into(),
            200,
            403,
            403,
        ),
    ];
    for (method, path, finance, lead, support) in &matrix {
        // Team lead and support first, so finance's writes don't change their answers.
        for (token, expected) in [(LEAD, lead), (SUPPORT, support), (FINANCE, finance)] {
            let (status, body) = b.call(method.clone(), path, Some(token)).await;
            assert_eq!(
                status.as_u16(),
                *expected,
                "{method} {path} as {token}: {body}"
            );
            if status.is_client_error() {
                let v: Value = serde_json::from_str(&body).unwrap();
                assert!(
                    v["error"]["code"].is_string() && v["error"]["message"].is_string(),
                    "{body}"
                );
            }
        }
        let (status, _) = b.call(method.clone(), path, None).await;
        assert_eq!(status, 401, "{method} {path} without a token");
    }
    for (token, expected) in [(LEAD, 403), (SUPPORT, 403), (FINANCE, 200)] {
        let res = b
            .client
            .post(format!("{}/v1/price-books", b.url))
            .bearer_auth(token)
            .body(book)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), expected, "price book as {token}");
    }
    let bad = book.replace("America/New_York", "Nowhere/Land");
    let res = b
        .client
        .post(format!("{}/v1/price-books", b.url))
        .bearer_auth(FINANCE)
        .body(bad)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    assert!(res.text().await.unwrap().contains("Nowhere/Land"));
    // The served contract is the committed one.
    let served = b
        .client
        .get(format!("{}/openapi.json", b.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(served, include_str!("../../billing-api/openapi.json"));
    // Reads of money are audited; refusals are not reads.
    let (reads,): (i64,) = sqlx::query_as("SELECT count(*) FROM audit_log WHERE token_id = 'lead'")
        .fetch_one(&b.pool)
        .await
        .unwrap();
    assert_eq!(reads, 3, "the lead's three successful reads");
}
