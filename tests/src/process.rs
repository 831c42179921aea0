//! Meterline's binaries as child processes, through the dev stack's
//! [`Service`]; the panicking forms a test wants.

use std::path::PathBuf;
use std::time::Duration;

pub use devstack::Service;

/// Where cargo put the workspace binaries (`target/<profile>/`).
pub fn bin_dir() -> PathBuf {
    devstack::process::bin_dir().unwrap_or_else(|e| panic!("{e}"))
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    devstack::health::free_port().unwrap_or_else(|e| panic!("{e}"))
}

/// Polls `url` until it answers 200, or panics with the service's log.
pub async fn wait_healthy(url: &str, service: &mut Service, within: Duration) {
    devstack::health::wait_http(url, service, within)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}
