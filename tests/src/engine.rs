//! The `engine` binary as a real process, and the signed identity its chat
//! completions require (`x-meterline-identity`, see `engine::identity`).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use engine::identity::{self, Secret, Signer};
use engine::ServiceClass;

use crate::process::{free_port, wait_healthy};
use crate::Service;

/// The engine's setting, and the variable the tests' upstreams files name
/// in `identity_secret_env` (the gateway gets the same variable).
pub const SECRET_ENV: &str = "ENGINE_IDENTITY_SECRET";

/// A fresh secret for one test: 32 random bytes as 64 hex characters.
pub fn random_secret() -> String {
    (0..32)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A signer for `secret`.
pub fn signer(secret: &str) -> Signer {
    Signer::new(Secret::new(secret).unwrap_or_else(|e| panic!("test secret {e}")))
}

/// A valid `x-meterline-identity` for `tenant` (standard class).
pub fn signed(secret: &str, tenant: &str) -> String {
    signer(secret).sign(tenant, ServiceClass::Standard, now())
}

/// The header's name.
pub const HEADER: &str = identity::HEADER;

/// Starts the `engine` binary on a free port at `speedup`, checking
/// identities with `secret`; waits until it is healthy. Its base URL.
pub async fn start_engine(dir: &Path, speedup: u32, secret: &str) -> (Service, String) {
    start_engine_with(dir, speedup, secret, &[]).await
}

/// [`start_engine`] with more settings (`ENGINE_REPLICAS`, …).
pub async fn start_engine_with(
    dir: &Path,
    speedup: u32,
    secret: &str,
    settings: &[(&str, &str)],
) -> (Service, String) {
    let port = free_port();
    let mut env = HashMap::from([
        ("ENGINE_ADDR".to_owned(), format!("127.0.0.1:{port}")),
        ("ENGINE_SPEEDUP".to_owned(), speedup.to_string()),
        (SECRET_ENV.to_owned(), secret.to_owned()),
    ]);
    env.extend(
        settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let mut engine =
        Service::start("engine", "engine", &[], env, dir).unwrap_or_else(|e| panic!("{e}"));
    let url = format!("http://127.0.0.1:{port}");
    wait_healthy(
        &format!("{url}/health"),
        &mut engine,
        Duration::from_secs(60),
    )
    .await;
    (engine, url)
}
