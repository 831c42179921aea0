//! The FOCUS export, CSV and Parquet, against the FinOps Foundation's own
//! validator: `focus-validator` 2.2.1 from PyPI, which ships the rules of
//! FOCUS 1.2 (its `model-1.2.0.1.json`). `scripts/ensure-tools.sh` installs
//! it into `~/.cache/meterline/focus-validator-2.2.1` (a venv: it needs
//! Python >= 3.12). The test fails, never skips, when it is missing.
//!
//! The data has what makes FOCUS rows differ: per-token and per-GPU-second
//! tenants in four time zones (so their billing periods have different UTC
//! edges), off-peak discounts (Credit rows), the overhead pool, a shadow
//! tenant (BilledCost 0), a finalized month and usage that arrived after it
//! (an Adjustment row with ChargeClass "Correction" on the next invoice).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use arrow_array::{Array, RecordBatch};
use chrono::{DateTime, TimeZone, Utc};
use reqwest::{Client, Method, StatusCode};
use rust_decimal::Decimal;
use sqlx::PgPool;
use tests::stack::fresh_database;
use tests::Service;

const FINANCE: &str = "finance-token-for-focus-tests";

/// The validator release the suite pins, and the FOCUS version whose rules it ships.
const VALIDATOR_VERSION: &str = "2.2.1";
const FOCUS_VERSION: &str = "1.2";

/// What Meterline supports, in the validator's words: the rules that apply
/// only to providers that support these are checked too. (Validator 2.2.1
/// applies a rule when any one of its criteria is given, where the
/// specification means all of them: with a published price list it also
/// asks for the PricingCurrency* columns, which the export carries.)
const APPLICABILITY: &str = "ACCOUNT_NAMING_SUPPORTED,PUBLIC_PRICE_LIST_SUPPORTED,\
SUB_ACCOUNT_SUPPORTED,UNIT_PRICING_SUPPORTED,USAGE_MEASUREMENT_SUPPORTED";

struct Billing {
    _svc: Service,
    /// Dropped after the service that uses it.
    _db: devstack::Database,
    url: String,
    pool: PgPool,
    client: Client,
    dir: tempfile::TempDir,
}

impl Billing {
    async fn get(&self, path: &str) -> Vec<u8> {
        self.call(Method::GET, path).await
    }

    async fn post(&self, path: &str) -> Vec<u8> {
        self.call(Method::POST, path).await
    }

    async fn call(&self, method: Method, path: &str) -> Vec<u8> {
        let res = self
            .client
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(FINANCE)
            .send()
            .await
            .unwrap();
        let status = res.status();
        let body = res.bytes().await.unwrap().to_vec();
        assert_eq!(
            status,
            StatusCode::OK,
            "{path}: {}",
            String::from_utf8_lossy(&body)
        );
        body
    }
}

async fn start() -> Billing {
    let fresh_db = fresh_database("focus").await;
    let (url, pool) = (fresh_db.url.clone(), fresh_db.pool.clone());
    for (tenant, name, mode, shadow, tz) in [
        ("acme-corp", "Acme Corp", "per_token", false, "UTC"),
        ("tokyo-lab", "Tokyo Lab", "per_token", false, "Asia/Tokyo"),
        (
            "p1-team",
            "P1 Team",
            "per_gpu_second",
            false,
            "America/New_York",
        ),
        (
            "berlin-ml",
            "Berlin ML",
            "per_gpu_second",
            false,
            "Europe/Berlin",
        ),
        (
            "night-team",
            "Night Team",
            "per_gpu_second",
            true,
            "America/Los_Angeles",
        ),
    ] {
        sqlx::query(
            "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode, shadow, time_zone)
             VALUES ($1, $2, 'standard', 3, $3, $4, $5)",
        )
        .bind(tenant)
        .bind(name)
        .bind(mode)
        .bind(shadow)
        .bind(tz)
        .execute(&pool)
        .await
        .unwrap();
    }
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
        // The validator runs for many seconds between two requests: keep
        // idle connections for less than the server's 30 s keep-alive
        // (`HTTP_HEADER_READ_TIMEOUT_SECS`), as a client should, or a
        // request can go out on a connection the server is just closing.
        client: Client::builder()
            .pool_idle_timeout(std::time::Duration::from_secs(20))
            .build()
            .unwrap(),
        dir,
    }
}

/// One usage_hourly row, as ingest would have left it: tokens for the
/// per-token tenants, GPU-seconds (exact to the microsecond) for the rest
/// and for the overhead split.
async fn usage(
    pool: &PgPool,
    tenant: &str,
    model: &str,
    priority: i16,
    hour: DateTime<Utc>,
    tokens: (i64, i64, i64),
    gpu_seconds: Decimal,
) {
    let (prompt, cached, completion) = tokens;
    sqlx::query(
        "INSERT INTO usage_hourly (tenant_id, model, priority, hour, requests, prompt_tokens,
             cached_tokens, completion_tokens, gpu_seconds)
         VALUES ($1, $2, $3, $4, 1, $5, $6, $7, $8)
         ON CONFLICT (tenant_id, model, priority, hour) DO UPDATE SET
             requests = usage_hourly.requests + 1,
             prompt_tokens = usage_hourly.prompt_tokens + EXCLUDED.prompt_tokens,
             cached_tokens = usage_hourly.cached_tokens + EXCLUDED.cached_tokens,
             completion_tokens = usage_hourly.completion_tokens + EXCLUDED.completion_tokens,
             gpu_seconds = usage_hourly.gpu_seconds + EXCLUDED.gpu_seconds",
    )
    .bind(tenant)
    .bind(model)
    .bind(priority)
    .bind(hour)
    .bind(prompt)
    .bind(cached)
    .bind(completion)
    .bind(gpu_seconds)
    .execute(pool)
    .await
    .unwrap();
}

fn utc(y: i32, m: u32, d: u32, h: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, m, d, h, 0, 0).unwrap()
}

/// A month of traffic: peak (18:00 UTC is 14:00 in New York) and off-peak
/// (03:00 UTC is 23:00 in New York, the book's zone) for every tenant, one
/// hour on the last evening of the month (already the next month in Tokyo
/// and Berlin), odd token counts and microsecond GPU-seconds.
async fn month_of_traffic(pool: &PgPool, y: i32, m: u32, last_day: u32) {
    let secs = |micros: i64| Decimal::new(micros, 6);
    for (tenant, model, priority) in [
        ("acme-corp", "llama-3.1-8b", 2),
        ("acme-corp", "frontier-405b", 4),
        ("tokyo-lab", "llama-3.1-70b", 3),
        ("p1-team", "llama-3.1-70b", 1),
        ("berlin-ml", "frontier-405b", 5),
        ("night-team", "llama-3.1-8b", 3),
    ] {
        usage(
            pool,
            tenant,
            model,
            priority,
            utc(y, m, 10, 18),
            (1_234_567, 200_003, 345_679),
            secs(12_345_678_901),
        )
        .await;
        usage(
            pool,
            tenant,
            model,
            priority,
            utc(y, m, 11, 3),
            (987_651, 13, 77_777),
            secs(3_600_000_001),
        )
        .await;
        usage(
            pool,
            tenant,
            model,
            priority,
            utc(y, m, last_day, 23),
            (5_001, 0, 999),
            secs(17_000_003),
        )
        .await;
    }
}

/// The installed validator: its entry point, its package directory, and
/// for each rule the OR rules it is one alternative of.
struct Validator {
    exe: PathBuf,
    package: PathBuf,
    alternative_of: HashMap<String, Vec<String>>,
}

impl Validator {
    fn find() -> Self {
        let venv = std::env::var_os("FOCUS_VALIDATOR_VENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let cache = std::env::var_os("METERLINE_CACHE")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| {
                        PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                            .join(".cache/meterline")
                    });
                cache.join(format!("focus-validator-{VALIDATOR_VERSION}"))
            });
        let exe = venv.join("bin/focus-validator");
        assert!(
            exe.exists(),
            "focus-validator {VALIDATOR_VERSION} is not installed at {}: run scripts/ensure-tools.sh",
            exe.display()
        );
        let out = std::process::Command::new(venv.join("bin/python"))
            .args([
                "-c",
                "import importlib.metadata as m, os, focus_validator as f; \
                 print(m.version('focus-validator')); print(os.path.dirname(f.__file__))",
            ])
            .output()
            .expect("run the validator's python");
        assert!(
            out.status.success(),
            "the validator's venv is broken: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(VALIDATOR_VERSION), "validator version");
        let package = PathBuf::from(lines.next().expect("package dir"));
        let model = Self::rules(&package).join(format!("model-{FOCUS_VERSION}.0.1.json"));
        let model: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&model).unwrap_or_else(|e| {
                panic!(
                    "the validator ships no FOCUS {FOCUS_VERSION} rules at {}: {e}",
                    model.display()
                )
            }))
            .unwrap();
        assert_eq!(model["Details"]["FOCUSVersion"], FOCUS_VERSION);
        let mut alternative_of: HashMap<String, Vec<String>> = HashMap::new();
        for (id, rule) in model["ModelRules"].as_object().unwrap() {
            let requirement = &rule["ValidationCriteria"]["Requirement"];
            if requirement["CheckFunction"] != "OR" {
                continue;
            }
            for item in requirement["Items"].as_array().into_iter().flatten() {
                if let Some(child) = item["ModelRuleId"].as_str() {
                    alternative_of
                        .entry(child.to_owned())
                        .or_default()
                        .push(id.clone());
                }
            }
        }
        Self {
            exe,
            package,
            alternative_of,
        }
    }

    fn rules(package: &Path) -> PathBuf {
        package.join("rules")
    }

    /// Runs the validator on one file with the FOCUS 1.2 rules it ships,
    /// never downloading any; the failed rules and its report when any fails.
    ///
    /// The validator reports each alternative of an OR rule on its own
    /// (InvoiceId "MUST be null when …" and "MUST NOT be null when …" are
    /// both checked on every row); an alternative that failed where its OR
    /// rule passed is not a failure.
    fn check(&self, data: &Path) -> Result<(), String> {
        let out = std::process::Command::new(&self.exe)
            .arg("--data-file")
            .arg(data)
            .args(["--validate-version", FOCUS_VERSION, "--block-download"])
            .arg("--rule-set-path")
            .arg(Self::rules(&self.package))
            .args([
                "--applicability-criteria",
                APPLICABILITY,
                "--show-violations",
            ])
            // It reads its currency list by a path relative to the working directory.
            .current_dir(self.package.parent().expect("site-packages"))
            .env("PYTHONIOENCODING", "utf-8")
            .output()
            .expect("run focus-validator");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let report = format!(
            "focus-validator on {}:\n{stdout}\n{}",
            data.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            return Err(format!(
                "the validator exited with {}\n{report}",
                out.status
            ));
        }
        // "✅ BilledCost-C-001-M: PASS  (…)"
        let status: HashMap<&str, &str> = stdout
            .lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace().skip(1);
                let rule = words.next()?.strip_suffix(':')?;
                let verdict = words.next()?;
                ["PASS", "FAIL", "SKIPPED"]
                    .contains(&verdict)
                    .then_some((rule, verdict))
            })
            .collect();
        let passed = status.values().filter(|v| **v == "PASS").count();
        let or_passed = |rule: &str| {
            self.alternative_of.get(rule).is_some_and(|ors| {
                ors.iter()
                    .any(|or| status.get(or.as_str()) == Some(&"PASS"))
            })
        };
        let mut alternatives: Vec<&str> = status
            .iter()
            .filter(|(rule, verdict)| **verdict == "FAIL" && or_passed(rule))
            .map(|(rule, _)| *rule)
            .collect();
        alternatives.sort_unstable();
        let failed: Vec<&str> = stdout
            .lines()
            .filter(|l| {
                let mut words = l.split_whitespace().skip(1);
                match (words.next().and_then(|w| w.strip_suffix(':')), words.next()) {
                    (Some(rule), Some("FAIL")) => !or_passed(rule),
                    _ => false,
                }
            })
            .collect();
        if passed > 0 && failed.is_empty() {
            println!(
                "{}: {passed} rules passed, none failed \
                 (failed alternatives of a passed OR rule: {alternatives:?})",
                data.display()
            );
            Ok(())
        } else {
            Err(format!(
                "{} FOCUS {FOCUS_VERSION} rule(s) failed on {} ({passed} passed):\n{}\n\n{report}",
                failed.len(),
                data.display(),
                failed.join("\n")
            ))
        }
    }
}

/// Per column, which rows are null: in the CSV an empty field, in Parquet a null.
type Nulls = HashMap<String, Vec<bool>>;

fn csv_nulls(csv: &[u8]) -> Nulls {
    let mut reader = csv::Reader::from_reader(csv);
    let headers: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    let mut nulls: Nulls = headers.iter().map(|h| (h.clone(), Vec::new())).collect();
    for record in reader.records() {
        let record = record.unwrap();
        for (h, v) in headers.iter().zip(record.iter()) {
            nulls.get_mut(h).unwrap().push(v.is_empty());
        }
    }
    nulls
}

fn parquet_nulls(parquet: &[u8]) -> Nulls {
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(
        bytes::Bytes::copy_from_slice(parquet),
        1024,
    )
    .unwrap();
    let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
    let mut nulls = Nulls::new();
    for batch in &batches {
        for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
            let entry = nulls.entry(field.name().clone()).or_default();
            entry.extend((0..column.len()).map(|i| column.is_null(i)));
        }
    }
    nulls
}

#[tokio::test]
async fn focus_exports_pass_the_focus_validator() {
    let validator = Validator::find();
    let b = start().await;
    month_of_traffic(&b.pool, 2026, 9, 30).await;
    month_of_traffic(&b.pool, 2026, 10, 31).await;
    // September finalized for two tenants, then usage for September arrives
    // late: October's invoices carry it as adjustments.
    for tenant in ["p1-team", "acme-corp"] {
        b.post(&format!("/v1/tenants/{tenant}/invoices/2026-09/finalize"))
            .await;
    }
    usage(
        &b.pool,
        "p1-team",
        "llama-3.1-70b",
        1,
        utc(2026, 9, 20, 18),
        (0, 0, 0),
        Decimal::new(7_200_000_001, 6),
    )
    .await;
    usage(
        &b.pool,
        "acme-corp",
        "llama-3.1-8b",
        2,
        utc(2026, 9, 20, 18),
        (100_001, 0, 20_002),
        Decimal::ONE,
    )
    .await;
    let october = b.get("/v1/tenants/p1-team/invoices/2026-10").await;
    assert!(
        String::from_utf8_lossy(&october).contains("\"adjustment\""),
        "October carries September's late usage: {}",
        String::from_utf8_lossy(&october)
    );

    let mut problems = Vec::new();
    for period in ["2026-09", "2026-10"] {
        let csv = b.get(&format!("/v1/exports/focus?period={period}")).await;
        let parquet = b
            .get(&format!("/v1/exports/focus?period={period}&format=parquet"))
            .await;
        let (csv_path, parquet_path) = (
            b.dir.path().join(format!("focus-{period}.csv")),
            b.dir.path().join(format!("focus-{period}.parquet")),
        );
        std::fs::write(&csv_path, &csv).unwrap();
        std::fs::write(&parquet_path, &parquet).unwrap();

        // The same rows in both, null in the same places.
        let (from_csv, from_parquet) = (csv_nulls(&csv), parquet_nulls(&parquet));
        let mut columns: Vec<&String> = from_csv.keys().collect();
        columns.sort();
        let mut parquet_columns: Vec<&String> = from_parquet.keys().collect();
        parquet_columns.sort();
        assert_eq!(columns, parquet_columns, "{period}: the same columns");
        for c in columns {
            if from_csv[c] != from_parquet[c] {
                problems.push(format!(
                    "{period}: {c} is null in different rows of the CSV and the Parquet file"
                ));
            }
        }
        for path in [&csv_path, &parquet_path] {
            if let Err(e) = validator.check(path) {
                problems.push(e);
            }
        }
    }
    if !problems.is_empty() {
        // Kept for a look: the exports and billing-api's log.
        let kept = b.dir.keep();
        panic!(
            "{}\n\nthe exports are kept in {}",
            problems.join("\n\n"),
            kept.display()
        );
    }
}
