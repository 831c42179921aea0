//! billing-api as a process for end-to-end tests: on a database the test
//! has prepared, with the reference price book and a finance token.

use std::collections::HashMap;
use std::time::Duration;

use crate::process::{free_port, wait_healthy};
use crate::Service;

/// A running billing-api and where it answers. Its log is in `dir`.
pub struct BillingApi {
    pub service: Service,
    pub url: String,
    pub dir: tempfile::TempDir,
}

/// The bearer token every test billing-api asks for on `/metrics`.
pub const METRICS_TOKEN: &str = "metrics-token-for-tests-0001";

/// Starts billing-api on `database_url` with `config/price-book.yaml`
/// loaded and `finance_token` registered (hashed) at start-up, and waits
/// until `/healthz` answers.
pub async fn start_billing_api(database_url: &str, finance_token: &str) -> BillingApi {
    start_billing_api_with(database_url, finance_token, &[]).await
}

/// [`start_billing_api`] with more settings, e.g. `BILLING_TENANTS_FILE`.
pub async fn start_billing_api_with(
    database_url: &str,
    finance_token: &str,
    extra: &[(&str, String)],
) -> BillingApi {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut env = HashMap::from([
        ("DATABASE_URL".to_owned(), database_url.to_owned()),
        ("BILLING_ADDR".to_owned(), format!("127.0.0.1:{port}")),
        (
            "BILLING_BOOTSTRAP_FINANCE_TOKEN".to_owned(),
            finance_token.to_owned(),
        ),
        ("BILLING_METRICS_TOKEN".to_owned(), METRICS_TOKEN.to_owned()),
        (
            "BILLING_PRICE_BOOK_FILE".to_owned(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/../config/price-book.yaml").to_owned(),
        ),
    ]);
    env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    let mut service = Service::start("billing", "billing-api", &[], env, dir.path())
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!("http://127.0.0.1:{port}");
    wait_healthy(
        &format!("{url}/healthz"),
        &mut service,
        Duration::from_secs(60),
    )
    .await;
    BillingApi { service, url, dir }
}

/// The reference tenants (`config/tenants.yaml`).
pub const REFERENCE_TENANTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/tenants.yaml");

/// Seeds the tenants, keys and limits in `file` on `database_url` the way
/// an operator does, with `billing-api tenants apply` (billing-api owns
/// tenant administration; the gateway only reads it). Panics with the
/// command's output if it is refused.
pub fn apply_tenants(database_url: &str, file: &str) {
    let out = std::process::Command::new(crate::process::bin_dir().join("billing-api"))
        .args(["tenants", "apply", file])
        .env("DATABASE_URL", database_url)
        .output()
        .expect("run billing-api tenants apply");
    assert!(
        out.status.success(),
        "billing-api tenants apply {file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
