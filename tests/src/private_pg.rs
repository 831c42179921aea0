//! A Postgres cluster of the test's own, for tests that crash Postgres:
//! `initdb` into a temporary directory, a postmaster on a free port in its
//! own process group (so one `kill -9` of the group takes every backend, as
//! a power loss would), started again on the same data directory.
//!
//! Postgres refuses to run as root; as root the cluster runs as the
//! `postgres` user, otherwise as the current user.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::{ConnectOptions, PgPool};

use crate::process::free_port;

pub struct PrivatePostgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    settings: Vec<String>,
    owner: Option<(u32, u32)>,
    child: Option<Child>,
    /// Holds the cluster's files; removed on drop.
    _dir: tempfile::TempDir,
}

/// The newest installed server's binaries (Debian's layout first).
fn server_bin() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").exists())
        .collect();
    found.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found
        .pop()
        .expect("no Postgres server binaries under /usr/lib/postgresql (install postgresql)")
}

fn id(flag: &str, user: &str) -> u32 {
    let out = Command::new("id")
        .args([flag, user])
        .output()
        .expect("run id");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no uid/gid for {user}"))
}

impl PrivatePostgres {
    /// Creates and starts a cluster with `settings` (`name=value`, passed
    /// as `-c` to the postmaster).
    pub async fn start(settings: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let owner = (rustix::process::geteuid().is_root())
            .then(|| (id("-u", "postgres"), id("-g", "postgres")));
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown");
        }
        let bin = server_bin();
        let data = dir.path().join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_owner(&mut initdb, owner);
        let out = initdb.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut pg = Self {
            bin,
            data,
            port: free_port(),
            settings: settings.iter().map(|s| (*s).to_owned()).collect(),
            owner,
            child: None,
            _dir: dir,
        };
        pg.spawn().await;
        pg
    }

    /// A URL for `database` on this cluster.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates `database` and applies Meterline's migrations to it.
    pub async fn migrated_database(&self, database: &str) -> (String, PgPool) {
        let admin = sqlx::postgres::PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres");
        let mut conn = admin
            .connect()
            .await
            .expect("connect to the private cluster");
        sqlx::query(&format!("CREATE DATABASE {database}"))
            .execute(&mut conn)
            .await
            .expect("create database");
        let url = self.url(database);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .expect("connect");
        sqlx::migrate!("../migrations")
            .run(&pool)
            .await
            .expect("migrate");
        (url, pool)
    }

    /// SIGKILL to the postmaster's whole process group — every backend,
    /// the WAL writer and the checkpointer at once — and waits for it.
    pub fn kill_all(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = rustix::process::Pid::from_child(&child);
            let group = pid.as_raw_nonzero().get();
            // A backend being forked at the moment of the first signal can
            // outlive it, still attached to the shared memory (the restart
            // would then refuse to start): signal again until no live
            // process is left in the group.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
                let _ = child.try_wait();
                if live_members(group) == 0 || Instant::now() > deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.wait();
        }
    }

    /// Starts the postmaster again on the same data (crash recovery runs).
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "the private postgres is running");
        self.spawn().await;
    }

    async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("postgres log");
        let mut cmd = Command::new(self.bin.join("postgres"));
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.data.parent().unwrap_or(Path::new("/tmp")).display()
            ));
        for s in &self.settings {
            cmd.args(["-c", s]);
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        as_owner(&mut cmd, self.owner);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        self.child = Some(cmd.spawn().expect("start postgres"));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = sqlx::postgres::PgConnectOptions::new()
                .host("127.0.0.1")
                .port(self.port)
                .username("postgres")
                .database("postgres")
                .connect()
                .await
                .is_ok();
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "private postgres did not come up in 60 s: {}",
                std::fs::read_to_string(self.log_path()).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_path(&self) -> PathBuf {
        self._dir.path().join("postgres.log")
    }
}

/// Processes of process group `group` that are alive (not zombies), from
/// `/proc/<pid>/stat`: the state is the first field after the command's
/// closing parenthesis, the process group the third.
fn live_members(group: i32) -> usize {
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

fn as_owner(cmd: &mut Command, owner: Option<(u32, u32)>) {
    if let Some((uid, gid)) = owner {
        std::os::unix::process::CommandExt::uid(cmd, uid);
        std::os::unix::process::CommandExt::gid(cmd, gid);
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.kill_all();
    }
}
