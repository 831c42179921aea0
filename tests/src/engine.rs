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

/// A `seed` for which the simulated model answers a prompt of
/// `prompt_tokens` with at least `at_least` tokens (answers are 16 to 600
/// tokens, fixed by seed and prompt length), so a request meant to stay
/// in flight does not end early on a fast or a slow machine.
pub fn seed_for_long_answer(prompt_tokens: u64, at_least: u32) -> u64 {
    (0..10_000)
        .find(|&s| engine::simulator::natural_output_tokens(s, prompt_tokens) >= at_least)
        .expect("a seed for a long answer")
}

/// One entry of the gateway's upstreams file as for a vLLM replica: `model`
/// at `url` on 1 GPU, its requests signed with the secret in
/// [`SECRET_ENV`], named `replica_id`, its GPU time derived from the
/// gateways' ledger, its KV polled every `kv_poll_ms` (0: never); then
/// `extra`, YAML lines of the entry (`"    dedicated_to: acme\n"`).
pub fn vllm_entry(
    model: &str,
    url: &str,
    max_context: u32,
    replica_id: &str,
    kv_poll_ms: u32,
    extra: &str,
) -> String {
    format!(
        "  - model: {model}\n    url: {url}\n    gpus: 1\n    max_context: {max_context}\n    replica_id: {replica_id}\n    gpu_time: derived\n    kv_poll_ms: {kv_poll_ms}\n    identity_secret_env: {SECRET_ENV}\n{extra}"
    )
}

/// Writes an upstreams file of `entries` ([`vllm_entry`]) at `path`; the
/// path as the gateway's `GATEWAY_UPSTREAMS` takes it.
pub fn write_upstreams(path: &Path, entries: &[String]) -> String {
    std::fs::write(path, format!("upstreams:\n{}", entries.concat())).expect("write upstreams");
    path.display().to_string()
}
