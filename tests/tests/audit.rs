//! The audit proves invoices from the archive, end to end on the real
//! broker, Postgres and archive: the five reference tenants' usage over
//! three ended months (contract v1 and v2 events, usage on acme-corp's
//! dedicated replicas and the replicas' reports, re-sends, a conflicting
//! version, malformed messages) goes through ingest and the archiver; the
//! first month is finalized, late usage for it arrives, the second month
//! is finalized with adjustments for it, late usage for the second
//! arrives; medai-labs is in its grace period with a budget. The
//! `audit` binary then agrees with every invoice of the three months (two
//! finalized, one a draft) to the cent — and fails, naming the invoice
//! and the line, when usage_hourly is altered, when an archived file
//! drops out of the manifest, and when a finalized invoice is edited.
//! Files written before contract v2 (without its columns) and after it
//! are scanned together.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use chrono::{DateTime, Datelike, DurationRound, Months, NaiveDate, TimeDelta, TimeZone, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rust_decimal::Decimal;
use tests::process::bin_dir;
use tests::TestStack;
use usage_contract::{FinishReason, Placement, ReplicaReport, RequestId, UsageEvent};

const FINANCE: &str = "finance-token-for-the-audit-test";
const TENANTS: [(&str, i16); 5] = [
    ("acme-corp", 5),
    ("medai-labs", 4),
    ("finserv-team", 3),
    ("research-squad", 2),
    ("codegen-platform", 1),
];

fn event(rng: &mut StdRng, started_at: DateTime<Utc>, tenant: &str, priority: i16) -> UsageEvent {
    let prompt = rng.random_range(1..200_000);
    let model = ["llama-3.1-8b", "llama-3.1-70b"][rng.random_range(0..2)];
    let first_token = started_at + TimeDelta::milliseconds(rng.random_range(20..800));
    let placement = rng.random_bool(0.6).then(|| Placement {
        pool: model.into(),
        dedicated_to: (model == "llama-3.1-70b" && rng.random_bool(0.4))
            .then(|| "acme-corp".into()),
        queue_wait_ms: rng.random_range(0..2000),
        preemptions: 0,
    });
    UsageEvent {
        schema_version: if placement.is_some() { 2 } else { 1 },
        request_id: RequestId::at(started_at),
        tenant_id: tenant.into(),
        api_key_id: format!("{tenant}-key"),
        model: model.into(),
        model_version: "2024-07".into(),
        priority,
        started_at,
        first_token_at: Some(first_token),
        finished_at: first_token + TimeDelta::milliseconds(rng.random_range(100..20_000)),
        prompt_tokens: prompt,
        cached_tokens: rng.random_range(0..=prompt / 2),
        completion_tokens: rng.random_range(1..50_000),
        gpu_seconds: Decimal::new(rng.random_range(1..3_600_000_000), 6),
        preempted_gpu_seconds: Decimal::ZERO,
        finish_reason: [FinishReason::Stop, FinishReason::Length][rng.random_range(0..2)],
        ttft_ms: Some((first_token - started_at).num_milliseconds()),
        tpot_ms: Some(rng.random_range(5..60)),
        replica_id: format!("{model}-r{}", rng.random_range(0..12)),
        gateway_id: "gw-audit".into(),
        stream: rng.random_bool(0.5),
        placement,
    }
}

/// `n` events of every tenant started uniformly in `[from, to)` (ms).
fn events(rng: &mut StdRng, n: usize, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<UsageEvent> {
    let span = (to - from).num_milliseconds();
    (0..n)
        .map(|i| {
            let (tenant, priority) = TENANTS[i % TENANTS.len()];
            let at = from + TimeDelta::milliseconds(rng.random_range(0..span));
            event(rng, at, tenant, priority)
        })
        .collect()
}

/// One report per hour of a dedicated acme-corp replica and a shared one:
/// every other hour from a v1 reporter (which does not say what it lent:
/// that hour's lent time comes from the events), the others v2.
fn reports(rng: &mut StdRng, from: DateTime<Utc>, hours: i64) -> Vec<ReplicaReport> {
    let mut out = Vec::new();
    for h in (0..hours).step_by(7) {
        let start = from + TimeDelta::hours(h);
        let v2 = (h / 7) % 2 == 0;
        for (replica, owner) in [("dedicated-r0", Some("acme-corp")), ("shared-r7", None)] {
            let busy = rng.random_range(0..7_200_000_000);
            let lent = match owner {
                Some(_) => rng.random_range(0..=busy),
                None => 0,
            };
            out.push(ReplicaReport {
                record: "replica_report".into(),
                report_version: if v2 { 2 } else { 1 },
                report_id: ReplicaReport::id_for("gw-audit", replica, start),
                replica_id: replica.into(),
                model: "llama-3.1-70b".into(),
                reporter_id: "gw-audit".into(),
                dedicated_to: owner.map(str::to_owned),
                gpus: 4,
                interval_start: start,
                interval_end: start + TimeDelta::seconds(3600),
                busy_gpu_seconds: Decimal::new(busy, 6),
                idle_gpu_seconds: Decimal::new(rng.random_range(0..7_200_000_000), 6),
                lent_gpu_seconds: v2.then(|| Decimal::new(lent, 6)),
            });
        }
    }
    out
}

/// A report of acme-corp's dedicated replica from a second reporter, for
/// an hour already invoiced: it adds reserved GPU-hours after the fact.
fn late_report(start: DateTime<Utc>) -> (String, Vec<u8>) {
    let r = ReplicaReport {
        record: "replica_report".into(),
        report_version: 2,
        report_id: ReplicaReport::id_for("gw-audit-late", "dedicated-r1", start),
        replica_id: "dedicated-r1".into(),
        model: "llama-3.1-70b".into(),
        reporter_id: "gw-audit-late".into(),
        dedicated_to: Some("acme-corp".into()),
        gpus: 4,
        interval_start: start,
        interval_end: start + TimeDelta::seconds(3600),
        busy_gpu_seconds: Decimal::ZERO,
        idle_gpu_seconds: Decimal::new(14_400, 0),
        lent_gpu_seconds: Some(Decimal::ZERO),
    };
    (r.replica_id.clone(), r.to_json())
}

fn messages(events: &[UsageEvent]) -> Vec<(String, Vec<u8>)> {
    events
        .iter()
        .map(|e| (e.tenant_id.clone(), e.to_json()))
        .collect()
}

/// The first instant of the UTC month `back` months before this one.
fn month_start(back: u32) -> DateTime<Utc> {
    let today = Utc::now().date_naive();
    let first =
        NaiveDate::from_ymd_opt(today.year(), today.month(), 1).unwrap() - Months::new(back);
    Utc.from_utc_datetime(&first.and_hms_opt(0, 0, 0).unwrap())
}

struct Audit {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Audit {
    /// The differences of a run that found some (exit 1), one per JSON line.
    fn differences(&self) -> Vec<serde_json::Value> {
        assert_eq!(self.code, Some(1), "{}\n{}", self.stdout, self.stderr);
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn audit(stack: &TestStack, archive_url: &str, month: &str) -> Audit {
    let out = std::process::Command::new(bin_dir().join("audit"))
        .args(["--month", month, "--wait-seconds", "60"])
        .env("DATABASE_URL", &stack.database_url)
        .env("ARCHIVE_URL", archive_url)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    Audit {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn finalize_all(url: &str, period: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for (t, _) in TENANTS {
        let res = reqwest::Client::new()
            .post(format!("{url}/v1/tenants/{t}/invoices/{period}/finalize"))
            .bearer_auth(FINANCE)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "finalize {t} {period}");
        out.push(res.json().await.unwrap());
    }
    out
}

fn has_line(invoice: &serde_json::Value, kind: &str) -> bool {
    invoice["lines"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l["kind"] == kind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_proves_every_invoice_from_the_archive_and_names_what_was_altered() {
    let stack = TestStack::new("audit").await;
    tests::billing::apply_tenants(&stack.database_url, tests::billing::REFERENCE_TENANTS);
    let archive_url = stack.dir.path().join("archive").display().to_string();
    let (first, second, third) = (month_start(3), month_start(2), month_start(1));
    let period = |t: DateTime<Utc>| t.format("%Y-%m").to_string();
    let (a, b, d) = (period(first), period(second), period(third));
    // medai-labs' grace period starts mid-way through the first month.
    let since = (first + TimeDelta::days(14)).date_naive();
    sqlx::query("UPDATE tenants SET chargeback_since = $1 WHERE tenant_id = 'medai-labs'")
        .bind(since)
        .execute(&stack.pool)
        .await
        .unwrap();
    for p in [&a, &b] {
        sqlx::query(
            "INSERT INTO tenant_budgets (tenant_id, period, amount, set_by) VALUES ('medai-labs', $1, 2, 'test')",
        )
        .bind(p)
        .execute(&stack.pool)
        .await
        .unwrap();
    }
    let ingest = tests::gateway::start_ingest(&stack);
    let (archiver, _) = tests::archive::start_archiver(&stack, "archiver", &archive_url, &[]);
    let api = tests::billing::start_billing_api(&stack.database_url, FINANCE).await;
    let producer = stack.producer();
    let mut rng = StdRng::seed_from_u64(0xa0d1);
    let mut produced = 0i64;
    let send = async |msgs: Vec<(String, Vec<u8>)>, produced: &mut i64| {
        stack.produce(&producer, &msgs).await;
        *produced += msgs.len() as i64;
        tests::archive::wait_consumed(&stack, *produced, &ingest).await;
        tests::archive::wait_archived(&stack, &archiver).await;
    };

    // Three months of usage (from a day before the first, so every zone's
    // month start is covered), with re-sends, a conflict and bad messages.
    let base = events(&mut rng, 1500, first - TimeDelta::days(1), month_start(0));
    let mut msgs = messages(&base);
    for e in base.iter().step_by(20) {
        msgs.push((e.tenant_id.clone(), e.to_json()));
    }
    let mut conflict = base[7].clone();
    conflict.completion_tokens += 1;
    msgs.push((conflict.tenant_id.clone(), conflict.to_json()));
    msgs.push(("acme-corp".into(), b"{\"not\": \"an event\"}".to_vec()));
    let hours = (month_start(0) - first).num_hours();
    for r in reports(&mut rng, first, hours) {
        msgs.push((r.replica_id.clone(), r.to_json()));
    }
    send(msgs, &mut produced).await;
    let finalized_a = finalize_all(&api.url, &a).await;
    assert!(
        finalized_a.iter().any(|i| has_line(i, "grace_waiver")),
        "medai-labs' grace period waives charges above its budget"
    );
    assert!(
        finalized_a.iter().any(|i| has_line(i, "reserved")),
        "acme-corp pays for its dedicated replicas"
    );

    // Late usage for the first month, then the second month finalized.
    let hour_in = |m: DateTime<Utc>| {
        (m + TimeDelta::days(10))
            .duration_trunc(TimeDelta::hours(1))
            .unwrap()
    };
    let late_a = events(
        &mut rng,
        40,
        hour_in(first),
        hour_in(first) + TimeDelta::days(5),
    );
    let mut msgs = messages(&late_a);
    msgs.push(late_report(hour_in(first) + TimeDelta::hours(1)));
    send(msgs, &mut produced).await;
    let finalized_b = finalize_all(&api.url, &b).await;
    assert!(
        finalized_b
            .iter()
            .filter(|i| has_line(i, "adjustment"))
            .count()
            >= 4,
        "late usage of {a} is billed as adjustments on {b}"
    );
    let late_b = events(
        &mut rng,
        40,
        hour_in(second),
        hour_in(second) + TimeDelta::days(5),
    );
    let mut msgs = messages(&late_b);
    msgs.push(late_report(hour_in(second) + TimeDelta::hours(1)));
    send(msgs, &mut produced).await;

    for (month, kind) in [(&a, "finalized #"), (&b, "finalized #"), (&d, "draft")] {
        let run = audit(&stack, &archive_url, month);
        assert!(
            run.ok,
            "the audit of {month} agrees:\n{}\n{}",
            run.stdout, run.stderr
        );
        assert_eq!(
            run.stderr.matches(" agrees tenant=").count(),
            5,
            "every tenant's {month} invoice agrees:\n{}",
            run.stderr
        );
        assert!(run.stderr.contains(kind), "{}", run.stderr);
        assert!(run.stdout.trim().is_empty(), "{}", run.stdout);
    }

    // Altered usage: one usage_hourly row of the draft month gains tokens.
    let altered = sqlx::query(
        "UPDATE usage_hourly SET prompt_tokens = prompt_tokens + 1000000
         WHERE (tenant_id, model, priority, hour) IN (
             SELECT tenant_id, model, priority, hour FROM usage_hourly
             WHERE tenant_id = 'acme-corp' AND hour >= $1 + interval '2 days' AND hour < $2
             ORDER BY hour LIMIT 1)",
    )
    .bind(third)
    .bind(month_start(0))
    .execute(&stack.pool)
    .await
    .unwrap();
    assert_eq!(altered.rows_affected(), 1);
    let run = audit(&stack, &archive_url, &d);
    let diffs = run.differences();
    assert!(
        diffs
            .iter()
            .all(|d| d["tenant_id"] == "acme-corp" && d["invoice"] == "draft"),
        "{diffs:?}"
    );
    assert!(
        diffs.iter().any(|d| d["what"] == "usage.prompt_tokens"),
        "{diffs:?}"
    );
    assert!(
        diffs.iter().any(|d| d["what"]
            .as_str()
            .unwrap()
            .starts_with("line usage llama-3.1-")),
        "{diffs:?}"
    );
    assert!(diffs.iter().any(|d| d["what"] == "total"), "{diffs:?}");

    // An archived file dropped from the manifest: the archive no longer
    // bears out the first month's finalized invoices.
    let retired = sqlx::query(
        "DELETE FROM archive_manifest WHERE file_id = (
             SELECT file_id FROM archive_manifest WHERE retired_at IS NULL
             AND day >= $1::date + 2 AND day < $2::date ORDER BY rows DESC LIMIT 1)",
    )
    .bind(first.date_naive())
    .bind(second.date_naive())
    .execute(&stack.pool)
    .await
    .unwrap();
    assert_eq!(retired.rows_affected(), 1);
    let run = audit(&stack, &archive_url, &a);
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("\"invoice\":\"finalized #"),
        "{}",
        run.stdout
    );

    // An edited finalized invoice of the second month.
    sqlx::query(
        "UPDATE invoices SET content = jsonb_set(content, '{total}', '\"1.00\"')
         WHERE tenant_id = 'finserv-team' AND period = $1 AND status = 'finalized'",
    )
    .bind(&b)
    .execute(&stack.pool)
    .await
    .unwrap();
    let run = audit(&stack, &archive_url, &b);
    let diffs = run.differences();
    assert!(
        diffs.iter().any(|d| d["tenant_id"] == "finserv-team"
            && d["what"] == "total"
            && d["billed"] == "1"),
        "{diffs:?}"
    );

    // Bad input names the problem.
    let run = audit(&stack, &archive_url, "2026-13");
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("--month"), "{}", run.stderr);
}

/// A file of the schema before contract v2: this build's columns less v2's.
fn v1_file(rows: &[archive::ArchivedRequest]) -> Vec<u8> {
    let batch = archive::format::to_record_batch(rows).unwrap();
    let keep: Vec<usize> = (0..batch.num_columns())
        .filter(|i| {
            !["pool", "dedicated_to", "queue_wait_ms", "preemptions"]
                .contains(&batch.schema().field(*i).name().as_str())
        })
        .collect();
    let old = batch.project(&keep).unwrap();
    let mut bytes = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut bytes, old.schema(), None).unwrap();
    w.write(&old).unwrap();
    w.close().unwrap();
    bytes
}

#[tokio::test]
async fn the_audit_scans_files_of_the_schemas_before_and_after_contract_v2_together() {
    let stack = TestStack::new("auditschemas").await;
    let store = archive::store::open(stack.dir.path().join("archive").to_str().unwrap()).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let hour = (Utc::now() - TimeDelta::days(3))
        .duration_trunc(TimeDelta::hours(1))
        .unwrap();
    let rows = |rng: &mut StdRng, v2: bool| -> Vec<archive::ArchivedRequest> {
        let mut out: Vec<archive::ArchivedRequest> = (0..50)
            .map(|i| {
                let mut e = event(
                    rng,
                    hour + TimeDelta::seconds(i * 30 + i64::from(v2)),
                    "acme-corp",
                    5,
                );
                e.model = "llama-3.1-70b".into();
                e.placement = v2.then(|| Placement {
                    pool: e.model.clone(),
                    dedicated_to: Some("acme-corp".into()),
                    queue_wait_ms: 3,
                    preemptions: 0,
                });
                e.schema_version = if v2 { 2 } else { 1 };
                archive::ArchivedRequest {
                    ingested_at: e.finished_at,
                    kafka_partition: 0,
                    kafka_offset: i,
                    event: e,
                }
            })
            .collect();
        out.sort_by_key(|r| r.event.request_id);
        out
    };
    let (old, new) = (rows(&mut rng, false), rows(&mut rng, true));
    let mut listed = Vec::new();
    for (name, part, body) in [
        ("v1", &old, v1_file(&old)),
        (
            "v2",
            &new,
            archive::format::encode(&new, archive::format::Layout::Batch).unwrap(),
        ),
    ] {
        let (day, h) = archive::archiver::hour_of(&part[0]);
        let path = archive::archiver::path(day, h, name);
        archive::store::put(&store, &path, body.clone().into())
            .await
            .unwrap();
        listed.push(archive::manifest::NewFile {
            path,
            day,
            hour: h,
            level: 0,
            min_request_id: part[0].event.request_id.as_uuid(),
            max_request_id: part[part.len() - 1].event.request_id.as_uuid(),
            rows: part.len() as i64,
            bytes: body.len() as i64,
            sha256: sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(&body))
                .into(),
        });
    }
    assert!(archive::manifest::swap(&stack.pool, &[], &listed)
        .await
        .unwrap());
    let (hours, stats) = audit::scan::hours(
        &stack.pool,
        &store,
        hour - TimeDelta::hours(1),
        hour + TimeDelta::hours(2),
        &[],
    )
    .await
    .unwrap();
    assert_eq!((stats.files, stats.requests), (2, 100));
    let sum = |owner: Option<&str>| -> (i64, i64, Decimal) {
        hours
            .iter()
            .filter(|h| h.dedicated_to.as_deref() == owner)
            .fold((0, 0, Decimal::ZERO), |(n, p, g), h| {
                (n + h.requests, p + h.prompt_tokens, g + h.gpu_seconds)
            })
    };
    let expect = |rows: &[archive::ArchivedRequest]| -> (i64, i64, Decimal) {
        (
            rows.len() as i64,
            rows.iter().map(|r| r.event.prompt_tokens).sum(),
            rows.iter().map(|r| r.event.gpu_seconds).sum(),
        )
    };
    assert_eq!(sum(None), expect(&old), "the v1 file's rows, with no owner");
    assert_eq!(
        sum(Some("acme-corp")),
        expect(&new),
        "the v2 file's rows, on acme-corp's replicas"
    );
}
