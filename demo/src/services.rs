//! The demo's services — gateway-lite, ingest, the archiver and
//! billing-api — started detached through the dev stack, so they keep
//! running after the demo (for curl, the metrics, a second look), each
//! with its pid file and log in `.stack/demo/`; `demo stop` stops them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use devstack::detached::Detached;
use devstack::process::{self, Spec};

/// Where the services listen (each service's own setting, passed on).
#[derive(Debug, Clone)]
pub struct Addrs {
    pub gateway: String,
    pub billing: String,
    pub ingest_metrics: String,
    pub archive_metrics: String,
}

impl Addrs {
    /// (name, binary, the address setting, its value, the health URL), in
    /// start order (stopped in the reverse order).
    fn services(&self) -> [(&'static str, &'static str, &'static str, &str, String); 4] {
        [
            (
                "gateway",
                "gateway-lite",
                "GATEWAY_ADDR",
                &self.gateway,
                format!("http://{}/healthz", self.gateway),
            ),
            (
                "ingest",
                "ingest",
                "INGEST_METRICS_ADDR",
                &self.ingest_metrics,
                format!("http://{}/metrics", self.ingest_metrics),
            ),
            (
                "archiver",
                "archiver",
                "ARCHIVE_METRICS_ADDR",
                &self.archive_metrics,
                format!("http://{}/metrics", self.archive_metrics),
            ),
            (
                "billing",
                "billing-api",
                "BILLING_ADDR",
                &self.billing,
                format!("http://{}/healthz", self.billing),
            ),
        ]
    }
}

impl Addrs {
    /// The block the demo prints about metrics: every service's `/metrics`
    /// URL, and the bearer token billing-api's asks for (its
    /// `BILLING_METRICS_TOKEN`; the others ask for none).
    pub fn metrics(&self, billing_token: &str) -> String {
        format!(
            "metrics (Prometheus' text format):\n\
             \x20 http://{}/metrics  (gateway)\n\
             \x20 http://{}/metrics  (ingest)\n\
             \x20 http://{}/metrics  (archiver)\n\
             \x20 http://{}/metrics  (billing-api; send `Authorization: Bearer {billing_token}`, its BILLING_METRICS_TOKEN)\n",
            self.gateway, self.ingest_metrics, self.archive_metrics, self.billing
        )
    }
}

const NAMES: [&str; 4] = ["gateway", "ingest", "archiver", "billing"];

/// Where the demo keeps its pid files, logs, outbox and archive.
pub struct RunDir(pub PathBuf);

impl RunDir {
    pub fn new(dir: &Path) -> anyhow::Result<Self> {
        let dir = dir.to_path_buf();
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
        for name in NAMES.iter().rev() {
            if let Some(service) = Detached::find(name, &self.pid_file(name), &self.log(name)) {
                service.stop(Duration::from_secs(15)).await;
            }
            let _ = std::fs::remove_file(self.pid_file(name));
        }
    }

    /// Starts every service with `env` (on top of the demo's own
    /// environment) and waits until each answers.
    pub async fn start(&self, env: &HashMap<String, String>, addrs: &Addrs) -> anyhow::Result<()> {
        for (name, bin, setting, addr, health) in addrs.services() {
            let spec = Spec::new(name, process::workspace_bin(bin)?, self.log(name))
                .envs(env.clone())
                .envs([(setting, addr.to_owned())])
                .envs([(
                    "RUST_LOG",
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "info,rdkafka=warn".into()),
                )]);
            let mut service = Detached::start(&spec, &self.pid_file(name))?;
            devstack::health::wait_http(&health, &mut service, Duration::from_secs(60)).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Addrs;

    #[test]
    fn the_metrics_block_names_every_url_and_billing_apis_token() {
        let addrs = Addrs {
            gateway: "127.0.0.1:8080".into(),
            billing: "127.0.0.1:8082".into(),
            ingest_metrics: "127.0.0.1:9101".into(),
            archive_metrics: "127.0.0.1:9102".into(),
        };
        let text = addrs.metrics("demo-metrics-token-0001");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "metrics (Prometheus' text format):");
        assert_eq!(lines[1], "  http://127.0.0.1:8080/metrics  (gateway)");
        assert_eq!(
            lines[4],
            "  http://127.0.0.1:8082/metrics  (billing-api; send `Authorization: Bearer demo-metrics-token-0001`, its BILLING_METRICS_TOKEN)"
        );
        assert_eq!(lines.len(), 5);
    }
}
