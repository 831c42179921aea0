//! The Parquet archive, end to end on the real broker and Postgres: every
//! valid message archived exactly once although archivers are SIGKILLed at
//! random moments and two run at once for a while; the manifest's ranges
//! chain with no gap or overlap; files hold the produced events field for
//! field and sit in their hour's folder; retention keeps a due day until
//! the archive has passed its barrier.
//!
//! Seeded: `ARCHIVE_SEED=… ARCHIVE_EVENTS=…` repeats a run.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use ingest::archive::writer::{self, ArchivedEvent};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rollup::retention::{self, ArchiveRule};
use rust_decimal::Decimal;
use sha2::{Digest, Sha256};
use tests::process::{bin_dir, free_port};
use tests::{Service, TestStack};
use usage_contract::{FinishReason, RequestId, UsageEvent};

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
    UsageEvent {
        schema_version: 1,
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
    }
}

/// A message and, if it is a valid event, the event it carries.
struct Produced {
    key: String,
    payload: Vec<u8>,
    event: Option<UsageEvent>,
}

/// `n` messages: events spread over the last 30 hours (several UTC days and
/// many hours), ~5% re-sends of earlier events, a few conflicting versions,
/// and ~1% malformed messages of several kinds.
fn workload(rng: &mut StdRng, n: usize) -> Vec<Produced> {
    let base = (Utc::now() - TimeDelta::hours(30))
        .duration_trunc(TimeDelta::milliseconds(1))
        .unwrap();
    let mut out: Vec<Produced> = Vec::with_capacity(n);
    let mut valid: Vec<UsageEvent> = Vec::new();
    while out.len() < n {
        let roll = rng.random_range(0..1000);
        let p = if roll < 10 {
            let tenant = TENANTS[rng.random_range(0..TENANTS.len())];
            let payload = match roll % 3 {
                0 => b"\x00not json at all".to_vec(),
                1 => {
                    let mut v = serde_json::to_value(event(rng, base, tenant)).unwrap();
                    v["schema_version"] = 2.into();
                    serde_json::to_vec(&v).unwrap()
                }
                _ => {
                    let mut e = event(rng, base, tenant);
                    e.cached_tokens = e.prompt_tokens + 1;
                    e.to_json()
                }
            };
            Produced {
                key: tenant.into(),
                payload,
                event: None,
            }
        } else if roll < 60 && !valid.is_empty() {
            // A re-send: the same bytes again, at a new offset.
            let e = valid[rng.random_range(0..valid.len())].clone();
            Produced {
                key: e.tenant_id.clone(),
                payload: e.to_json(),
                event: Some(e),
            }
        } else if roll < 65 && !valid.is_empty() {
            // A conflicting version: same id, other content.
            let mut e = valid[rng.random_range(0..valid.len())].clone();
            e.completion_tokens += 1;
            Produced {
                key: e.tenant_id.clone(),
                payload: e.to_json(),
                event: Some(e),
            }
        } else {
            // Roughly in time order across 30 hours, as traffic arrives;
            // ~3% late, from up to three hours earlier.
            let progress = 30 * 3_600_000 * out.len() as i64 / n as i64;
            let jitter = if rng.random_bool(0.03) {
                -rng.random_range(0..3 * 3_600_000)
            } else {
                rng.random_range(-60_000..60_000)
            };
            let at = base + TimeDelta::milliseconds((progress + jitter).max(0));
            let tenant = TENANTS[rng.random_range(0..TENANTS.len())];
            let e = event(rng, at, tenant);
            valid.push(e.clone());
            Produced {
                key: tenant.into(),
                payload: e.to_json(),
                event: Some(e),
            }
        };
        out.push(p);
    }
    out
}

fn archiver(
    stack: &TestStack,
    group: &str,
    root: &Path,
    name: &str,
    extra: &[(&str, &str)],
) -> Service {
    let mut env = stack.env();
    env.insert("ARCHIVE_TOPIC".into(), stack.topic.clone());
    env.insert("ARCHIVE_GROUP".into(), group.into());
    env.insert("ARCHIVE_URL".into(), format!("file://{}", root.display()));
    env.insert(
        "ARCHIVE_METRICS_ADDR".into(),
        format!("127.0.0.1:{}", free_port()),
    );
    for (k, v) in extra {
        env.insert((*k).into(), (*v).into());
    }
    Service::start(name, "archiver", &[], env, stack.dir.path()).unwrap_or_else(|e| panic!("{e}"))
}

async fn archive_offsets(stack: &TestStack, group: &str) -> BTreeMap<i32, i64> {
    let rows: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT kafka_partition, next_offset FROM archive_offsets WHERE consumer_group = $1",
    )
    .bind(group)
    .fetch_all(&stack.pool)
    .await
    .unwrap();
    rows.into_iter().collect()
}

/// Waits until every partition's archive offset reaches `ends`.
async fn wait_archived(stack: &TestStack, group: &str, ends: &BTreeMap<i32, i64>, svc: &Service) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let got = archive_offsets(stack, group).await;
        if ends.iter().all(|(p, e)| got.get(p).is_some_and(|g| g >= e)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "archive offsets {got:?} never reached {ends:?}:\n{}",
            svc.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[derive(Debug, sqlx::FromRow)]
struct ManifestRow {
    kafka_partition: i32,
    first_offset: i64,
    last_offset: i64,
    path: Option<String>,
    day: Option<chrono::NaiveDate>,
    hour: Option<i16>,
    rows: i64,
    skipped: i64,
    bytes: i64,
    sha256: Option<Vec<u8>>,
}

async fn manifest(stack: &TestStack, group: &str) -> Vec<ManifestRow> {
    sqlx::query_as(
        "SELECT kafka_partition, first_offset, last_offset, path, day, hour, rows, skipped,
                bytes, sha256
         FROM archive_manifest WHERE consumer_group = $1 ORDER BY kafka_partition, first_offset",
    )
    .bind(group)
    .fetch_all(&stack.pool)
    .await
    .unwrap()
}

/// Reads every manifest-listed file, checking it against its row; returns
/// the archived events by (partition, offset), failing on any repeat.
fn read_archive(
    root: &Path,
    topic: &str,
    rows: &[ManifestRow],
) -> BTreeMap<(i32, i64), UsageEvent> {
    let mut archived = BTreeMap::new();
    for r in rows {
        let Some(path) = &r.path else {
            assert_eq!(r.rows, 0);
            assert!(
                r.skipped > 0,
                "a range without a file must hold skipped messages"
            );
            continue;
        };
        let (day, hour) = (r.day.unwrap(), r.hour.unwrap());
        assert_eq!(
            path,
            &format!(
                "date={}/hour={hour:02}/{topic}-p{}-o{}-{}.parquet",
                day.format("%Y-%m-%d"),
                r.kafka_partition,
                r.first_offset,
                r.last_offset
            )
        );
        let bytes = std::fs::read(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(bytes.len() as i64, r.bytes, "{path}: size");
        let sha: [u8; 32] = Sha256::digest(&bytes).into();
        assert_eq!(r.sha256.as_deref(), Some(&sha[..]), "{path}: sha256");
        let events: Vec<ArchivedEvent> = writer::decode(bytes::Bytes::from(bytes)).unwrap();
        assert_eq!(events.len() as i64, r.rows, "{path}: rows");
        for a in events {
            assert_eq!(a.partition, r.kafka_partition, "{path}");
            assert!(
                (r.first_offset..=r.last_offset).contains(&a.offset),
                "{path}: offset {} outside its range",
                a.offset
            );
            // The folder is the UTC hour the event started in.
            let started = a.event.started_at;
            assert_eq!(started.date_naive(), day, "{path}: {started}");
            assert_eq!(
                started.format("%H").to_string(),
                format!("{hour:02}"),
                "{path}: {started}"
            );
            let previous = archived.insert((a.partition, a.offset), a.event);
            assert!(
                previous.is_none(),
                "({}, {}) archived twice",
                a.partition,
                a.offset
            );
        }
    }
    archived
}

/// Per partition, the manifest's distinct ranges (a batch's files share
/// one) start at 0 and chain with no gap and no overlap up to `ends` (the
/// next offset of each partition).
fn assert_contiguous(rows: &[ManifestRow], ends: &BTreeMap<i32, i64>) {
    let mut ranges: BTreeMap<i32, Vec<(i64, i64)>> = BTreeMap::new();
    for r in rows {
        assert!(r.last_offset >= r.first_offset);
        let list = ranges.entry(r.kafka_partition).or_default();
        match list.last() {
            Some(&(first, last)) if first == r.first_offset => {
                assert_eq!(
                    last, r.last_offset,
                    "partition {}: overlapping ranges",
                    r.kafka_partition
                );
            }
            _ => list.push((r.first_offset, r.last_offset)),
        }
    }
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for (p, list) in &ranges {
        let mut expected = 0;
        for &(first, last) in list {
            assert_eq!(
                first, expected,
                "partition {p}: range {first}..={last} should start at {expected}"
            );
            expected = last + 1;
        }
        next.insert(*p, expected);
    }
    assert_eq!(&next, ends, "every partition covered up to its end");
}

fn verify(stack: &TestStack, group: &str, root: &Path, command: &str) -> serde_json::Value {
    let out = std::process::Command::new(bin_dir().join("archiver"))
        .arg(command)
        .env("DATABASE_URL", &stack.database_url)
        .env("ARCHIVE_TOPIC", &stack.topic)
        .env("ARCHIVE_GROUP", group)
        .env("ARCHIVE_URL", root)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "archiver {command} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_valid_message_is_archived_exactly_once_across_sigkills() {
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
    let stack = TestStack::new("archive").await;
    let root: PathBuf = stack.dir.path().join("archive");
    let group = format!("archiver-{}", stack.group);
    let settings = [("ARCHIVE_MAX_BATCH", "250"), ("ARCHIVE_LINGER_MS", "300")];
    let messages = workload(&mut rng, n);
    let producer = stack.producer();

    let mut svc = archiver(&stack, &group, &root, "archiver", &settings);
    let mut second: Option<Service> = None;
    let mut landed: Vec<(i32, i64)> = Vec::with_capacity(n);
    let chunks: Vec<&[Produced]> = messages.chunks(n.div_ceil(8)).collect();
    let mut kills = 0;
    let mut crashes = 0;
    for (i, chunk) in chunks.iter().enumerate() {
        let batch: Vec<(String, Vec<u8>)> = chunk
            .iter()
            .map(|p| (p.key.clone(), p.payload.clone()))
            .collect();
        landed.extend(stack.produce_tracked(&producer, &batch).await);
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..2500))).await;
        if matches!(i, 1 | 3 | 5 | 6) {
            svc.kill9().await;
            kills += 1;
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..1000))).await;
            // Once, the new process crashes between writing a batch's files
            // and committing them: they are orphans, and the batch is redone.
            let crash = if i == 3 { "1" } else { "0" };
            svc.restart_with(&[("ARCHIVE_TEST_CRASH_AFTER_WRITE", crash)])
                .unwrap_or_else(|e| panic!("{e}"));
        }
        if i == 4 {
            // It crashes once it has joined and written a batch; then it comes back.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while svc.exited().is_none() {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no crash after write:\n{}",
                    svc.log_tail()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            svc.kill9().await;
            crashes += 1;
            svc.restart_with(&[("ARCHIVE_TEST_CRASH_AFTER_WRITE", "0")])
                .unwrap_or_else(|e| panic!("{e}"));
        }
        // Two archivers in one group for a while: the offsets CAS keeps a
        // zombie's batch out of the manifest.
        if i == 2 {
            second = Some(archiver(&stack, &group, &root, "archiver-2", &settings));
        }
        if i == 5 {
            if let Some(mut s) = second.take() {
                s.kill9().await;
                kills += 1;
            }
        }
    }
    let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
    for &(p, o) in &landed {
        let e = ends.entry(p).or_insert(0);
        *e = (*e).max(o + 1);
    }
    // One more kill while the last batches are in flight.
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..1500))).await;
    svc.kill9().await;
    kills += 1;
    svc.restart().unwrap_or_else(|e| panic!("{e}"));
    wait_archived(&stack, &group, &ends, &svc).await;
    let status = svc.terminate(Duration::from_secs(30)).await.unwrap();
    assert!(status.success(), "exit {status}:\n{}", svc.log_tail());

    let rows = manifest(&stack, &group).await;
    assert_contiguous(&rows, &ends);
    let archived = read_archive(&root, &stack.topic, &rows);

    let mut expected: BTreeMap<(i32, i64), &UsageEvent> = BTreeMap::new();
    let mut malformed: HashMap<i32, Vec<i64>> = HashMap::new();
    for (p, at) in messages.iter().zip(&landed) {
        match &p.event {
            Some(e) => {
                expected.insert(*at, e);
            }
            None => malformed.entry(at.0).or_default().push(at.1),
        }
    }
    assert_eq!(
        archived.len(),
        expected.len(),
        "each valid message archived once"
    );
    for (at, e) in &expected {
        let got = archived
            .get(at)
            .unwrap_or_else(|| panic!("{at:?} not archived"));
        assert_eq!(got, *e, "{at:?}");
        // Field for field, to the canonical bytes: decimals keep their six places.
        assert_eq!(got.to_json(), e.to_json(), "{at:?}");
    }
    let skipped: i64 = rows.iter().map(|r| r.skipped).sum();
    let malformed_count: usize = malformed.values().map(Vec::len).sum();
    assert_eq!(skipped as usize, malformed_count);
    for (p, offsets) in &malformed {
        for o in offsets {
            assert!(!archived.contains_key(&(*p, *o)));
        }
    }
    let files = rows.iter().filter(|r| r.path.is_some()).count();

    // The binary's own check agrees, and gc removes only orphans it may.
    let report = verify(&stack, &group, &root, "verify");
    assert_eq!(report["problems"], serde_json::json!([]), "{report}");
    let orphans = report["orphans"].as_array().unwrap().len();
    let gc = verify(&stack, &group, &root, "gc");
    let after = verify(&stack, &group, &root, "verify");
    assert_eq!(after["problems"], serde_json::json!([]), "{after}");
    let left = after["orphans"].as_array().unwrap().len();
    eprintln!(
        "archived {} events from {} messages ({malformed_count} malformed) in {files} files, \
         {} manifest rows, after {kills} SIGKILLs and {crashes} crash between write and commit; \
         orphans {orphans}, gc deleted {}, left {left}",
        archived.len(),
        landed.len(),
        rows.len(),
        gc["deleted"].as_array().unwrap().len()
    );
    assert_eq!(
        left, 0,
        "after gc no orphan below the archive offsets is left"
    );
    assert_eq!(crashes, 1, "the crash between write and commit happened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_day_is_dropped_only_once_the_archive_passes_its_barrier() {
    let mut rng = StdRng::seed_from_u64(7);
    let stack = TestStack::new("archret").await;
    for t in TENANTS {
        sqlx::query(
            "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode)
             VALUES ($1, $1, 'standard', 3, 'per_token')",
        )
        .bind(t)
        .execute(&stack.pool)
        .await
        .unwrap();
    }
    let root = stack.dir.path().join("archive");
    let group = format!("archiver-{}", stack.group);
    let old_day = (Utc::now() - TimeDelta::days(40))
        .duration_trunc(TimeDelta::days(1))
        .unwrap();
    let recent = (Utc::now() - TimeDelta::minutes(5))
        .duration_trunc(TimeDelta::milliseconds(1))
        .unwrap();
    let mut msgs = Vec::new();
    for i in 0..300 {
        let at = if i < 200 {
            old_day + TimeDelta::seconds(i * 300)
        } else {
            recent
        };
        let tenant = TENANTS[i as usize % TENANTS.len()];
        msgs.push((tenant.to_owned(), event(&mut rng, at, tenant).to_json()));
    }
    let landed = stack.produce_tracked(&stack.producer(), &msgs).await;
    let total = landed.len() as i64;

    // Ingest stores everything; no archiver runs yet.
    let mut env = stack.env();
    env.insert(
        "INGEST_METRICS_ADDR".into(),
        format!("127.0.0.1:{}", free_port()),
    );
    env.insert("INGEST_LINGER_MS".into(), "50".into());
    let mut ingest = Service::start("ingest", "ingest", &[], env, stack.dir.path())
        .unwrap_or_else(|e| panic!("{e}"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (n,): (i64,) =
            sqlx::query_as("SELECT coalesce(sum(next_offset), 0)::bigint FROM consumer_offsets")
                .fetch_one(&stack.pool)
                .await
                .unwrap();
        if n == total {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "ingest stored {n} of {total}:\n{}",
            ingest.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ingest.terminate(Duration::from_secs(30)).await;

    let rule = ArchiveRule::Require {
        group: group.clone(),
    };
    let today = Utc::now().date_naive();
    let day = old_day.date_naive();
    assert!(retention::drop_expired(&stack.pool, today, 30, &rule)
        .await
        .unwrap()
        .is_empty());
    assert!(retention::partitions(&stack.pool)
        .await
        .unwrap()
        .contains(&day));
    let behind = retention::behind(&stack.pool, day, &group).await.unwrap();
    assert!(!behind.is_empty());
    let barrier: BTreeMap<i32, i64> = behind.iter().map(|b| (b.partition, b.barrier)).collect();

    // The archiver catches up to the barrier; then the day goes.
    let metrics_port = free_port();
    let mut svc = archiver(
        &stack,
        &group,
        &root,
        "archiver",
        &[
            ("ARCHIVE_LINGER_MS", "200"),
            ("ARCHIVE_METRICS_ADDR", &format!("127.0.0.1:{metrics_port}")),
        ],
    );
    wait_archived(&stack, &group, &barrier, &svc).await;
    let dropped = retention::drop_expired(&stack.pool, today, 30, &rule)
        .await
        .unwrap();
    assert_eq!(dropped, vec![day]);

    // The dropped day is in the archive: 200 events under its date= folder.
    let (rows,): (i64,) = sqlx::query_as(
        "SELECT coalesce(sum(rows), 0)::bigint FROM archive_manifest
         WHERE consumer_group = $1 AND day = $2",
    )
    .bind(&group)
    .bind(day)
    .fetch_one(&stack.pool)
    .await
    .unwrap();
    assert_eq!(rows, 200);

    // Lag comes from the broker's statistics (each second): it reaches 0
    // in every partition once the archiver has caught up.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let text = loop {
        let text = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let lags: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("archive_lag{"))
            .collect();
        if lags.len() == 4 && lags.iter().all(|l| l.ends_with(" 0")) {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "archive_lag should be 0 in 4 partitions:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        text.lines()
            .any(|l| l == format!("archive_rows_total {total}")),
        "{text}"
    );
    for name in [
        "archive_files_total",
        "archive_bytes_total",
        "archive_commit_seconds",
        "archive_lag{partition=",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
    svc.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn bad_archiver_settings_exit_non_zero_naming_the_setting() {
    for (var, value) in [
        ("ARCHIVE_MAX_BATCH", "0"),
        ("ARCHIVE_LINGER_MS", "0"),
        ("ARCHIVE_URL", "s3://bucket/archive"),
        ("ARCHIVE_TOPIC", "bad/topic"),
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

#[tokio::test]
async fn orphans_are_never_listed_and_gc_deletes_only_those_the_offsets_passed() {
    use ingest::archive::manifest::{self, Entry, Outcome};
    use ingest::archive::{store, verify};
    let fresh_db = tests::stack::fresh_database("orphans").await;
    let pool = fresh_db.pool.clone();
    let dir = tempfile::tempdir().unwrap();
    let store = store::open(dir.path().to_str().unwrap()).unwrap();
    let key = ingest::offsets::ConsumerKey {
        group: "archiver".into(),
        topic: "usage.events.v1".into(),
    };
    let hour = Utc::now().duration_trunc(TimeDelta::hours(1)).unwrap();
    let folder = hour.format("date=%Y-%m-%d/hour=%H").to_string();
    let file =
        |first: i64, last: i64| format!("{folder}/usage.events.v1-p0-o{first}-{last}.parquet");
    let mut rng = StdRng::seed_from_u64(3);
    let rows = vec![ArchivedEvent {
        partition: 0,
        offset: 0,
        event: event(&mut rng, hour, "acme-corp"),
    }];
    let bytes = writer::encode(&rows).unwrap();
    // A crashed batch wrote o0-9; the redone one, o0-14, committed.
    for path in [file(0, 9), file(0, 14), file(15, 20)] {
        store::put(store.as_ref(), &path, bytes.clone().into())
            .await
            .unwrap();
    }
    let entry = Entry {
        partition: 0,
        first_offset: 0,
        last_offset: 14,
        path: Some(file(0, 14)),
        hour: Some(hour),
        rows: 1,
        skipped: 0,
        bytes: bytes.len() as i64,
        sha256: Some(Sha256::digest(&bytes).into()),
    };
    let outcome = manifest::commit(
        &pool,
        &key,
        &BTreeMap::from([(0, None)]),
        &BTreeMap::from([(0, 15)]),
        std::slice::from_ref(&entry),
    )
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Committed);
    // A zombie that still believes in offset None cannot commit anything.
    let zombie = manifest::commit(
        &pool,
        &key,
        &BTreeMap::from([(0, None)]),
        &BTreeMap::from([(0, 10)]),
        &[entry],
    )
    .await
    .unwrap();
    assert_eq!(
        zombie,
        Outcome::Stale {
            done: vec![],
            fenced: vec![0]
        }
    );

    let report = verify::verify(&pool, store.as_ref(), &key).await.unwrap();
    assert!(report.ok(), "{:?}", report.problems);
    assert_eq!(report.files, 1);
    let orphans: Vec<&str> = report.orphans.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(orphans, vec![file(0, 9).as_str(), file(15, 20).as_str()]);
    // o0-9 lies below the stored offset (15): no commit can ever list it.
    // o15-20 may still be committed by the batch that wrote it: kept.
    let deleted = verify::gc(&pool, store.as_ref(), &key).await.unwrap();
    assert_eq!(deleted, vec![file(0, 9)]);
    assert!(!dir.path().join(file(0, 9)).exists());
    assert!(dir.path().join(file(0, 14)).exists());
    assert!(dir.path().join(file(15, 20)).exists());

    // A listed file that goes missing or changes is a problem.
    std::fs::write(dir.path().join(file(0, 14)), b"not parquet").unwrap();
    let report = verify::verify(&pool, store.as_ref(), &key).await.unwrap();
    assert!(!report.ok());
}

#[tokio::test]
async fn an_idle_archiver_whose_stored_offsets_went_back_archives_again() {
    let stack = TestStack::new("archive_back").await;
    let root: PathBuf = stack.dir.path().join("archive");
    let group = format!("archiver-{}", stack.group);
    let svc = archiver(
        &stack,
        &group,
        &root,
        "archiver",
        &[("ARCHIVE_LINGER_MS", "300")],
    );
    let batch: Vec<(String, Vec<u8>)> = (0..400)
        .map(|i| {
            let e = tests::events::usage_event("acme-corp", i);
            (e.tenant_id.clone(), e.to_json())
        })
        .collect();
    let landed = stack.produce_tracked(&stack.producer(), &batch).await;
    let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
    for (p, o) in landed {
        let end = ends.entry(p).or_default();
        *end = (*end).max(o + 1);
    }
    wait_archived(&stack, &group, &ends, &svc).await;
    // Postgres goes back to before the archiver ran (a restored backup, a
    // failover to a standby that was behind): no manifest, no offsets. The
    // files stay; nothing more is produced.
    let mut tx = stack.pool.begin().await.unwrap();
    for table in ["archive_manifest", "archive_offsets"] {
        sqlx::query(&format!("DELETE FROM {table} WHERE consumer_group = $1"))
            .bind(&group)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    wait_archived(&stack, &group, &ends, &svc).await;
    assert_contiguous(&manifest(&stack, &group).await, &ends);
}
