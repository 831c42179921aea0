//! Processes by handle: a [`Service`] is a child the caller owns (killed
//! when dropped), started again on the same command after a crash (a
//! process that must outlive its starter is a
//! [`Detached`](crate::detached::Detached)); the workspace's binaries; the
//! commands the stack runs to completion.
//!
//! Every process starts in a process group of its own, so a SIGKILL takes
//! whatever it forked too (a Postgres postmaster's backends, as a power
//! loss would), and a Ctrl-C in the terminal reaches the test runner only.
//! Nothing is ever found or killed by name.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use crate::error::{DevstackError, Result};

/// The OS user a process runs as (Postgres refuses to run as root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// How to start a process: program, arguments, environment (on top of the
/// caller's own), working directory, log file and user.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The name errors and logs use ("ingest", "private postgres").
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: HashMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// Standard output and error are appended here.
    pub log: PathBuf,
    pub owner: Option<Owner>,
}

impl Spec {
    /// `program` named `name`, logging to `log`.
    pub fn new(name: &str, program: impl Into<PathBuf>, log: impl Into<PathBuf>) -> Self {
        Self {
            name: name.to_owned(),
            program: program.into(),
            args: Vec::new(),
            env: HashMap::new(),
            cwd: None,
            log: log.into(),
            owner: None,
        }
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets environment variables (on top of the caller's environment).
    pub fn envs<I, K, V>(mut self, vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.env
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Runs in `dir`.
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Runs as `owner`.
    pub fn owner(mut self, owner: Option<Owner>) -> Self {
        self.owner = owner;
        self
    }

    pub(crate) fn spawn(&self) -> Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(DevstackError::io(format!("log {}", self.log.display())))?;
        let err = log
            .try_clone()
            .map_err(DevstackError::io(format!("log {}", self.log.display())))?;
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(&self.env)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .process_group(0);
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        if let Some(owner) = self.owner {
            cmd.uid(owner.uid).gid(owner.gid);
        }
        cmd.spawn().map_err(|source| DevstackError::Spawn {
            what: self.name.clone(),
            program: self.program.clone(),
            source,
        })
    }
}

/// A running child process; SIGKILLed (with its process group) when dropped.
#[derive(Debug)]
pub struct Service {
    spec: Spec,
    child: Option<Child>,
}

impl Service {
    /// Starts `spec`.
    pub fn spawn(spec: Spec) -> Result<Self> {
        let child = spec.spawn()?;
        Ok(Self {
            spec,
            child: Some(child),
        })
    }

    /// Starts one of the workspace's binaries (`target/<profile>/<bin>`,
    /// see [`workspace_bin`]) with `env`, logging to `<log_dir>/<name>.log`.
    /// `RUST_LOG` defaults to `info,rdkafka=warn`.
    pub fn start(
        name: &str,
        bin: &str,
        args: &[&str],
        env: HashMap<String, String>,
        log_dir: &Path,
    ) -> Result<Self> {
        let mut spec = Spec::new(
            name,
            workspace_bin(bin)?,
            log_dir.join(format!("{name}.log")),
        )
        .args(args.iter().copied())
        .envs(env);
        spec.env
            .entry("RUST_LOG".into())
            .or_insert_with(|| "info,rdkafka=warn".into());
        Self::spawn(spec)
    }

    /// The service's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL to the service's whole process group: no chance to flush
    /// anything. Returns once no member of the group is alive.
    pub async fn kill9(&mut self) {
        if let Some(child) = self.child.take() {
            kill_group(child);
        }
    }

    /// Sends SIGTERM and returns at once (a service drains, commits what
    /// it holds and exits); [`wait_exit`](Self::wait_exit) waits for it, so
    /// several services can be told first and waited for together.
    pub fn signal_term(&self) {
        if let Some(pid) = self
            .child
            .as_ref()
            .and_then(|c| Pid::from_raw(c.id() as i32))
        {
            let _ = rustix::process::kill_process(pid, Signal::TERM);
        }
    }

    /// Waits for the exit; SIGKILL (to the group) after `grace`. The exit
    /// status (`None` if it was not running or had to be killed).
    pub async fn wait_exit(&mut self, grace: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                _ => {
                    kill_group(child);
                    return None;
                }
            }
        }
    }

    /// SIGTERM, then waits for the exit; SIGKILL after `grace`. The exit
    /// status, or `None` if the process was not running or was killed.
    pub async fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.signal_term();
        self.wait_exit(grace).await
    }

    /// Starts the same command again (after [`kill9`](Self::kill9) or
    /// [`terminate`](Self::terminate)).
    pub fn restart(&mut self) -> Result<()> {
        if self.child.is_some() {
            return Err(DevstackError::Conflict(format!(
                "{} is still running; kill or terminate it before restarting",
                self.spec.name
            )));
        }
        self.child = Some(self.spec.spawn()?);
        Ok(())
    }

    /// Starts again with some environment variables changed.
    pub fn restart_with(&mut self, changes: &[(&str, &str)]) -> Result<()> {
        for (k, v) in changes {
            self.spec.env.insert((*k).to_owned(), (*v).to_owned());
        }
        self.restart()
    }

    /// Whether the process has exited, and how (`None` while it runs or
    /// after a kill).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Fails if the service has exited (whoever waits on it would wait for
    /// nothing), naming it, its exit status and the end of its log.
    pub fn check_running(&mut self) -> Result<()> {
        match self.exited() {
            None => Ok(()),
            Some(status) => Err(DevstackError::Exited {
                what: self.spec.name.clone(),
                status: status.to_string(),
                log: format!(" (log {}):\n{}", self.spec.log.display(), self.log_tail()),
            }),
        }
    }

    /// The path of the service's log.
    pub fn log_path(&self) -> &Path {
        &self.spec.log
    }

    /// The last 40 lines of the service's log (for error messages).
    pub fn log_tail(&self) -> String {
        log_tail(&self.spec.log, 40)
    }

    /// Its whole log so far (to look for a message that a backtrace, with
    /// `RUST_BACKTRACE=1`, would push out of the tail).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.spec.log).unwrap_or_default()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            kill_group(child);
        }
    }
}

/// SIGKILL to `child`'s process group, repeated until no live process is
/// left in it (a process forked at the moment of the first signal can
/// outlive it), then reaps the child.
fn kill_group(mut child: Child) {
    let Some(pid) = Pid::from_raw(child.id() as i32) else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
        let _ = child.try_wait();
        if live_group_members(pid.as_raw_nonzero().get()) == 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.wait();
}

/// Something [`health`](crate::health) can watch while it waits: a name,
/// whether it has exited, and its log.
pub trait Watched {
    /// The name errors use.
    fn name(&self) -> &str;
    /// How it exited, once it has (`None` while it runs).
    fn exit(&mut self) -> Option<String>;
    /// The last lines of its log.
    fn log_tail(&self) -> String;
}

impl Watched for Service {
    fn name(&self) -> &str {
        &self.spec.name
    }
    fn exit(&mut self) -> Option<String> {
        self.exited().map(|s| s.to_string())
    }
    fn log_tail(&self) -> String {
        Service::log_tail(self)
    }
}

/// Live (not zombie) processes of process group `group`, from
/// `/proc/<pid>/stat`: the state is the first field after the command's
/// closing parenthesis, the process group the third.
pub fn live_group_members(group: i32) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            fields.first().is_some_and(|state| *state != "Z")
                && fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(group)
        })
        .count()
}

/// The last `lines` lines of the file at `path` (empty if unreadable).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Where cargo put the workspace's binaries: the directory of the running
/// executable, or its parent when that is `deps/` (a test executable).
/// `METERLINE_BIN_DIR` overrides it.
pub fn bin_dir() -> Result<PathBuf> {
    if let Ok(dir) = std::env::var("METERLINE_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().map_err(DevstackError::io("the running executable"))?;
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    Ok(if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().map(Path::to_path_buf).unwrap_or(dir)
    } else {
        dir
    })
}

/// The path of workspace binary `bin`, which must exist.
pub fn workspace_bin(bin: &str) -> Result<PathBuf> {
    let path = bin_dir()?.join(bin);
    if path.exists() {
        Ok(path)
    } else {
        Err(DevstackError::Missing {
            tool: path.display().to_string(),
            fix: format!(
                "build it first: cargo build --bin {bin} (with --release for a release build)"
            ),
        })
    }
}

/// The uid and gid of OS user `user`, if it exists.
pub fn user_ids(user: &str) -> Option<Owner> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&user)).then_some(())?;
        Some(Owner {
            uid: fields.get(2)?.parse().ok()?,
            gid: fields.get(3)?.parse().ok()?,
        })
    })
}

/// Runs `cmd` to completion; an error carries its last lines of output.
pub fn run(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| DevstackError::Spawn {
            what: what.to_owned(),
            program: PathBuf::from(cmd.get_program()),
            source,
        })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        let tail: Vec<&str> = text.lines().rev().take(5).collect();
        Err(DevstackError::Command {
            command: what.to_owned(),
            detail: format!(
                "{} ({})",
                tail.into_iter().rev().collect::<Vec<_>>().join(" | "),
                out.status
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detached::pid_alive;

    #[tokio::test]
    async fn kill9_takes_the_whole_process_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A shell that forks a grandchild and waits: killing only the shell
        // would leave the sleep running.
        let spec = Spec::new("forker", "/bin/sh", dir.path().join("forker.log"))
            .args(["-c", "sleep 300 & echo $! > child.pid; wait"])
            .cwd(dir.path());
        let mut service = Service::spawn(spec).expect("spawn");
        let group = service.pid().expect("pid") as i32;
        let pid_file = dir.path().join("child.pid");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&pid_file).map_or(true, |s| s.trim().is_empty()) {
            assert!(Instant::now() < deadline, "the shell never forked");
            std::thread::sleep(Duration::from_millis(10));
        }
        let grandchild: u32 = std::fs::read_to_string(&pid_file)
            .expect("pid file")
            .trim()
            .parse()
            .expect("pid");
        assert!(pid_alive(grandchild));
        service.kill9().await;
        assert_eq!(live_group_members(group), 0);
        assert!(!pid_alive(grandchild), "the forked child outlived kill9");
    }

    #[tokio::test]
    async fn terminate_returns_the_exit_status_and_restart_runs_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = Spec::new("sleeper", "/bin/sh", dir.path().join("s.log")).args([
            "-c",
            "trap 'exit 7' TERM; echo started; while true; do sleep 0.05; done",
        ]);
        let mut service = Service::spawn(spec).expect("spawn");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let status = service
            .terminate(Duration::from_secs(10))
            .await
            .expect("was running");
        assert_eq!(status.code(), Some(7));
        assert!(service.pid().is_none());
        service.restart().expect("restart");
        assert!(service.pid().is_some());
        assert!(
            service.restart().is_err(),
            "a running service cannot be restarted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            service
                .log_tail()
                .lines()
                .filter(|l| *l == "started")
                .count(),
            2
        );
    }

    #[test]
    fn a_missing_program_names_the_service_and_the_program() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Service::spawn(Spec::new(
            "ghost",
            "/nonexistent/ghost",
            dir.path().join("g.log"),
        ))
        .expect_err("cannot start");
        let text = err.to_string();
        assert!(
            text.contains("ghost") && text.contains("/nonexistent/ghost"),
            "{text}"
        );
    }
}
