//! billing-api against its own OpenAPI document, by schemathesis: the
//! service runs as a process on a fresh database seeded so that the
//! document's examples are real (a tenant with usage, a finalized invoice,
//! a request to look up), and `st run` exercises every operation as each
//! role — finance, a team lead of that tenant, support, and no token —
//! failing on any finding: a 5xx, a status or content type the document
//! does not declare, a body or header off its schema, invalid data
//! accepted, valid data refused as malformed (`positive_data_acceptance`:
//! 400, 413, 415 or 422 for a request the document calls valid), a wrong
//! method without 405 and `Allow`, auth ignored.
//!
//! `tests/schemathesis.toml` lists the exceptions, each with the rule the
//! document cannot state (`to` after `from` for usage; a YAML scalar read
//! as whatever type its field needs, for the price book's negative data).
//! schemathesis comes from `scripts/ensure-tools.sh`; without it this test
//! fails.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::path::PathBuf;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use serde_json::Value;
use sqlx::PgPool;
use tests::stack::fresh_database;

const FINANCE: &str = "finance-token-openapi-conformance";
const LEAD: &str = "lead-token-openapi-conformance-0001";
const SUPPORT: &str = "support-token-openapi-conformance-01";
/// Test cases per operation and phase (`OPENAPI_MAX_EXAMPLES` overrides);
/// the four runs take about 1.5 minutes on 2 cores (each role's time is
/// printed).
const MAX_EXAMPLES: &str = "60";

/// `st`: `$SCHEMATHESIS`, else the virtualenv ensure-tools.sh makes, else PATH.
fn schemathesis() -> PathBuf {
    if let Some(path) = std::env::var_os("SCHEMATHESIS") {
        return path.into();
    }
    let cache = std::env::var_os("METERLINE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/meterline"));
    let mut venvs: Vec<PathBuf> = std::fs::read_dir(&cache)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/st"))
        .filter(|p| {
            p.exists()
                && p.parent()
                    .and_then(|b| b.parent())
                    .and_then(|v| v.file_name())
                    .is_some_and(|n| n.to_string_lossy().starts_with("schemathesis-"))
        })
        .collect();
    venvs.sort();
    venvs.pop().unwrap_or_else(|| "st".into())
}

/// The example of a component schema of the served document.
fn example(doc: &Value, schema: &str) -> String {
    doc["components"]["schemas"][schema]["examples"][0]
        .as_str()
        .unwrap_or_else(|| panic!("{schema} has no example"))
        .to_owned()
}

async fn seed(pool: &PgPool, tenant: &str, period: &str, request_id: &str) {
    sqlx::query(
        "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode, shadow, time_zone)
         VALUES ($1, $1, 'standard', 3, 'per_token', false, 'America/New_York'),
                ('night-team', 'night-team', 'standard', 3, 'per_gpu_second', true, 'UTC')",
    )
    .bind(tenant)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO billing_tokens (token_id, token_hash, role, tenant_id) VALUES
           ('lead', sha256($1::bytea), 'team_lead', $3),
           ('support', sha256($2::bytea), 'support', NULL)",
    )
    .bind(LEAD.as_bytes())
    .bind(SUPPORT.as_bytes())
    .bind(tenant)
    .execute(pool)
    .await
    .unwrap();
    // Usage in the example month (mid-month, 15:00 UTC) and the month before.
    let (year, month): (i32, u32) = (period[..4].parse().unwrap(), period[5..].parse().unwrap());
    let at = Utc.with_ymd_and_hms(year, month, 16, 15, 0, 0).unwrap();
    for (t, hour) in [
        (tenant, at),
        (tenant, at - chrono::Duration::days(31)),
        ("night-team", at),
    ] {
        sqlx::query(
            "INSERT INTO usage_hourly (tenant_id, model, priority, hour, requests, prompt_tokens,
                 cached_tokens, completion_tokens, gpu_seconds)
             VALUES ($1, 'llama-3.1-70b', 3, $2, 4, 4000, 800, 2000, 12.5)",
        )
        .bind(t)
        .bind(hour)
        .execute(pool)
        .await
        .unwrap();
    }
    // The example request, in the example month.
    let id: usage_contract::RequestId = request_id.parse().unwrap();
    sqlx::query("SELECT ensure_request_log_partition($1)")
        .bind(id.day())
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO request_log (request_id, tenant_id, api_key_id, model, model_version, priority,
             started_at, finished_at, prompt_tokens, cached_tokens, completion_tokens, gpu_seconds,
             preempted_gpu_seconds, finish_reason, replica_id, gateway_id, stream, content_hash,
             kafka_partition, kafka_offset)
         VALUES ($1, $2, 'key_1', 'llama-3.1-70b', '3.1', 3, $3, $3 + interval '2 seconds',
             1000, 200, 500, 3.125, 0, 'stop', 'replica-a', 'gw-1', false, '\\x00', 0, 0)",
    )
    .bind(id.as_uuid())
    .bind(tenant)
    .bind(id.created_at())
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn billing_api_conforms_to_its_openapi_document_for_every_role() {
    let st = schemathesis();
    let version = std::process::Command::new(&st).arg("--version").output();
    assert!(
        version.as_ref().is_ok_and(|o| o.status.success()),
        "schemathesis ({}) is missing: run scripts/ensure-tools.sh ({version:?})",
        st.display()
    );

    let fresh_db = fresh_database("openapi").await;
    let (db_url, pool) = (fresh_db.url.clone(), fresh_db.pool.clone());
    let tests::billing::BillingApi {
        service: svc,
        url,
        dir,
    } = tests::billing::start_billing_api(&db_url, FINANCE).await;

    let client = reqwest::Client::new();
    let doc: Value = client
        .get(format!("{url}/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (tenant, period) = (example(&doc, "TenantId"), example(&doc, "Month"));
    seed(&pool, &tenant, &period, &example(&doc, "RequestId")).await;
    // A finalized invoice for the month before the example month.
    let earlier = chrono::NaiveDate::parse_from_str(&format!("{period}-01"), "%Y-%m-%d").unwrap()
        - chrono::Duration::days(1);
    let res = client
        .post(format!(
            "{url}/v1/tenants/{tenant}/invoices/{}/finalize",
            earlier.format("%Y-%m")
        ))
        .bearer_auth(FINANCE)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "{}", res.text().await.unwrap());

    let max_examples =
        std::env::var("OPENAPI_MAX_EXAMPLES").unwrap_or_else(|_| MAX_EXAMPLES.to_owned());
    let mut failures = Vec::new();
    for (role, token) in [
        ("finance", Some(FINANCE)),
        ("team lead", Some(LEAD)),
        ("support", Some(SUPPORT)),
        ("no token", None),
    ] {
        let mut cmd = tokio::process::Command::new(&st);
        cmd.current_dir(dir.path())
            .arg("--config-file")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/schemathesis.toml"))
            // Every check runs (schemathesis' default; `--checks all` would
            // override the exceptions the config file lists).
            .args(["run", &format!("{url}/openapi.json")])
            .args(["--max-examples", &max_examples])
            // One worker: schemathesis' coverage phase is not thread-safe in 4.32.
            .args(["--workers", "1"])
            .args(["--generation-database", "none", "--no-color"])
            .args(["--request-timeout", "30"])
            .env("NO_COLOR", "1");
        if let Some(token) = token {
            cmd.args(["--header", &format!("Authorization: Bearer {token}")]);
        }
        let started = std::time::Instant::now();
        let out = tokio::time::timeout(Duration::from_secs(300), cmd.output())
            .await
            .unwrap_or_else(|_| panic!("schemathesis as {role} ran over 5 minutes"))
            .unwrap();
        eprintln!(
            "schemathesis as {role}: {:.1} s",
            started.elapsed().as_secs_f64()
        );
        if !out.status.success() {
            failures.push(format!(
                "== schemathesis as {role}: {}\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n(billing-api log: {})",
        failures.join("\n"),
        svc.log_tail()
    );
}
