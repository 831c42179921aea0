//! Meterline's binaries as child processes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// Where cargo put the workspace binaries: `target/<profile>/`, two levels
/// above the test executable in `target/<profile>/deps/`.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .to_path_buf()
}

/// A running service; killed when dropped.
pub struct Service {
    pub name: String,
    bin: PathBuf,
    args: Vec<String>,
    env: HashMap<String, String>,
    child: Option<Child>,
    log: PathBuf,
}

impl Service {
    /// Starts `bin` with `env`; output goes to a log file in `log_dir`.
    pub fn start(
        name: &str,
        bin: &str,
        args: &[&str],
        env: HashMap<String, String>,
        log_dir: &std::path::Path,
    ) -> Self {
        let path = bin_dir().join(bin);
        assert!(
            path.exists(),
            "{} not found: run `cargo build --bins` before the end-to-end tests",
            path.display()
        );
        let mut s = Self {
            name: name.to_owned(),
            bin: path,
            args: args.iter().map(|a| a.to_string()).collect(),
            env,
            child: None,
            log: log_dir.join(format!("{name}.log")),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open log");
        let child = Command::new(&self.bin)
            .args(&self.args)
            .envs(&self.env)
            .env("RUST_LOG", "info,rdkafka=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn service");
        self.child = Some(child);
    }

    /// SIGKILL: no chance to flush anything.
    pub async fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }

    /// SIGTERM, then wait for a clean exit (SIGKILL after `grace`).
    pub async fn terminate(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        if let Some(pid) = c.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        match tokio::time::timeout(grace, c.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                let _ = c.start_kill();
                c.wait().await.ok()
            }
        }
    }

    /// Starts again (after a kill) with some settings changed.
    pub fn restart_with(&mut self, changes: &[(&str, &str)]) {
        for (k, v) in changes {
            self.env.insert((*k).to_owned(), (*v).to_owned());
        }
        self.restart();
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// Starts the same command again (after a kill).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "{} is still running", self.name);
        self.spawn();
    }

    /// Whether the process has exited, and how.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The service's log so far (for assertion messages).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Polls `url` until it answers 200, or panics with the service's log.
pub async fn wait_healthy(url: &str, service: &mut Service, within: Duration) {
    let client = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Ok(r) = client.get(url).send().await {
            if r.status().is_success() {
                return;
            }
        }
        if let Some(status) = service.exited() {
            panic!(
                "{} exited with {status} before it was healthy:\n{}",
                service.name,
                service.log_tail()
            );
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "{} not healthy at {url} within {within:?}:\n{}",
                service.name,
                service.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
