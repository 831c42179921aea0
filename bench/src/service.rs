//! A Meterline service binary as a child process of a benchmark: found next
//! to the benchmark's own executable (`target/<profile>/`, where cargo puts
//! every binary of the workspace), started with its output in a log file,
//! watched, stopped with SIGTERM or killed.
//!
//! This moves to the `devstack` crate, which provides service processes by
//! handle for tests, benchmarks and the demo; until then the benchmarks
//! share this copy.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rustix::process::{kill_process, Pid, Signal};
use tokio::process::{Child, Command};

/// A free address on 127.0.0.1 (a port the OS just gave out, released) for
/// a service to listen on.
pub fn free_addr() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// `target/<profile>/<bin>`: the binary `bin` of the workspace package
/// `package`, next to this executable (or, from a test executable in
/// `target/<profile>/deps/`, one level up). Fails, naming the command that
/// builds it, if cargo has not built it in this profile.
pub fn binary(bin: &str, package: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().context("the executable has no directory")?;
    if dir.file_name() == Some(OsStr::new("deps")) {
        dir = dir.parent().unwrap_or(dir);
    }
    let path = dir.join(bin);
    if !path.exists() {
        let flag = match dir.file_name().and_then(OsStr::to_str) {
            Some("debug") | None => String::new(),
            Some("release") => " --release".to_owned(),
            Some(other) => format!(" --profile {other}"),
        };
        bail!(
            "{} not found: build it with `cargo build{flag} -p {package} --bin {bin}` \
             (a benchmark starts the service binary next to its own executable)",
            path.display()
        );
    }
    Ok(path)
}

/// How a service ended after [`Service::terminate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// It exited with status 0.
    Cleanly,
    /// It exited with another status (or its status could not be read).
    NotCleanly,
    /// It was still running after the grace period and was killed.
    Killed,
}

/// A running service binary; killed if dropped while it runs.
pub struct Service {
    name: String,
    child: Child,
    pid: u32,
    log: PathBuf,
}

impl Service {
    /// Starts `bin` of `package` (see [`binary`]) with this process's
    /// environment, `RUST_LOG=info,rdkafka=warn` and then `env` on top;
    /// stdin is closed, stdout and stderr go to the file `log`.
    pub fn start<K, V>(
        bin: &str,
        package: &str,
        env: impl IntoIterator<Item = (K, V)>,
        log: &Path,
    ) -> Result<Self>
    where
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        let path = binary(bin, package)?;
        let out =
            std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        let child = Command::new(&path)
            .env("RUST_LOG", "info,rdkafka=warn")
            .envs(env)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", path.display()))?;
        let pid = child.id().with_context(|| format!("{bin} has no pid"))?;
        Ok(Self {
            name: bin.to_owned(),
            child,
            pid,
            log: log.to_owned(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The file its stdout and stderr go to.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Fails if the process has exited, naming its log.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited with {status}; its log: {}",
                self.name,
                self.log.display()
            );
        }
        Ok(())
    }

    /// Sends SIGTERM (a service drains, commits what it holds and exits);
    /// [`Self::wait_stopped`] waits for it. Several services can be sent
    /// SIGTERM first and waited for afterwards, so that they stop together.
    pub fn terminate(&self) {
        if let Some(pid) = i32::try_from(self.pid).ok().and_then(Pid::from_raw) {
            // It may have exited already: nothing to do then.
            let _ = kill_process(pid, Signal::TERM);
        }
    }

    /// Waits for the exit after [`Self::terminate`]; SIGKILL after `grace`.
    pub async fn wait_stopped(mut self, grace: Duration) -> Stopped {
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(Ok(status)) if status.success() => Stopped::Cleanly,
            Ok(_) => Stopped::NotCleanly,
            Err(_) => {
                self.kill().await;
                Stopped::Killed
            }
        }
    }

    /// [`Self::terminate`], then [`Self::wait_stopped`].
    pub async fn stop(self, grace: Duration) -> Stopped {
        self.terminate();
        self.wait_stopped(grace).await
    }

    /// SIGKILL, and waits for the exit.
    pub async fn kill(&mut self) -> Option<ExitStatus> {
        let _ = self.child.start_kill();
        self.child.wait().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_names_the_command_that_builds_it() {
        let err = binary("no-such-service", "no-such-package").unwrap_err();
        let message = format!("{err:#}");
        assert!(
            message.contains("`cargo build -p no-such-package --bin no-such-service`"),
            "{message}"
        );
    }
}
