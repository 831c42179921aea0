//! Detached processes: started by one command and found again by the
//! next through a pid file (the demo's services, the shared stack's
//! broker and Redis), so they outlive the command that started them.
//! Zombie-aware: PID 1 in a container may never reap a re-parented child.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::process::{Pid, Signal};

use crate::error::{DevstackError, Result};
use crate::process::{log_tail, Spec, Watched};

/// Starts `spec` detached: it keeps running after this process exits.
/// Returns its pid.
pub fn spawn_detached(spec: &Spec) -> Result<u32> {
    let child = spec.spawn()?;
    // Not waited for: the process is re-parented when we exit.
    Ok(child.id())
}

/// A detached process found by its pid file: it outlives the command that
/// started it (the demo's services, the stack's broker).
#[derive(Debug, Clone)]
pub struct Detached {
    pub name: String,
    pub pid: u32,
    pub log: PathBuf,
}

impl Detached {
    /// Starts `spec` detached and writes its pid to `pid_file`.
    pub fn start(spec: &Spec, pid_file: &Path) -> Result<Self> {
        let pid = spawn_detached(spec)?;
        std::fs::write(pid_file, format!("{pid}\n"))
            .map_err(DevstackError::io(pid_file.display().to_string()))?;
        Ok(Self {
            name: spec.name.clone(),
            pid,
            log: spec.log.clone(),
        })
    }

    /// The process a pid file names, if it is alive.
    pub fn find(name: &str, pid_file: &Path, log: &Path) -> Option<Self> {
        let pid: u32 = std::fs::read_to_string(pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        pid_alive(pid).then(|| Self {
            name: name.to_owned(),
            pid,
            log: log.to_path_buf(),
        })
    }

    /// SIGTERM, SIGKILL after `grace`; returns once it is gone.
    pub async fn stop(&self, grace: Duration) {
        stop_pid(self.pid, Signal::TERM, grace).await;
    }
}

impl Watched for Detached {
    fn name(&self) -> &str {
        &self.name
    }
    fn exit(&mut self) -> Option<String> {
        (!pid_alive(self.pid)).then(|| "exited".to_owned())
    }
    fn log_tail(&self) -> String {
        log_tail(&self.log, 40)
    }
}

/// Whether `pid` is a live process (a zombie is not: PID 1 in a container
/// may never reap it).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state != "Z")
}

/// The command line of `pid`, arguments separated by spaces.
pub fn cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .map(String::from_utf8_lossy)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// Stops the detached process `pid`: `signal`, then SIGKILL to its group
/// if it is still alive after `grace`. Returns once it is gone.
pub async fn stop_pid(pid: u32, signal: Signal, grace: Duration) {
    let Some(p) = Pid::from_raw(pid as i32) else {
        return;
    };
    let _ = rustix::process::kill_process(p, signal);
    let deadline = tokio::time::Instant::now() + grace;
    while pid_alive(pid) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while pid_alive(pid) {
        let _ = rustix::process::kill_process_group(p, Signal::KILL);
        let _ = rustix::process::kill_process(p, Signal::KILL);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
