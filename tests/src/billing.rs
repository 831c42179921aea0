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

/// Starts billing-api on `database_url` with `config/price-book.yaml`
/// loaded and `finance_token` registered (hashed) at start-up, and waits
/// until `/healthz` answers.
pub async fn start_billing_api(database_url: &str, finance_token: &str) -> BillingApi {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let env = HashMap::from([
        ("DATABASE_URL".to_owned(), database_url.to_owned()),
        ("BILLING_ADDR".to_owned(), format!("127.0.0.1:{port}")),
        (
            "BILLING_BOOTSTRAP_FINANCE_TOKEN".to_owned(),
            finance_token.to_owned(),
        ),
        (
            "BILLING_PRICE_BOOK_FILE".to_owned(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/../config/price-book.yaml").to_owned(),
        ),
    ]);
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
