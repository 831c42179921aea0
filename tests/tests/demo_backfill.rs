#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! The demo's backfilled month, end to end on a small sample: the `demo`
//! binary (what `scripts/demo.sh` runs) produces an ended month through the
//! real pipeline, finalizes it and prints the invoices billing-api holds;
//! a second run finds the month finalized, skips the backfill and prints
//! the same invoices, unchanged. The pages' URLs it prints come with a
//! token per role that billing-api takes, and its /metrics URL with the
//! token that scrapes it.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use tests::process::{bin_dir, free_port};
use tests::TestStack;

const EVENTS: &str = "3000";

struct Demo {
    env: Vec<(String, String)>,
}

impl Demo {
    /// Runs `demo` with `args`; its whole output, and whether it succeeded.
    async fn run(&self, args: &[&str]) -> (String, bool) {
        let mut cmd = tokio::process::Command::new(bin_dir().join("demo"));
        cmd.args(args)
            .envs(self.env.iter().cloned())
            .env("RUST_LOG", "warn")
            .kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(600), cmd.output())
            .await
            .expect("the demo finished within 10 minutes")
            .expect("run demo");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (text, out.status.success())
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        // The demo leaves its services running: stop them, passed or not.
        let _ = std::process::Command::new(bin_dir().join("demo"))
            .arg("stop")
            .envs(self.env.iter().cloned())
            .status();
    }
}

fn hashes(output: &str) -> BTreeSet<String> {
    output
        .lines()
        .filter_map(|l| l.trim().strip_prefix("content hash "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_finalizes_a_backfilled_month_once_and_prints_it_unchanged_again() {
    let stack = TestStack::new("demo").await;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let addr = || format!("127.0.0.1:{}", free_port());
    let billing_addr = addr();
    let demo = Demo {
        env: [
            ("METERLINE_ROOT", root.display().to_string()),
            ("DATABASE_URL", stack.database_url.clone()),
            ("KAFKA_BROKERS", stack.brokers.clone()),
            ("GATEWAY_TOPIC", stack.topic.clone()),
            ("INGEST_GROUP", stack.group.clone()),
            (
                "DEMO_RUN_DIR",
                stack.dir.path().join("run").display().to_string(),
            ),
            (
                "ARCHIVE_URL",
                stack.dir.path().join("archive").display().to_string(),
            ),
            ("GATEWAY_ADDR", addr()),
            ("BILLING_ADDR", billing_addr.clone()),
            ("INGEST_METRICS_ADDR", addr()),
            ("ARCHIVE_METRICS_ADDR", addr()),
            ("DEMO_BACKFILL_EVENTS", EVENTS.to_owned()),
            ("DEMO_SECONDS", "2".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
    };

    let (first, ok) = demo.run(&[]).await;
    assert!(ok, "the first demo run failed:\n{first}");
    assert!(
        first.contains("backfilling ") && first.contains(&format!("{EVENTS} events")),
        "the first run backfills the month:\n{first}"
    );
    assert!(
        first.contains("billed exactly what was produced (requests, prompt, cached and output tokens, GPU-seconds, every tenant): yes"),
        "{first}"
    );
    let printed = hashes(&first);
    assert_eq!(
        printed.len(),
        5,
        "one invoice per reference tenant:\n{first}"
    );
    // What the demo printed is what billing-api stored when it finalized.
    let stored: BTreeSet<String> = sqlx::query_as::<_, (String,)>(
        "SELECT encode(content_hash, 'hex') FROM invoices WHERE status = 'finalized'",
    )
    .fetch_all(&stack.pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(h,)| h)
    .collect();
    assert_eq!(
        stored, printed,
        "the printed invoices are the finalized ones"
    );
    assert_eq!(
        stack
            .count("SELECT count(*) FROM request_log WHERE gateway_id = 'backfill'")
            .await,
        EVENTS.parse::<i64>().unwrap(),
        "every backfilled event is billed once"
    );

    // The demo ends with the pages' URLs and a working sign-in token per role.
    let base = format!("http://{billing_addr}");
    assert!(
        first.contains(&format!("pages: open {base}/sign-in")),
        "the pages' block:\n{first}"
    );
    let token_of = |who: &str| -> String {
        first
            .lines()
            .find_map(|l| l.strip_prefix(&format!("  {who}: token ")))
            .unwrap_or_else(|| panic!("no token for {who}:\n{first}"))
            .trim()
            .to_owned()
    };
    let http = reqwest::Client::new();
    let status =
        |token: String, path: &str| http.get(format!("{base}{path}")).bearer_auth(token).send();
    for (who, path, expected) in [
        ("finance", "/v1/tenants/medai-labs/shadow-bill", 200),
        (
            "team lead of acme-corp",
            "/v1/tenants/acme-corp/shadow-bill",
            200,
        ),
        (
            "team lead of acme-corp",
            "/v1/tenants/medai-labs/shadow-bill",
            404,
        ),
        ("support", "/v1/tenants/acme-corp/shadow-bill", 403),
    ] {
        let got = status(token_of(who), path).await.unwrap().status();
        assert_eq!(got.as_u16(), expected, "{who} on {path}");
    }
    let signed_in = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{base}/sign-in"))
        .form(&[("token", token_of("support"))])
        .send()
        .await
        .unwrap();
    assert_eq!(
        signed_in.status().as_u16(),
        303,
        "the printed token signs in"
    );
    // ... and every /metrics URL, with the token billing-api's asks for: a
    // scrape with the printed token gets the cost metrics, one without 401.
    let metrics_line = first
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{base}/metrics ")))
        .unwrap_or_else(|| panic!("no billing-api /metrics line:\n{first}"));
    let token = metrics_line
        .split("Authorization: Bearer ")
        .nth(1)
        .and_then(|t| t.split('`').next())
        .unwrap_or_else(|| panic!("no token on {metrics_line}"));
    let scrape = http
        .get(format!("{base}/metrics"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(scrape.status().as_u16(), 200, "{metrics_line}");
    assert!(scrape.text().await.unwrap().contains("gpu_seconds_total{"));
    let anonymous = http.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    for line in first.lines().filter(|l| l.starts_with("    http")) {
        assert!(
            line.trim_start().starts_with(&format!("{base}/pages/")),
            "{line}"
        );
    }

    let (second, ok) = demo.run(&[]).await;
    assert!(ok, "the second demo run failed:\n{second}");
    assert!(
        second.contains("already finalized for every tenant") && !second.contains("backfilling "),
        "the second run skips the backfill:\n{second}"
    );
    assert_eq!(
        hashes(&second),
        printed,
        "the second run prints the same invoices"
    );
    assert_eq!(
        stack
            .count("SELECT count(*) FROM request_log WHERE gateway_id = 'backfill'")
            .await,
        EVENTS.parse::<i64>().unwrap(),
        "nothing was produced again"
    );
}
