//! The Parquet archive, end to end on the real broker, Postgres and (for the
//! `_on_s3` variants) a real S3-compatible server: the archive holds each
//! billed request exactly once — equal to request_log and to usage_hourly
//! summed — although ingest is fed re-sends, conflicts, unknown tenants and
//! malformed messages, and archivers are SIGKILLed at random moments, crash
//! between writing files and committing them, crash in the middle of a
//! compaction, and run two at once for a while; a reader listing the
//! manifest during compaction never sees a row twice or miss one;
//! retention keeps a due day until the archive holds it, and the archived
//! record is then the one request_log held.
//!
//! Seeded: `ARCHIVE_SEED=… ARCHIVE_EVENTS=…` repeats a run.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use archive::format::ArchivedRequest;
use archive::store::ArchiveStore;
use chrono::{DateTime, Datelike, DurationRound, NaiveDate, TimeDelta, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rollup::retention::{self, ArchiveRule};
use rust_decimal::Decimal;
use sqlx::PgPool;
use tests::process::{bin_dir, free_port};
use tests::{Service, TestStack};
use usage_contract::{FinishReason, RequestId, UsageEvent};
use uuid::Uuid;

const TENANTS: [&str; 5] = [
    "acme-corp",
    "codegen-platform",
    "finserv-team",
    "medai-labs",
    "research-squad",
];

fn event(rng: &mut StdRng, started_at: DateTime<Utc>, tenant: &str) -> UsageEvent {
    let prompt = rng.random_range(1..4000);
    let first_token = rng
        .random_bool(0.8)
        .then(|| started_at + TimeDelta::milliseconds(rng.random_range(0..500)));
    // Contract v1 and v2 events mixed, as during an upgrade.
    let placement = rng.random_bool(0.5).then(|| usage_contract::Placement {
        pool: "llama-3.1-70b".into(),
        dedicated_to: rng.random_bool(0.3).then(|| "acme-corp".into()),
        queue_wait_ms: rng.random_range(0..5000),
        preemptions: rng.random_range(0..3),
    });
    UsageEvent {
        schema_version: if placement.is_some() { 2 } else { 1 },
        request_id: RequestId::at(started_at),
        tenant_id: tenant.into(),
        api_key_id: format!("key-{}", rng.random_range(0..3)),
        model: ["llama-3.1-8b", "llama-3.1-70b"][rng.random_range(0..2)].into(),
        model_version: "2024-07".into(),
        priority: rng.random_range(1..=5),
        started_at,
        first_token_at: first_token,
        finished_at: started_at + TimeDelta::milliseconds(rng.random_range(500..5000)),
        prompt_tokens: prompt,
        cached_tokens: rng.random_range(0..=prompt),
        completion_tokens: rng.random_range(0..2000),
        gpu_seconds: Decimal::new(rng.random_range(0..10_000_000_000), 6),
        preempted_gpu_seconds: Decimal::new(
            if rng.random_bool(0.1) {
                rng.random_range(1..1_000_000)
            } else {
                0
            },
            6,
        ),
        finish_reason: [
            FinishReason::Stop,
            FinishReason::Length,
            FinishReason::Cancelled,
            FinishReason::Error,
        ][rng.random_range(0..4)],
        ttft_ms: first_token.map(|t| (t - started_at).num_milliseconds()),
        tpot_ms: rng.random_bool(0.5).then(|| rng.random_range(5..80)),
        replica_id: format!("replica-{}", rng.random_range(0..4)),
        gateway_id: "gw-1".into(),
        stream: rng.random_bool(0.5),
        placement,
    }
}

/// `n` messages over the last 30 hours: ~5% re-sends of earlier events, a
/// few conflicting versions, ~1% unknown tenants and ~1% malformed.
/// Returns the messages and the first version of every billable request.
type Messages = Vec<(String, Vec<u8>)>;

fn workload(rng: &mut StdRng, n: usize) -> (Messages, HashMap<Uuid, UsageEvent>) {
    let base = (Utc::now() - TimeDelta::hours(30))
        .duration_trunc(TimeDelta::milliseconds(1))
        .unwrap();
    let mut out = Vec::with_capacity(n);
    let mut valid: Vec<UsageEvent> = Vec::new();
    let mut billed = HashMap::new();
    while out.len() < n {
        let roll = rng.random_range(0..1000);
        let tenant = TENANTS[rng.random_range(0..TENANTS.len())];
        if roll < 10 {
            let payload = match roll % 2 {
                0 => b"\x00not json at all".to_vec(),
                _ => {
                    let mut e = event(rng, base, tenant);
                    e.cached_tokens = e.prompt_tokens + 1;
                    e.to_json()
                }
            };
            out.push((tenant.to_owned(), payload));
        } else if roll < 20 {
            let e = event(rng, base + TimeDelta::hours(2), "nobody-knows-us");
            out.push((e.tenant_id.clone(), e.to_json()));
        } else if roll < 70 && !valid.is_empty() {
            let e = &valid[rng.random_range(0..valid.len())];
            out.push((e.tenant_id.clone(), e.to_json()));
        } else if roll < 75 && !valid.is_empty() {
            let mut e = valid[rng.random_range(0..valid.len())].clone();
            e.completion_tokens += 1;
            out.push((e.tenant_id.clone(), e.to_json()));
        } else {
            let progress = 30 * 3_600_000 * out.len() as i64 / n as i64;
            let jitter = if rng.random_bool(0.03) {
                -rng.random_range(0..3 * 3_600_000)
            } else {
                rng.random_range(-60_000..60_000)
            };
            let at = base + TimeDelta::milliseconds((progress + jitter).max(0));
            let e = event(rng, at, tenant);
            billed.insert(e.request_id.as_uuid(), e.clone());
            valid.push(e.clone());
            out.push((tenant.to_owned(), e.to_json()));
        }
    }
    (out, billed)
}

async fn seed_tenants(pool: &PgPool) {
    for t in TENANTS {
        sqlx::query(
            "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode)
             VALUES ($1, $1, 'standard', 3, 'per_token')",
        )
        .bind(t)
        .execute(pool)
        .await
        .unwrap();
    }
}

/// Where a test's archive lives: a directory, or a bucket of its own server.
struct Target {
    url: String,
    env: Vec<(String, String)>,
    _s3: Option<devstack::PrivateS3>,
}

impl Target {
    async fn new(stack: &TestStack, s3: bool) -> Self {
        if s3 {
            let server = devstack::PrivateS3::start()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            Self {
                url: server.url("archive"),
                env: server.env(),
                _s3: Some(server),
            }
        } else {
            Self {
                url: format!("file://{}", stack.dir.path().join("archive").display()),
                env: Vec::new(),
                _s3: None,
            }
        }
    }

    /// Opens the store as a reader in this process would.
    fn open(&self) -> ArchiveStore {
        for (k, v) in &self.env {
            // Only this test's variables, the same in every test of the
            // binary that sets them (one private server each, same keys).
            std::env::set_var(k, v);
        }
        archive::store::open(&self.url).unwrap()
    }
}

fn archiver(
    stack: &TestStack,
    target: &Target,
    name: &str,
    extra: &[(&str, &str)],
) -> (Service, u16) {
    let mut env = target.env.clone();
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    tests::archive::start_archiver(stack, name, &target.url, &env)
}

/// Waits until the archiver serves its metrics (it is past start-up).
async fn wait_serving(port: u16, svc: &Service) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "archiver never served metrics:\n{}",
            svc.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn wide() -> (NaiveDate, NaiveDate) {
    (
        NaiveDate::from_ymd_opt(2000, 1, 1).unwrap(),
        NaiveDate::from_ymd_opt(2100, 1, 1).unwrap(),
    )
}

/// Every row of every live file, read back with the parquet crate; fails
/// on a request id in two files.
async fn read_live(pool: &PgPool, store: &ArchiveStore) -> BTreeMap<Uuid, ArchivedRequest> {
    let (from, to) = wide();
    let files = archive::manifest::live(pool, from, to).await.unwrap();
    let mut out = BTreeMap::new();
    for (file, rows) in archive::reader::read_files(store, &files).await.unwrap() {
        assert_eq!(rows.len() as i64, file.rows, "{}", file.path);
        for r in rows {
            let id = r.event.request_id.as_uuid();
            assert!(out.insert(id, r).is_none(), "{id} archived twice");
        }
    }
    out
}

type HourKey = (String, String, i16, DateTime<Utc>);

#[derive(Debug, Default, PartialEq, Eq)]
struct Sums {
    requests: i64,
    prompt: i64,
    cached: i64,
    completion: i64,
    gpu: Decimal,
    preempted: Decimal,
    cancelled: i64,
    errored: i64,
}

fn sums<'a>(rows: impl Iterator<Item = &'a ArchivedRequest>) -> BTreeMap<HourKey, Sums> {
    let mut out: BTreeMap<HourKey, Sums> = BTreeMap::new();
    for r in rows {
        let e = &r.event;
        let hour = e.started_at.duration_trunc(TimeDelta::hours(1)).unwrap();
        let s = out
            .entry((e.tenant_id.clone(), e.model.clone(), e.priority, hour))
            .or_default();
        s.requests += 1;
        s.prompt += e.prompt_tokens;
        s.cached += e.cached_tokens;
        s.completion += e.completion_tokens;
        s.gpu += e.gpu_seconds;
        s.preempted += e.preempted_gpu_seconds;
        s.cancelled += i64::from(e.finish_reason == FinishReason::Cancelled);
        s.errored += i64::from(e.finish_reason == FinishReason::Error);
    }
    out
}

async fn hourly(pool: &PgPool) -> BTreeMap<HourKey, Sums> {
    #[allow(clippy::type_complexity, reason = "one row of usage_hourly")]
    let rows: Vec<(
        String,
        String,
        i16,
        DateTime<Utc>,
        i64,
        i64,
        i64,
        i64,
        Decimal,
        Decimal,
        i64,
        i64,
    )> = sqlx::query_as(
        "SELECT tenant_id, model, priority, hour, requests, prompt_tokens, cached_tokens,
                completion_tokens, gpu_seconds, preempted_gpu_seconds, cancelled_requests,
                errored_requests
         FROM usage_hourly WHERE requests > 0",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|r| {
            (
                (r.0, r.1, r.2, r.3),
                Sums {
                    requests: r.4,
                    prompt: r.5,
                    cached: r.6,
                    completion: r.7,
                    gpu: r.8,
                    preempted: r.9,
                    cancelled: r.10,
                    errored: r.11,
                },
            )
        })
        .collect()
}

fn command(stack: &TestStack, target: &Target, args: &[&str], grace: &str) -> serde_json::Value {
    let out = std::process::Command::new(bin_dir().join("archiver"))
        .args(args)
        .env("DATABASE_URL", &stack.database_url)
        .env("ARCHIVE_URL", &target.url)
        .env("ARCHIVE_GC_GRACE_SECS", grace)
        .env("ARCHIVE_COMPACT_SETTLE_SECS", "0")
        .envs(target.env.iter().cloned())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "archiver {args:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap()
}

async fn every_billed_request_archived_once(s3: bool) {
    let seed: u64 = std::env::var("ARCHIVE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let n: usize = std::env::var("ARCHIVE_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5000);
    eprintln!("ARCHIVE_SEED={seed} ARCHIVE_EVENTS={n}");
    let mut rng = StdRng::seed_from_u64(seed);
    let stack = TestStack::new(if s3 { "archive_s3" } else { "archive" }).await;
    seed_tenants(&stack.pool).await;
    let target = Target::new(&stack, s3).await;
    let settings = [
        ("ARCHIVE_MAX_BATCH", "250"),
        ("ARCHIVE_LINGER_MS", "200"),
        ("ARCHIVE_COMPACT_EVERY_SECS", "1"),
        ("ARCHIVE_COMPACT_SETTLE_SECS", "0"),
    ];
    let (messages, billed) = workload(&mut rng, n);
    let producer = stack.producer();
    let mut ingest = tests::gateway::start_ingest(&stack);
    let (mut svc, port) = archiver(&stack, &target, "archiver", &settings);
    let mut second: Option<Service> = None;
    let mut kills = 0;
    let mut crashes = 0;
    let chunks: Vec<&[(String, Vec<u8>)]> = messages.chunks(n.div_ceil(8)).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        stack.produce(&producer, chunk).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..2500))).await;
        if matches!(i, 1 | 3 | 5 | 7) {
            svc.kill9().await;
            kills += 1;
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..1000))).await;
            // Once the new process crashes between writing a batch's files
            // and committing them, once in a compaction before its swap.
            let (batch, compaction) = match i {
                3 => ("1", "0"),
                5 => ("0", "1"),
                _ => ("0", "0"),
            };
            svc.restart_with(&[
                ("ARCHIVE_TEST_CRASH_AFTER_WRITE", batch),
                ("ARCHIVE_TEST_CRASH_IN_COMPACTION", compaction),
            ])
            .unwrap_or_else(|e| panic!("{e}"));
        }
        if i == 4 || i == 6 {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
            while svc.exited().is_none() {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no crash:\n{}",
                    svc.log_tail()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            svc.kill9().await;
            crashes += 1;
            svc.restart_with(&[
                ("ARCHIVE_TEST_CRASH_AFTER_WRITE", "0"),
                ("ARCHIVE_TEST_CRASH_IN_COMPACTION", "0"),
            ])
            .unwrap_or_else(|e| panic!("{e}"));
        }
        // Two archivers at once for a while: the queue's delete count keeps
        // the loser's files out of the manifest.
        if i == 2 {
            second = Some(archiver(&stack, &target, "archiver-2", &settings).0);
        }
        if i == 5 {
            if let Some(mut s) = second.take() {
                s.kill9().await;
                kills += 1;
            }
        }
    }
    tests::archive::wait_consumed(&stack, messages.len() as i64, &ingest).await;
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..1500))).await;
    svc.kill9().await;
    kills += 1;
    svc.restart().unwrap_or_else(|e| panic!("{e}"));
    wait_serving(port, &svc).await;
    tests::archive::wait_archived(&stack, &svc).await;
    let status = svc.terminate(Duration::from_secs(30)).await.unwrap();
    assert!(status.success(), "exit {status}:\n{}", svc.log_tail());
    ingest.terminate(Duration::from_secs(30)).await;
    // What is left to compact, compacted by the command.
    command(&stack, &target, &["compact"], "3600");

    let store = target.open();
    let archived = read_live(&stack.pool, &store).await;
    let logged: BTreeMap<Uuid, ArchivedRequest> =
        archive::queue::logged_between(&stack.pool, Uuid::nil(), Uuid::max())
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.event.request_id.as_uuid(), r))
            .collect();
    assert_eq!(
        logged.len(),
        billed.len(),
        "request_log holds each billed request"
    );
    assert_eq!(
        archived.len(),
        logged.len(),
        "each billed request archived once"
    );
    for (id, row) in &logged {
        let got = archived
            .get(id)
            .unwrap_or_else(|| panic!("{id} not archived"));
        assert_eq!(got, row, "{id}: the archive holds request_log's row");
        assert_eq!(&got.event, &billed[id], "{id}: the first version");
    }
    assert_eq!(
        sums(archived.values()),
        hourly(&stack.pool).await,
        "the archive sums to usage_hourly"
    );
    let (from, to) = wide();
    let live = archive::manifest::live(&stack.pool, from, to)
        .await
        .unwrap();
    let compacted = live.iter().filter(|f| f.level == 1).count();
    let retired = archive::manifest::all(&stack.pool)
        .await
        .unwrap()
        .iter()
        .filter(|f| f.retired_at.is_some())
        .count();
    assert!(
        compacted > 0 && retired > 0,
        "compaction ran: {compacted} compacted, {retired} retired"
    );
    let open_hour = Utc::now().duration_trunc(TimeDelta::hours(1)).unwrap() - TimeDelta::minutes(1);
    assert!(
        live.iter()
            .filter(|f| f.day.and_hms_opt(f.hour as u32, 59, 0).unwrap().and_utc() < open_hour)
            .all(|f| f.level == 1),
        "every closed hour compacted"
    );

    let report = command(&stack, &target, &["verify"], "3600");
    assert_eq!(report["problems"], serde_json::json!([]), "{report}");
    let orphans = report["orphans"].as_array().unwrap().len();
    let gc = command(&stack, &target, &["gc"], "0");
    let after = command(&stack, &target, &["verify"], "3600");
    assert_eq!(after["problems"], serde_json::json!([]), "{after}");
    assert_eq!(
        after["orphans"],
        serde_json::json!([]),
        "gc left orphans: {after}"
    );
    assert_eq!(after["retired_files"], 0, "{after}");
    assert_eq!(
        read_live(&stack.pool, &store).await.len(),
        logged.len(),
        "gc deleted nothing live"
    );
    eprintln!(
        "archived {} requests from {} messages in {} live files ({compacted} compacted, \
         {retired} retired) after {kills} SIGKILLs and {crashes} crashes before a commit; \
         orphans {orphans}, gc deleted {} retired and {} orphans",
        archived.len(),
        messages.len(),
        live.len(),
        gc["retired"].as_array().unwrap().len(),
        gc["orphans"].as_array().unwrap().len(),
    );
    assert_eq!(crashes, 2, "both crashes before a commit happened");
    assert!(orphans > 0, "the crashes left orphans");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_billed_request_is_archived_once_across_sigkills() {
    every_billed_request_archived_once(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_billed_request_is_archived_once_across_sigkills_on_s3() {
    every_billed_request_archived_once(true).await;
}

/// Inserts rows into request_log directly (their day partitions first).
async fn insert_logged(pool: &PgPool, events: &[UsageEvent]) {
    let days: HashSet<NaiveDate> = events.iter().map(|e| e.request_id.day()).collect();
    for d in days {
        sqlx::query("SELECT ensure_request_log_partition($1)")
            .bind(d)
            .execute(pool)
            .await
            .unwrap();
    }
    for chunk in events.chunks(1000) {
        let mut q = sqlx::QueryBuilder::new(
            "INSERT INTO request_log (request_id, tenant_id, api_key_id, model, model_version,
             priority, started_at, first_token_at, finished_at, prompt_tokens, cached_tokens,
             completion_tokens, gpu_seconds, preempted_gpu_seconds, finish_reason, ttft_ms,
             tpot_ms, replica_id, gateway_id, stream, content_hash, kafka_partition,
             kafka_offset, pool, dedicated_to, queue_wait_ms, preemptions) ",
        );
        q.push_values(chunk.iter().enumerate(), |mut b, (i, e)| {
            b.push_bind(e.request_id.as_uuid())
                .push_bind(&e.tenant_id)
                .push_bind(&e.api_key_id)
                .push_bind(&e.model)
                .push_bind(&e.model_version)
                .push_bind(e.priority)
                .push_bind(e.started_at)
                .push_bind(e.first_token_at)
                .push_bind(e.finished_at)
                .push_bind(e.prompt_tokens)
                .push_bind(e.cached_tokens)
                .push_bind(e.completion_tokens)
                .push_bind(e.gpu_seconds)
                .push_bind(e.preempted_gpu_seconds)
                .push_bind(e.finish_reason.as_str())
                .push_bind(e.ttft_ms)
                .push_bind(e.tpot_ms)
                .push_bind(&e.replica_id)
                .push_bind(&e.gateway_id)
                .push_bind(e.stream)
                .push_bind(e.content_hash().to_vec())
                .push_bind(0_i32)
                .push_bind(i as i64)
                .push_bind(e.placement.as_ref().map(|p| p.pool.clone()))
                .push_bind(e.placement.as_ref().and_then(|p| p.dedicated_to.clone()))
                .push_bind(e.placement.as_ref().map(|p| p.queue_wait_ms))
                .push_bind(e.placement.as_ref().map(|p| p.preemptions));
        });
        q.build().execute(pool).await.unwrap();
    }
}

async fn a_listing_reader_never_sees_a_row_twice_or_miss_one(s3: bool) {
    let stack = TestStack::new(if s3 { "archread_s3" } else { "archread" }).await;
    let target = Target::new(&stack, s3).await;
    let store = target.open();
    let mut rng = StdRng::seed_from_u64(11);
    let hour = (Utc::now() - TimeDelta::hours(3))
        .duration_trunc(TimeDelta::hours(1))
        .unwrap();
    let events: Vec<UsageEvent> = (0..3000)
        .map(|i| {
            let at = hour + TimeDelta::milliseconds(i * 1100);
            event(&mut rng, at, TENANTS[i as usize % 5])
        })
        .collect();
    let expected: HashSet<Uuid> = events.iter().map(|e| e.request_id.as_uuid()).collect();
    insert_logged(&stack.pool, &events[..1000]).await;
    while archive::archiver::archive_batch(&stack.pool, &store, 100, false)
        .await
        .unwrap()
        .rows
        > 0
    {}
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (pool, store, stop) = (stack.pool.clone(), store.clone(), stop.clone());
        tokio::spawn(async move {
            let mut reads = 0;
            let mut largest = 0;
            loop {
                // A listing begun after the last batch committed sees it all.
                let last = stop.load(std::sync::atomic::Ordering::Relaxed) && reads >= 5;
                let rows = read_live(&pool, &store).await;
                // Rows only ever join (batches), never leave: each listing
                // holds at least the previous one's count and nothing twice.
                assert!(
                    rows.len() >= largest,
                    "a listing lost rows: {} < {largest}",
                    rows.len()
                );
                largest = rows.len();
                reads += 1;
                if last {
                    break;
                }
            }
            (reads, largest)
        })
    };
    // Batches keep adding files to the hour while compaction merges it.
    let policy = archive::compact::Policy {
        settle: TimeDelta::zero(),
        max_rows_per_file: 700,
    };
    let mut swaps = 0;
    for round in 0..4 {
        insert_logged(&stack.pool, &events[1000 + round * 500..1500 + round * 500]).await;
        while archive::archiver::archive_batch(&stack.pool, &store, 150, false)
            .await
            .unwrap()
            .rows
            > 0
        {}
        let done = archive::compact::compact_due(&stack.pool, &store, Utc::now(), policy, false)
            .await
            .unwrap();
        swaps += done.iter().filter(|c| c.swapped).count();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (reads, largest) = reader.await.unwrap();
    let rows = read_live(&stack.pool, &store).await;
    let got: HashSet<Uuid> = rows.keys().copied().collect();
    assert_eq!(got, expected);
    assert_eq!(largest, expected.len());
    assert!(swaps >= 4, "compaction swapped {swaps} times");
    eprintln!("{reads} listings during {swaps} compactions, none with a row twice or a row lost");
    // Every request is found by id, from its hour's compacted files.
    for e in events.iter().step_by(97) {
        let found = archive::reader::lookup(&stack.pool, &store, e.request_id)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{} not found", e.request_id));
        assert_eq!(&found.event, e);
    }
    assert!(
        archive::reader::lookup(&stack.pool, &store, RequestId::at(hour))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_reader_never_sees_a_row_twice_or_miss_one_during_compaction() {
    a_listing_reader_never_sees_a_row_twice_or_miss_one(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_reader_never_sees_a_row_twice_or_miss_one_during_compaction_on_s3() {
    a_listing_reader_never_sees_a_row_twice_or_miss_one(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_day_is_dropped_only_once_archived_and_its_record_stays_the_same() {
    let stack = TestStack::new("archret").await;
    let target = Target::new(&stack, false).await;
    let store = target.open();
    let mut rng = StdRng::seed_from_u64(7);
    let old_day = (Utc::now() - TimeDelta::days(40))
        .duration_trunc(TimeDelta::days(1))
        .unwrap();
    let events: Vec<UsageEvent> = (0..200)
        .map(|i| {
            event(
                &mut rng,
                old_day + TimeDelta::seconds(i * 300),
                TENANTS[i as usize % 5],
            )
        })
        .collect();
    insert_logged(&stack.pool, &events).await;
    let day = old_day.date_naive();
    let before = archive::queue::stored(&stack.pool, events[17].request_id.as_uuid())
        .await
        .unwrap()
        .unwrap();
    let today = Utc::now().date_naive();
    let rule = ArchiveRule::Require;
    assert!(retention::drop_expired(&stack.pool, today, 30, &rule)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(retention::queued(&stack.pool, day).await.unwrap(), 200);
    // Half archived: still kept.
    archive::archiver::archive_batch(&stack.pool, &store, 100, false)
        .await
        .unwrap();
    assert!(retention::drop_expired(&stack.pool, today, 30, &rule)
        .await
        .unwrap()
        .is_empty());
    archive::archiver::archive_batch(&stack.pool, &store, 100, false)
        .await
        .unwrap();
    assert_eq!(
        retention::drop_expired(&stack.pool, today, 30, &rule)
            .await
            .unwrap(),
        vec![day]
    );
    assert!(
        archive::queue::stored(&stack.pool, events[17].request_id.as_uuid())
            .await
            .unwrap()
            .is_none()
    );
    let after = archive::reader::lookup(&stack.pool, &store, events[17].request_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after, before, "the archive answers what request_log held");
    let scanned = archive::reader::scan(&stack.pool, &store, old_day, old_day + TimeDelta::days(1))
        .await
        .unwrap();
    assert_eq!(scanned.len(), 200);
}

#[tokio::test]
async fn bad_archiver_settings_exit_non_zero_naming_the_setting() {
    for (var, value) in [
        ("ARCHIVE_MAX_BATCH", "0"),
        ("ARCHIVE_LINGER_MS", "0"),
        ("ARCHIVE_URL", "gs://bucket/archive"),
        ("ARCHIVE_URL", "s3:///no-bucket"),
    ] {
        let out = std::process::Command::new(bin_dir().join("archiver"))
            .env(var, value)
            .env("ARCHIVE_METRICS_ADDR", format!("127.0.0.1:{}", free_port()))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{var}={value} should refuse to start"
        );
        assert!(
            stderr.contains(var),
            "the error should name {var}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "no panic: {stderr}");
    }
}

/// Archives every queued row.
async fn archive_all(pool: &PgPool, store: &ArchiveStore) {
    while !archive::queue::pending(pool, 1)
        .await
        .unwrap()
        .taken
        .is_empty()
    {
        archive::archiver::archive_batch(pool, store, 1000, false)
            .await
            .unwrap();
    }
}

/// GET `path` on billing-api as `token`: the status and the JSON body.
async fn billing_get(url: &str, path: &str, token: &str) -> (u16, serde_json::Value) {
    let res = reqwest::Client::new()
        .get(format!("{url}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or_default())
}

#[tokio::test]
async fn support_finds_a_request_of_any_age_and_the_invoice_it_was_billed_on() {
    const FINANCE: &str = "finance-token-for-archive-lookup";
    const LEAD: &str = "lead-token-for-archive-lookup-01";
    let stack = TestStack::new("archlookup").await;
    seed_tenants(&stack.pool).await;
    sqlx::query(
        "INSERT INTO billing_tokens (token_id, token_hash, role, tenant_id)
         VALUES ('lead', sha256($1::bytea), 'team_lead', $2)",
    )
    .bind(LEAD.as_bytes())
    .bind(TENANTS[0])
    .execute(&stack.pool)
    .await
    .unwrap();
    let target = Target::new(&stack, false).await;
    let store = target.open();
    let api = tests::billing::start_billing_api_with(
        &stack.database_url,
        FINANCE,
        &[("ARCHIVE_URL", target.url.clone())],
    )
    .await;
    // A day 70 days back: its month and the next have ended.
    let mut rng = StdRng::seed_from_u64(18);
    let old_day = (Utc::now() - TimeDelta::days(70))
        .duration_trunc(TimeDelta::days(1))
        .unwrap();
    let events: Vec<UsageEvent> = (0..50)
        .map(|i| {
            event(
                &mut rng,
                old_day + TimeDelta::seconds(i * 600),
                TENANTS[i as usize % 5],
            )
        })
        .collect();
    insert_logged(&stack.pool, &events).await;
    let tenant = TENANTS[0];
    let month = old_day.format("%Y-%m").to_string();
    let next = (old_day.date_naive().with_day(1).unwrap() + chrono::Months::new(1))
        .format("%Y-%m")
        .to_string();
    let finalize = |period: String| {
        let url = api.url.clone();
        async move {
            let res = reqwest::Client::new()
                .post(format!(
                    "{url}/v1/tenants/{tenant}/invoices/{period}/finalize"
                ))
                .bearer_auth(FINANCE)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200, "finalize {period}");
            res.json::<serde_json::Value>().await.unwrap()
        }
    };
    let first = finalize(month.clone()).await;

    // A request of that month ingested after its invoice was finalized.
    let mut late = event(&mut rng, old_day + TimeDelta::hours(20), tenant);
    late.priority = 3;
    // Enough tokens that its adjustment is more than a rounding to 0.
    (
        late.prompt_tokens,
        late.cached_tokens,
        late.completion_tokens,
    ) = (2_000_000, 0, 500_000);
    insert_logged(&stack.pool, std::slice::from_ref(&late)).await;
    sqlx::query(
        "INSERT INTO usage_hourly (tenant_id, model, priority, hour, requests, prompt_tokens,
             cached_tokens, completion_tokens, gpu_seconds)
         VALUES ($1, $2, $3, date_trunc('hour', $4::timestamptz), 1, $5, $6, $7, $8)",
    )
    .bind(&late.tenant_id)
    .bind(&late.model)
    .bind(late.priority)
    .bind(late.started_at)
    .bind(late.prompt_tokens)
    .bind(late.cached_tokens)
    .bind(late.completion_tokens)
    .bind(late.gpu_seconds)
    .execute(&stack.pool)
    .await
    .unwrap();
    let on_time = events.iter().find(|e| e.tenant_id == tenant).unwrap();
    let path = |e: &UsageEvent| format!("/v1/requests/{}", e.request_id);

    let (status, found) = billing_get(&api.url, &path(on_time), FINANCE).await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["source"], "request_log");
    assert_eq!(found["invoice"]["period"], month);
    assert_eq!(found["invoice"]["number"], first["number"]);
    assert!(found["invoice"]["adjusts"].is_null(), "{found}");
    let (_, late_found) = billing_get(&api.url, &path(&late), FINANCE).await;
    assert_eq!(
        late_found["invoice"],
        serde_json::json!({"period": next, "status": "draft", "number": null, "adjusts": month}),
        "billed on the next draft as an adjustment, not on the invoice that never held it"
    );
    let adjusted = finalize(next.clone()).await;
    assert!(
        adjusted["lines"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["kind"] == "adjustment" && l["adjusts"] == month.as_str()),
        "{adjusted}"
    );
    let (_, late_found) = billing_get(&api.url, &path(&late), FINANCE).await;
    assert_eq!(late_found["invoice"]["period"], next);
    assert_eq!(late_found["invoice"]["status"], "finalized");
    assert_eq!(late_found["invoice"]["number"], adjusted["number"]);
    assert_eq!(late_found["invoice"]["adjusts"], month);
    let before: Vec<serde_json::Value> = {
        let mut v = Vec::new();
        for e in [on_time, &late] {
            v.push(billing_get(&api.url, &path(e), FINANCE).await.1);
        }
        v
    };

    // Retention drops the day once it is archived; lookups then read the
    // archive and answer the same record and invoice.
    archive_all(&stack.pool, &store).await;
    let dropped = retention::drop_expired(
        &stack.pool,
        Utc::now().date_naive(),
        30,
        &ArchiveRule::Require,
    )
    .await
    .unwrap();
    assert_eq!(dropped, vec![old_day.date_naive()]);
    for (e, was) in [on_time, &late].into_iter().zip(&before) {
        let (status, now) = billing_get(&api.url, &path(e), FINANCE).await;
        assert_eq!(status, 200, "{now}");
        assert_eq!(now["source"], "archive", "{now}");
        assert_eq!(now["request"], was["request"], "the same record");
        assert_eq!(now["invoice"], was["invoice"], "the same invoice");
    }
    // Same roles and tenant scoping as request_log's lookups.
    let (status, _) = billing_get(&api.url, &path(on_time), LEAD).await;
    assert_eq!(status, 200, "a team lead finds their own tenant's request");
    let other = events.iter().find(|e| e.tenant_id != tenant).unwrap();
    let (status, body) = billing_get(&api.url, &path(other), LEAD).await;
    assert_eq!(
        status, 404,
        "another tenant's request does not exist: {body}"
    );
    let unknown = RequestId::at(old_day + TimeDelta::hours(3));
    let (status, body) = billing_get(&api.url, &format!("/v1/requests/{unknown}"), FINANCE).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
}

#[tokio::test]
async fn reconcile_finds_drift_in_each_of_three_sources_and_none_over_dropped_days() {
    use rollup::reconcile::reconcile;
    let stack = TestStack::new("archrecon").await;
    seed_tenants(&stack.pool).await;
    let target = Target::new(&stack, false).await;
    let store = target.open();
    let mut rng = StdRng::seed_from_u64(5);
    let old_day = (Utc::now() - TimeDelta::days(40))
        .duration_trunc(TimeDelta::days(1))
        .unwrap();
    let recent = (Utc::now() - TimeDelta::hours(30))
        .duration_trunc(TimeDelta::hours(1))
        .unwrap();
    let events: Vec<UsageEvent> = (0..300)
        .map(|i| {
            let base = if i % 2 == 0 { old_day } else { recent };
            event(
                &mut rng,
                base + TimeDelta::seconds(i * 97),
                TENANTS[i as usize % 5],
            )
        })
        .collect();
    insert_logged(&stack.pool, &events).await;
    // usage_hourly as ingest would have counted them.
    sqlx::query(
        "INSERT INTO usage_hourly (tenant_id, model, priority, hour, requests, prompt_tokens,
             cached_tokens, completion_tokens, gpu_seconds, preempted_gpu_seconds,
             cancelled_requests, errored_requests)
         SELECT tenant_id, model, priority, date_trunc('hour', started_at), count(*),
                sum(prompt_tokens), sum(cached_tokens), sum(completion_tokens), sum(gpu_seconds),
                sum(preempted_gpu_seconds), count(*) FILTER (WHERE finish_reason = 'cancelled'),
                count(*) FILTER (WHERE finish_reason = 'error')
         FROM request_log GROUP BY 1, 2, 3, 4",
    )
    .execute(&stack.pool)
    .await
    .unwrap();
    let (from, to) = (
        old_day - TimeDelta::days(1),
        Utc::now() + TimeDelta::days(1),
    );
    // Half archived, half still queued: the archive's side is both.
    archive::archiver::archive_batch(&stack.pool, &store, 150, false)
        .await
        .unwrap();
    let diffs = reconcile(&stack.pool, Some(&store), from, to)
        .await
        .unwrap();
    assert!(diffs.is_empty(), "{diffs:?}");
    archive_all(&stack.pool, &store).await;
    assert!(reconcile(&stack.pool, Some(&store), from, to)
        .await
        .unwrap()
        .is_empty());
    let exec = |sql: &'static str| {
        let pool = stack.pool.clone();
        async move { sqlx::query(sql).execute(&pool).await.unwrap() }
    };

    // Drift in usage_hourly.
    exec(
        "UPDATE usage_hourly SET prompt_tokens = prompt_tokens + 1
          WHERE (tenant_id, model, priority, hour) = (SELECT tenant_id, model, priority, hour
                 FROM usage_hourly ORDER BY hour DESC, tenant_id, model, priority LIMIT 1)",
    )
    .await;
    let diffs = reconcile(&stack.pool, Some(&store), from, to)
        .await
        .unwrap();
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    assert_eq!(diffs[0].fields, ["prompt_tokens"]);
    assert_eq!(
        diffs[0].request_log, diffs[0].archive,
        "only usage_hourly drifted"
    );
    exec(
        "UPDATE usage_hourly SET prompt_tokens = prompt_tokens - 1
          WHERE (tenant_id, model, priority, hour) = (SELECT tenant_id, model, priority, hour
                 FROM usage_hourly ORDER BY hour DESC, tenant_id, model, priority LIMIT 1)",
    )
    .await;

    // Drift in request_log (a figure usage_hourly keeps but lookups don't show).
    exec(
        "UPDATE request_log SET preempted_gpu_seconds = preempted_gpu_seconds + 1
          WHERE request_id = (SELECT request_id FROM request_log ORDER BY request_id DESC LIMIT 1)",
    )
    .await;
    let diffs = reconcile(&stack.pool, Some(&store), from, to)
        .await
        .unwrap();
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    assert_eq!(diffs[0].fields, ["preempted_gpu_seconds"]);
    assert_eq!(diffs[0].archive.as_ref(), Some(&diffs[0].usage_hourly));
    exec(
        "UPDATE request_log SET preempted_gpu_seconds = preempted_gpu_seconds - 1
          WHERE request_id = (SELECT request_id FROM request_log ORDER BY request_id DESC LIMIT 1)",
    )
    .await;

    // Drift in the archive: a live file drops out of the manifest.
    exec(
        "CREATE TABLE lost_file AS SELECT * FROM archive_manifest
          WHERE file_id = (SELECT max(file_id) FROM archive_manifest)",
    )
    .await;
    exec("DELETE FROM archive_manifest WHERE file_id = (SELECT file_id FROM lost_file)").await;
    let diffs = reconcile(&stack.pool, Some(&store), from, to)
        .await
        .unwrap();
    assert!(!diffs.is_empty());
    for d in &diffs {
        assert!(d.fields.contains(&"requests"), "{d:?}");
        assert_eq!(
            d.request_log.as_ref(),
            Some(&d.usage_hourly),
            "only the archive drifted"
        );
    }
    exec("INSERT INTO archive_manifest OVERRIDING SYSTEM VALUE SELECT * FROM lost_file").await;
    assert!(reconcile(&stack.pool, Some(&store), from, to)
        .await
        .unwrap()
        .is_empty());

    // Retention drops the old day: no false alarm over it, and drift there
    // is still found (usage_hourly against the archive).
    let dropped = retention::drop_expired(
        &stack.pool,
        Utc::now().date_naive(),
        30,
        &ArchiveRule::Require,
    )
    .await
    .unwrap();
    assert_eq!(dropped, vec![old_day.date_naive()]);
    assert!(reconcile(&stack.pool, Some(&store), from, to)
        .await
        .unwrap()
        .is_empty());
    exec(
        "UPDATE usage_hourly SET errored_requests = errored_requests + 1
          WHERE (tenant_id, model, priority, hour) = (SELECT tenant_id, model, priority, hour
                 FROM usage_hourly ORDER BY hour, tenant_id, model, priority LIMIT 1)",
    )
    .await;
    let diffs = reconcile(&stack.pool, Some(&store), from, to)
        .await
        .unwrap();
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    assert_eq!(diffs[0].fields, ["errored_requests"]);
    assert_eq!(
        diffs[0].request_log, None,
        "request_log no longer holds that day"
    );
    assert_eq!(diffs[0].hour.date_naive(), old_day.date_naive());

    // The command: exit 1 and one JSON line per difference.
    let mut cmd = std::process::Command::new(bin_dir().join("rollup"));
    cmd.env("DATABASE_URL", &stack.database_url)
        .env("ARCHIVE_URL", &target.url)
        .args([
            "reconcile",
            "--from",
            &from.to_rfc3339(),
            "--to",
            &to.to_rfc3339(),
        ]);
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["fields"], serde_json::json!(["errored_requests"]));
}
