//! Postgres: finding the machine's shared server, and clusters of our
//! own made with `initdb` — the project-local cluster that `devstack up`
//! runs when the machine has no server, and the one of each
//! [`PrivatePostgres`](crate::private_postgres::PrivatePostgres).
//!
//! Postgres refuses to run as root; as root a cluster runs as the
//! `postgres` OS user, or as a `meterline-pg` system user created for it
//! when there is none. Where the server binaries are missing and we are
//! root on Debian, Debian's `postgresql` package is installed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::ConnectOptions;

use crate::error::{DevstackError, Result};
use crate::health::wait_until;
use crate::process::{self, Owner, Spec};

/// The shared database URL every test, bench and demo starts from:
/// `DATABASE_URL`, else `postgres://postgres@127.0.0.1:5432/meterline`.
pub fn shared_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/meterline".into())
}

/// Parses a Postgres URL, naming `setting` when it is not one.
pub fn parse(url: &str, setting: &str) -> Result<PgConnectOptions> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(DevstackError::Setting {
            setting: setting.to_owned(),
            problem: "must be a postgres://user@host:port/database URL".into(),
        });
    }
    url.parse().map_err(|e| DevstackError::Setting {
        setting: setting.to_owned(),
        problem: format!("not a Postgres URL: {e}"),
    })
}

/// `host:port` of a connection's options, for messages (no password).
pub fn address(options: &PgConnectOptions) -> String {
    format!("{}:{}", options.get_host(), options.get_port())
}

/// The same server URL with another database.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let server = base.rsplit_once('/').map_or(base, |(s, _)| s);
    match query {
        Some(q) => format!("{server}/{database}?{q}"),
        None => format!("{server}/{database}"),
    }
}

/// Whether a server at `options` accepts a connection to database `postgres`.
pub async fn answers(options: &PgConnectOptions) -> bool {
    options.clone().database("postgres").connect().await.is_ok()
}

/// The server binaries (initdb, postgres, pg_ctl) of the newest installed
/// Postgres; installs Debian's `postgresql` when there are none and we may.
pub fn server_bin() -> Result<PathBuf> {
    if let Some(bin) = find_server_bin() {
        return Ok(bin);
    }
    let root = rustix::process::geteuid().is_root();
    if root && Path::new("/usr/bin/apt-get").exists() {
        tracing::info!("installing Debian's postgresql");
        process::run(Command::new("apt-get").arg("update"), "apt-get update")?;
        process::run(
            Command::new("apt-get")
                .args(["install", "-y", "postgresql"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
            "apt-get install -y postgresql",
        )?;
    }
    find_server_bin().ok_or_else(|| DevstackError::Missing {
        tool: "PostgreSQL server binaries (initdb, postgres)".into(),
        fix: "install them: apt-get install -y postgresql".into(),
    })
}

fn find_server_bin() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

/// The OS user a cluster runs as: none (ourselves) unless we are root.
pub fn cluster_owner() -> Result<Option<Owner>> {
    if !rustix::process::geteuid().is_root() {
        return Ok(None);
    }
    if let Some(owner) = process::user_ids("postgres") {
        return Ok(Some(owner));
    }
    if process::user_ids("meterline-pg").is_none() {
        process::run(
            Command::new("useradd").args([
                "--system",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                "meterline-pg",
            ]),
            "useradd meterline-pg (the OS user of the local Postgres cluster)",
        )?;
    }
    process::user_ids("meterline-pg")
        .map(Some)
        .ok_or_else(|| DevstackError::Missing {
            tool: "OS user meterline-pg".into(),
            fix: "create a non-root user to run the Postgres cluster".into(),
        })
}

/// A Postgres cluster of our own: a data directory made by `initdb` and
/// the `postgres` server on it, listening on 127.0.0.1 only.
#[derive(Debug, Clone)]
pub struct Cluster {
    bin: PathBuf,
    /// The directory holding `data/` and `postgres.log`.
    dir: PathBuf,
    pub port: u16,
    owner: Option<Owner>,
    settings: Vec<String>,
}

impl Cluster {
    /// A cluster in `dir` (created with `initdb` unless it already holds
    /// one) that will listen on `port`, with `settings` (`name=value`,
    /// passed as `-c`).
    pub fn init(dir: &Path, port: u16, settings: &[&str]) -> Result<Self> {
        let bin = server_bin()?;
        let owner = cluster_owner()?;
        std::fs::create_dir_all(dir).map_err(DevstackError::io(dir.display().to_string()))?;
        if let Some(o) = owner {
            std::os::unix::fs::chown(dir, Some(o.uid), Some(o.gid))
                .map_err(DevstackError::io(format!("chown {}", dir.display())))?;
        }
        let cluster = Self {
            bin,
            dir: dir.to_path_buf(),
            port,
            owner,
            settings: settings.iter().map(|s| (*s).to_owned()).collect(),
        };
        if !cluster.data().join("PG_VERSION").exists() {
            let mut initdb = Command::new(cluster.bin.join("initdb"));
            initdb
                .args([
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                    "-D",
                ])
                .arg(cluster.data())
                .current_dir("/");
            if let Some(o) = owner {
                std::os::unix::process::CommandExt::uid(&mut initdb, o.uid);
                std::os::unix::process::CommandExt::gid(&mut initdb, o.gid);
            }
            process::run(&mut initdb, &format!("initdb {}", cluster.data().display())).map_err(
                |e| match e {
                    DevstackError::Command { command, detail } if owner.is_some() => {
                        DevstackError::Command {
                            command,
                            detail: format!(
                                "{detail}; the cluster's OS user must be able to enter every parent directory of {} (chmod o+x)",
                                dir.display()
                            ),
                        }
                    }
                    other => other,
                },
            )?;
        }
        Ok(cluster)
    }

    /// The data directory.
    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The server's log file.
    pub fn log(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    /// Connection options for `database` as user `postgres`.
    pub fn options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database(database)
    }

    /// A URL for `database` on this cluster.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The command that runs the server in the foreground.
    pub fn spec(&self, name: &str) -> Spec {
        let mut spec = Spec::new(name, self.bin.join("postgres"), self.log())
            .args(["-D".into(), self.data().into_os_string()])
            .args(["-p".to_owned(), self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args([
                "-c".to_owned(),
                format!("unix_socket_directories={}", self.dir.display()),
            ])
            .cwd("/")
            .owner(self.owner);
        for s in &self.settings {
            spec = spec.args(["-c", s.as_str()]);
        }
        spec
    }

    /// The postmaster's pid from `postmaster.pid`, if it is running.
    pub fn running_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        let pid: u32 = text.lines().next()?.trim().parse().ok()?;
        crate::detached::pid_alive(pid).then_some(pid)
    }

    /// Waits until the server accepts connections.
    pub async fn wait_ready(
        &self,
        service: Option<&mut dyn process::Watched>,
        within: Duration,
    ) -> Result<()> {
        let options = self.options("postgres");
        let log = self.log();
        wait_until(
            &format!("postgres on 127.0.0.1:{}", self.port),
            &format!("connect as postgres; log {}", log.display()),
            within,
            service,
            || {
                let options = options.clone();
                async move { options.connect().await.is_ok() }
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_get_another_database_and_keep_their_parameters() {
        assert_eq!(
            with_database("postgres://u@h:5432/meterline?sslmode=disable", "nisshi"),
            "postgres://u@h:5432/nisshi?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://u:p@h/meterline", "mt_x"),
            "postgres://u:p@h/mt_x"
        );
    }
}
