//! billing-api as a process against real Postgres: the reference figures,
//! off-peak across daylight-saving changes, the invoice lifecycle with late
//! usage, exports, request lookup, and every endpoint × every role.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::time::Duration;

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
        if method == Method::PUT && path.contains("/budgets/") {
            req = req.json(&serde_json::json!({"amount": "1250.00"}));
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
    // Cost metrics are not public: no token, or a wrong one, is a 401.
    for token in [None, Some("not-the-metrics-token-0000")] {
        let mut req = b.client.get(format!("{}/metrics", b.url));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), 401, "/metrics with {token:?}");
    }
    // Cost tools (with the token) see the same figures.
    let metrics = b
        .client
        .get(format!("{}/metrics", b.url))
        .bearer_auth(tests::billing::METRICS_TOKEN)
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

impl Billing {
    async fn put_budget(&self, tenant: &str, period: &str, amount: Value) -> (StatusCode, String) {
        let res = self
            .client
            .put(format!("{}/v1/tenants/{tenant}/budgets/{period}", self.url))
            .bearer_auth(FINANCE)
            .json(&serde_json::json!({ "amount": amount }))
            .send()
            .await
            .unwrap();
        (res.status(), res.text().await.unwrap())
    }
}

#[tokio::test]
async fn a_grace_period_waives_only_the_charges_above_budget_that_accrue_in_it() {
    let b = start().await;
    // Real chargeback since 16 September (New York): the grace period runs
    // through 15 October. P1 GPU-hours are $1.00, all at peak hours.
    sqlx::query("UPDATE tenants SET chargeback_since = '2026-09-16' WHERE tenant_id = 'p1-team'")
        .execute(&b.pool)
        .await
        .unwrap();
    for period in ["2026-09", "2026-10", "2026-11"] {
        let (status, body) = b.put_budget("p1-team", period, "5.00".into()).await;
        assert_eq!(status, 200, "{body}");
    }
    // Money is never a JSON number, and a budget is positive, in cents.
    for bad in [serde_json::json!(5.0), "-1".into(), "5.001".into()] {
        let (status, body) = b.put_budget("p1-team", "2026-12", bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.contains("\"error\""), "{body}");
    }
    let (status, _) = b.put_budget("nobody", "2026-12", "5.00".into()).await;
    assert_eq!(status, 404);
    let res = b
        .client
        .put(format!("{}/v1/tenants/p1-team/budgets/2026-12", b.url))
        .bearer_auth(LEAD)
        .json(&serde_json::json!({"amount": "1.00"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403, "only finance sets budgets");

    // September: $3 before grace, $4 in it: $2 of it above the $5 budget.
    usage(&b.pool, "p1-team", 1, utc(2026, 9, 10, 18), 3).await;
    usage(&b.pool, "p1-team", 1, utc(2026, 9, 20, 18), 4).await;
    let september = b.json("/v1/tenants/p1-team/invoices/2026-09").await;
    let waiver = lines_of(&september, "grace_waiver");
    assert_eq!(waiver.len(), 1, "{september}");
    assert_eq!(dec(&waiver[0]["amount"]), Decimal::new(-200, 2));
    assert_eq!(dec(&september["waived"]), Decimal::new(-200, 2));
    assert_eq!(
        dec(&september["total"]),
        Decimal::new(700 - 200, 2) + dec(&september["overhead"]),
        "the overhead share is outside the budget and invoiced: {september}"
    );

    // October: $8 in grace (3 above budget, waived), then $2 after it
    // (invoiced in full, though above budget).
    usage(&b.pool, "p1-team", 1, utc(2026, 10, 5, 18), 8).await;
    usage(&b.pool, "p1-team", 1, utc(2026, 10, 20, 18), 2).await;
    let bill = b
        .json("/v1/tenants/p1-team/shadow-bill?period=2026-10")
        .await;
    assert_eq!(bill["grace"]["since"], "2026-09-16", "{}", bill["grace"]);
    assert_eq!(bill["grace"]["last_day"], "2026-10-15");
    assert_eq!(bill["grace"]["this_month"], true);
    assert_eq!(dec(&bill["grace"]["waived"]), Decimal::new(300, 2));
    assert_eq!(dec(&bill["budget"]["spent"]), Decimal::new(1000, 2));
    assert_eq!(bill["budget"]["level"], "exceeded");
    let october = &bill["month_to_date"];
    assert_eq!(dec(&october["waived"]), Decimal::new(-300, 2), "{october}");

    // November is past the grace period: over budget, all invoiced.
    usage(&b.pool, "p1-team", 1, utc(2026, 11, 10, 18), 9).await;
    let november = b
        .json("/v1/tenants/p1-team/shadow-bill?period=2026-11")
        .await;
    assert_eq!(november["grace"]["this_month"], false);
    assert!(lines_of(&november["month_to_date"], "grace_waiver").is_empty());
    assert_eq!(november["budget"]["level"], "exceeded");

    // A tenant without chargeback_since has no grace period at all.
    usage(&b.pool, "p5-team", 1, utc(2026, 10, 5, 18), 8).await;
    let (status, _) = b.put_budget("p5-team", "2026-10", "5.00".into()).await;
    assert_eq!(status, 200);
    let p5 = b
        .json("/v1/tenants/p5-team/shadow-bill?period=2026-10")
        .await;
    assert!(p5["grace"].is_null(), "{}", p5["grace"]);
    assert!(lines_of(&p5["month_to_date"], "grace_waiver").is_empty());

    // Finalized, October keeps its waiver and its budget no longer changes.
    let finalized = b
        .post("/v1/tenants/p1-team/invoices/2026-10/finalize")
        .await;
    assert_eq!(dec(&finalized["waived"]), Decimal::new(-300, 2));
    let (status, body) = b.put_budget("p1-team", "2026-10", "50.00".into()).await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("finalized"), "{body}");

    // Late October usage: an hour in grace (above budget: waived too) and
    // an hour after it (billed). November adjusts October by $1.00, not $2.
    usage(&b.pool, "p1-team", 1, utc(2026, 10, 6, 18), 1).await;
    usage(&b.pool, "p1-team", 1, utc(2026, 10, 25, 18), 1).await;
    let november = b.json("/v1/tenants/p1-team/invoices/2026-11").await;
    let adj = lines_of(&november, "adjustment");
    assert_eq!(adj.len(), 1, "{november}");
    assert_eq!(adj[0]["adjusts"], "2026-10");
    assert_eq!(dec(&adj[0]["amount"]), Decimal::new(100, 2));
}

#[tokio::test]
async fn a_dedicated_pool_is_billed_to_its_owner_once_and_lent_hours_to_the_borrower() {
    let b = start().await;
    let hour = utc(2026, 9, 10, 18);
    let legacy = utc(2026, 9, 11, 18);
    // The owner (priority 3: $2.00 per GPU-hour) ran 6 GPU-hours at P1 on
    // its dedicated replicas; api-co borrowed them for 4 GPU-hours, as the
    // replicas reported (v2: 10 busy, of them 4 lent, and 30 idle), though
    // its requests that *ended* there ran only 3 GPU-hours (one of its
    // requests was preempted there after an hour and finished elsewhere).
    usage(&b.pool, "p1-team", 1, hour, 6).await;
    usage(&b.pool, "api-co", 3, hour, 4).await;
    // An hour reported by a v1 reporter (which does not say what it lent):
    // api-co ran 2 GPU-hours there, which its events say.
    usage(&b.pool, "api-co", 3, legacy, 2).await;
    sqlx::query(
        "INSERT INTO dedicated_capacity_hourly (owner_id, model, hour, busy_gpu_seconds,
             idle_gpu_seconds, lent_gpu_seconds, reports_without_lent)
         VALUES ('p1-team', 'llama-3.1-70b', $1, 36000, 108000, 14400, 0),
                ('p1-team', 'llama-3.1-70b', $2, 7200, 0, 0, 1)",
    )
    .bind(hour)
    .bind(legacy)
    .execute(&b.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO dedicated_usage_hourly (owner_id, tenant_id, model, priority, hour, requests,
             prompt_tokens, cached_tokens, completion_tokens, gpu_seconds)
         VALUES ('p1-team', 'p1-team', 'llama-3.1-70b', 1, $1, 1, 1000, 200, 500, 21600),
                ('p1-team', 'api-co', 'llama-3.1-70b', 3, $1, 1, 1000, 200, 500, 10800),
                ('p1-team', 'api-co', 'llama-3.1-70b', 3, $2, 1, 1000, 200, 500, 7200)",
    )
    .bind(hour)
    .bind(legacy)
    .execute(&b.pool)
    .await
    .unwrap();

    let owner = b.json("/v1/tenants/p1-team/invoices/2026-09").await;
    let amounts = |kind: &str| -> Vec<Decimal> {
        lines_of(&owner, kind)
            .iter()
            .map(|l| dec(&l["amount"]))
            .collect()
    };
    // Its usage is shown as always …
    assert_eq!(amounts("usage"), vec![Decimal::new(600, 2)]);
    assert_eq!(dec(&owner["subtotal"]), Decimal::new(600, 2));
    // … the reservation is 42 GPU-hours whether used or not …
    let reserved = lines_of(&owner, "reserved");
    assert_eq!(reserved.len(), 1);
    assert_eq!(dec(&reserved[0]["quantity"]), Decimal::from(42));
    assert_eq!(dec(&reserved[0]["amount"]), Decimal::new(8_400, 2));
    // … less its own usage there (not charged twice) and the borrowed
    // hours: 4 as the v2 replicas counted them (not the 3 the events that
    // ended there carry) and 2 of the v1 hour, from its events.
    assert_eq!(
        amounts("credit"),
        vec![Decimal::new(-600, 2), Decimal::new(-1_200, 2)]
    );
    assert_eq!(dec(&owner["reserved"]), Decimal::new(6_600, 2));
    let sum: Decimal = owner["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| dec(&l["amount"]))
        .sum();
    assert_eq!(dec(&owner["total"]), sum);
    assert_eq!(
        dec(&owner["total"]) - dec(&owner["overhead"]),
        Decimal::new(7_200, 2),
        "6 used + 84 reserved - 6 covered - 12 lent"
    );
    // The borrower pays for its usage as usual, and nothing reserved.
    let borrower = b.json("/v1/tenants/api-co/invoices/2026-09").await;
    assert!(lines_of(&borrower, "reserved").is_empty());
    assert!(lines_of(&borrower, "credit").is_empty());
    assert!(borrower.get("reserved").is_none_or(|r| dec(r).is_zero()));
    assert!(!lines_of(&borrower, "usage").is_empty());
}

#[tokio::test]
async fn a_late_replica_report_and_late_usage_on_a_dedicated_pool_adjust_its_owner_once() {
    let b = start().await;
    let hour = utc(2026, 9, 10, 18);
    // September: the owner (priority 3: $2.00 per GPU-hour) ran 6 GPU-hours
    // at P1 ($1.00) on its 40 reported dedicated GPU-hours.
    usage(&b.pool, "p1-team", 1, hour, 6).await;
    dedicated(&b.pool, hour, 6, 40).await;
    let september = b
        .post("/v1/tenants/p1-team/invoices/2026-09/finalize")
        .await;
    assert_eq!(
        dec(&september["reserved"]),
        Decimal::new(7_400, 2),
        "80 - 6"
    );

    // After it was finalized: a replica report for another September hour
    // (4 idle GPU-hours on the dedicated replicas: $8.00 more reserved), and
    // 2 GPU-hours more of the owner's own usage there ($2.00 of usage,
    // covered by the reservation: nothing more to pay for it).
    let later = utc(2026, 9, 11, 18);
    dedicated(&b.pool, later, 0, 4).await;
    usage(&b.pool, "p1-team", 1, later, 2).await;
    dedicated(&b.pool, later, 2, 0).await;

    let october = b.json("/v1/tenants/p1-team/invoices/2026-10").await;
    let adj = lines_of(&october, "adjustment");
    assert_eq!(adj.len(), 1, "{october}");
    assert_eq!(adj[0]["adjusts"], "2026-09");
    assert_eq!(
        dec(&adj[0]["amount"]),
        Decimal::new(800, 2),
        "the late report's 4 reserved GPU-hours, and not the covered usage"
    );
    assert_eq!(
        b.json("/v1/tenants/p1-team/invoices/2026-09").await,
        september,
        "a finalized invoice never changes"
    );
    // Once October carries it, November owes nothing more for September.
    b.post("/v1/tenants/p1-team/invoices/2026-10/finalize")
        .await;
    let november = b.json("/v1/tenants/p1-team/invoices/2026-11").await;
    assert!(lines_of(&november, "adjustment").is_empty(), "{november}");
}

/// What ingest adds for an owner's dedicated replicas in an hour: its own
/// usage there (`own_gpu_hours`, as dedicated_usage_hourly) and the
/// replicas' reported GPU-hours (`reported_gpu_hours`, as idle).
async fn dedicated(
    pool: &PgPool,
    hour: DateTime<Utc>,
    own_gpu_hours: i64,
    reported_gpu_hours: i64,
) {
    if own_gpu_hours > 0 {
        sqlx::query(
            "INSERT INTO dedicated_usage_hourly (owner_id, tenant_id, model, priority, hour, requests,
                 prompt_tokens, cached_tokens, completion_tokens, gpu_seconds)
             VALUES ('p1-team', 'p1-team', 'llama-3.1-70b', 1, $1, 1, 1000, 200, 500, $2)
             ON CONFLICT (owner_id, tenant_id, model, priority, hour) DO UPDATE SET
                 gpu_seconds = dedicated_usage_hourly.gpu_seconds + EXCLUDED.gpu_seconds",
        )
        .bind(hour)
        .bind(Decimal::from(own_gpu_hours * 3600))
        .execute(pool)
        .await
        .unwrap();
    }
    if reported_gpu_hours > 0 {
        sqlx::query(
            "INSERT INTO dedicated_capacity_hourly (owner_id, model, hour, busy_gpu_seconds, idle_gpu_seconds)
             VALUES ('p1-team', 'llama-3.1-70b', $1, 0, $2)
             ON CONFLICT (owner_id, model, hour) DO UPDATE SET
                 idle_gpu_seconds = dedicated_capacity_hourly.idle_gpu_seconds + EXCLUDED.idle_gpu_seconds",
        )
        .bind(hour)
        .bind(Decimal::from(reported_gpu_hours * 3600))
        .execute(pool)
        .await
        .unwrap();
    }
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
            Method::PUT,
            "/v1/tenants/p1-team/budgets/2026-12".into(),
            200,
            403,
            403,
        ),
        (
            Method::PUT,
            "/v1/tenants/p5-team/budgets/2026-12".into(),
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

/// Finalize reads everything on the transaction that holds its lock: the
/// five reference tenants (seeded by billing-api from config/tenants.yaml),
/// each finalized 12 times at once — 60 concurrent finalizations on a pool
/// of 8 — give one invoice per tenant, numbered 1 to 5 without gaps, and
/// every call answers that same invoice.
#[tokio::test]
async fn finalizing_every_reference_tenant_concurrently_gives_one_invoice_each() {
    let db = fresh_database("billing_concurrent").await;
    let tenants_file = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/tenants.yaml");
    let api = tests::billing::start_billing_api_with(
        &db.url,
        FINANCE,
        &[("BILLING_TENANTS_FILE", tenants_file.to_owned())],
    )
    .await;
    let ids = [
        "acme-corp",
        "medai-labs",
        "finserv-team",
        "research-squad",
        "codegen-platform",
    ];
    for (i, t) in ids.iter().enumerate() {
        usage(
            &db.pool,
            t,
            3,
            utc(2026, 10, 10 + i as u32, 12),
            2 + i as i64,
        )
        .await;
    }
    let client = Client::new();
    let mut calls = Vec::new();
    for round in 0..12 {
        for t in ids {
            let (client, url) = (client.clone(), api.url.clone());
            calls.push(tokio::spawn(async move {
                let res = client
                    .post(format!("{url}/v1/tenants/{t}/invoices/2026-10/finalize"))
                    .bearer_auth(FINANCE)
                    .send()
                    .await
                    .unwrap();
                let status = res.status();
                let body = res.text().await.unwrap();
                assert_eq!(status, 200, "{t} round {round}: {body}");
                let v: Value = serde_json::from_str(&body).unwrap();
                (
                    t,
                    v["number"].as_i64().unwrap(),
                    v["content_hash"].as_str().unwrap().to_owned(),
                )
            }));
        }
    }
    let mut seen: std::collections::HashMap<&str, (i64, String)> = Default::default();
    for c in calls {
        let (t, number, hash) = c.await.unwrap();
        let first = seen.entry(t).or_insert((number, hash.clone()));
        assert_eq!(
            *first,
            (number, hash),
            "{t} answered two different invoices"
        );
    }
    let mut numbers: Vec<i64> = seen.values().map(|(n, _)| *n).collect();
    numbers.sort();
    assert_eq!(numbers, vec![1, 2, 3, 4, 5]);
    let (stored,): (i64,) = sqlx::query_as("SELECT count(*) FROM invoices")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(stored, 5);
    drop(api);
}

/// billing-api owns tenants: a tenants file with a bad time zone is refused
/// at start-up, naming the tenant and the field, and nothing is written.
#[tokio::test]
async fn a_bad_time_zone_in_the_tenants_file_is_refused_naming_the_field() {
    let db = fresh_database("billing_bad_zone").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenants.yaml");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/tenants.yaml"
    ))
    .unwrap()
    .replacen("timeZone: Europe/Berlin", "timeZone: Europe/Atlantis", 1);
    std::fs::write(&path, text).unwrap();
    let out =
        tokio::process::Command::new(devstack::process::workspace_bin("billing-api").unwrap())
            .env("DATABASE_URL", &db.url)
            .env("BILLING_ADDR", "127.0.0.1:0")
            .env("BILLING_TENANTS_FILE", &path)
            .output()
            .await
            .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started with a bad zone: {err}");
    for needle in ["medai-labs", "timeZone", "Europe/Atlantis"] {
        assert!(err.contains(needle), "{needle} not in: {err}");
    }
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM tenants")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(n, 0, "nothing is written when one tenant is bad");
}

/// What a token-administration call answered: the status and the JSON body.
async fn token_call(
    client: &Client,
    url: &str,
    method: Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = client
        .request(method, format!("{url}{path}"))
        .bearer_auth(token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// Stops billing-api (SIGTERM) and starts it again on the same database
/// and port with `BILLING_BOOTSTRAP_FINANCE_TOKEN` set to `bootstrap`.
async fn restart_billing_api(api: &mut tests::billing::BillingApi, bootstrap: &str) {
    api.service.terminate(Duration::from_secs(10)).await;
    api.service
        .restart_with(&[("BILLING_BOOTSTRAP_FINANCE_TOKEN", bootstrap)])
        .unwrap_or_else(|e| panic!("{e}"));
    tests::process::wait_healthy(
        &format!("{}/healthz", api.url),
        &mut api.service,
        Duration::from_secs(60),
    )
    .await;
}

/// The start-up finance token is judged by its hash across restarts: once
/// revoked it stays revoked, and a new value of the setting is a new token
/// beside it (registered once however often billing-api starts). The last
/// live finance token is never revoked — the refusal names the way back,
/// `billing-api token issue`, which works on the database alone — and two
/// finance tokens revoking each other at once leave exactly one.
#[tokio::test]
async fn a_revoked_bootstrap_token_stays_revoked_and_the_last_finance_token_is_kept() {
    const REPLACEMENT: &str = "finance-token-replacing-the-leaked-one";
    let db = fresh_database("billing_bootstrap").await;
    let mut api = tests::billing::start_billing_api(&db.url, FINANCE).await;
    let client = Client::new();
    let url = api.url.clone();
    let revoke = |id: &str| format!("/v1/tokens/{id}/revoke");
    let live_finance = || async {
        let (ids,): (Vec<String>,) = sqlx::query_as(
            "SELECT coalesce(array_agg(token_id ORDER BY token_id), '{}') FROM billing_tokens
             WHERE role = 'finance' AND revoked_at IS NULL",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        ids
    };

    // The only finance token may not revoke itself; the refusal says how
    // to get another.
    let (status, body) = token_call(
        &client,
        &url,
        Method::POST,
        &revoke("bootstrap-finance"),
        FINANCE,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "conflict");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("billing-api token issue"), "{message}");
    assert_eq!(live_finance().await, ["bootstrap-finance"]);

    // The way back: the CLI issues a finance token on the database alone.
    let out = tokio::process::Command::new(tests::process::bin_dir().join("billing-api"))
        .args(["token", "issue", "--role", "finance", "--label", "recovery"])
        .env("DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let issued: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (second_id, second) = (
        issued["token_id"].as_str().unwrap().to_owned(),
        issued["token"].as_str().unwrap().to_owned(),
    );

    // With it, the bootstrap token (leaked, say) is revoked ...
    let (status, body) = token_call(
        &client,
        &url,
        Method::POST,
        &revoke("bootstrap-finance"),
        &second,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = token_call(&client, &url, Method::GET, "/v1/tokens", FINANCE, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // ... and stays revoked when billing-api starts again with the setting
    // unchanged.
    restart_billing_api(&mut api, FINANCE).await;
    let (status, _) = token_call(&client, &url, Method::GET, "/v1/tokens", FINANCE, None).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a revoked bootstrap token came back"
    );
    assert_eq!(live_finance().await, [second_id.as_str()]);
    // The second token is now the last one: kept, across the restart too.
    let (status, body) = token_call(
        &client,
        &url,
        Method::POST,
        &revoke(&second_id),
        &second,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // A new value of the setting is a new token beside the revoked one,
    // registered once however often billing-api starts.
    restart_billing_api(&mut api, REPLACEMENT).await;
    restart_billing_api(&mut api, REPLACEMENT).await;
    let (status, tokens) =
        token_call(&client, &url, Method::GET, "/v1/tokens", REPLACEMENT, None).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    let bootstraps: Vec<&Value> = tokens
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| {
            t["token_id"]
                .as_str()
                .unwrap()
                .starts_with("bootstrap-finance")
        })
        .collect();
    assert_eq!(bootstraps.len(), 2, "{tokens}");
    let old = bootstraps
        .iter()
        .find(|t| t["token_id"] == "bootstrap-finance")
        .unwrap();
    assert!(!old["revoked_at"].is_null(), "{tokens}");
    let (status, _) = token_call(&client, &url, Method::GET, "/v1/tokens", FINANCE, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Two finance tokens revoking each other at once: one of them stays
    // (the replacement is revoked first, so there are just the two).
    let replacement = bootstraps
        .iter()
        .find(|t| t["token_id"] != "bootstrap-finance")
        .unwrap()["token_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = token_call(
        &client,
        &url,
        Method::POST,
        &revoke(&replacement),
        &second,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut survivor = (second_id, second);
    for round in 0..5 {
        let (status, issued) = token_call(
            &client,
            &url,
            Method::POST,
            "/v1/tokens",
            &survivor.1,
            Some(serde_json::json!({"role": "finance", "label": format!("round {round}")})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{issued}");
        let other = (
            issued["token_id"].as_str().unwrap().to_owned(),
            issued["token"].as_str().unwrap().to_owned(),
        );
        let (revoke_other, revoke_survivor) = (revoke(&other.0), revoke(&survivor.0));
        let (a, b) = tokio::join!(
            token_call(
                &client,
                &url,
                Method::POST,
                &revoke_other,
                &survivor.1,
                None
            ),
            token_call(
                &client,
                &url,
                Method::POST,
                &revoke_survivor,
                &other.1,
                None
            ),
        );
        let live = live_finance().await;
        assert_eq!(
            live.len(),
            1,
            "round {round}: {:?} and {:?} left {live:?}",
            a.0,
            b.0
        );
        survivor = if live[0] == survivor.0 {
            survivor
        } else {
            other
        };
    }
    drop(api);
}

/// A start-up finance token that is already another role's token stops
/// billing-api, naming the setting, rather than turning it into finance.
#[tokio::test]
async fn a_bootstrap_token_of_another_role_stops_the_start_naming_the_setting() {
    let db = fresh_database("billing_bootstrap_role").await;
    sqlx::query(
        "INSERT INTO billing_tokens (token_id, token_hash, role, tenant_id)
         VALUES ('support', sha256($1::bytea), 'support', NULL)",
    )
    .bind(SUPPORT.as_bytes())
    .execute(&db.pool)
    .await
    .unwrap();
    let out =
        tokio::process::Command::new(devstack::process::workspace_bin("billing-api").unwrap())
            .env("DATABASE_URL", &db.url)
            .env("BILLING_ADDR", "127.0.0.1:0")
            .env("BILLING_BOOTSTRAP_FINANCE_TOKEN", SUPPORT)
            .output()
            .await
            .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {err}");
    for needle in ["BILLING_BOOTSTRAP_FINANCE_TOKEN", "support"] {
        assert!(err.contains(needle), "{needle} not in: {err}");
    }
    let (role,): (String,) =
        sqlx::query_as("SELECT role FROM billing_tokens WHERE token_id = 'support'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(role, "support");
}
