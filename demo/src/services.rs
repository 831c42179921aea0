//! The demo's services — gateway-lite, ingest, the archiver and
//! billing-api — started detached through the dev stack, so they keep
//! running after the demo (for curl, the metrics, a second look), each
//! with its pid file and log in `.stack/demo/`; `demo stop` stops them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use devstack::process::{self, Detached, Spec};

/// The services, in start order (stopped in the reverse order).
const SERVICES: [(&str, &str, Option<&str>); 4] = [
    (
        "gateway",
        "gateway-lite",
        Some("http://127.0.0.1:8080/healthz"),
    ),
    ("ingest", "ingest", Some("http://127.0.0.1:9101/metrics")),
    (
        "archiver",
        "archiver",
        Some("http://127.0.0.1:9102/metrics"),
    ),
    (
        "billing",
        "billing-api",
        Some("http://127.0.0.1:8082/healthz"),
    ),
];

/// Where the demo keeps its pid files, logs, outbox and archive.
pub struct RunDir(pub PathBuf);

impl RunDir {
    pub fn new(root: &Path) -> anyhow::Result<Self> {
        let dir = root.join(".stack/demo");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }

    fn pid_file(&self, name: &str) -> PathBuf {
        self.0.join(format!("{name}.pid"))
    }

    fn log(&self, name: &str) -> PathBuf {
        self.0.join(format!("{name}.log"))
    }

    /// Stops what an earlier run left running (SIGTERM: the gateway drains
    /// its outbox, ingest commits its batch, the archiver writes what it
    /// holds).
    pub async fn stop(&self) {
        for (name, ..) in SERVICES.iter().rev() {
            if let Some(service) = Detached::find(name, &self.pid_file(name), &self.log(name)) {
                service.stop(Duration::from_secs(15)).await;
            }
            let _ = std::fs::remove_file(self.pid_file(name));
        }
    }

    /// Starts every service with `env` (on top of the demo's own
    /// environment) and waits until each answers.
    pub async fn start(&self, env: &HashMap<String, String>) -> anyhow::Result<()> {
        for (name, bin, health) in SERVICES {
            let spec = Spec::new(name, process::workspace_bin(bin)?, self.log(name))
                .envs(env.clone())
                .envs([(
                    "RUST_LOG",
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "info,rdkafka=warn".into()),
                )]);
            let mut service = Detached::start(&spec, &self.pid_file(name))?;
            if let Some(url) = health {
                devstack::health::wait_http(url, &mut service, Duration::from_secs(60)).await?;
            }
        }
        Ok(())
    }
}
