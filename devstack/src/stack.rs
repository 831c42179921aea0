//! The shared stack that `devstack up` brings up or reuses, and `down`
//! stops: Postgres, the broker (with the deployment's topic) and Redis,
//! with what it chose written to `.stack/env` for shells, scripts and
//! tests to source.
//!
//! The rules, each overridable:
//! - Postgres: `DATABASE_URL` if set; else the server on 127.0.0.1:5432 if
//!   it answers (`METERLINE_FORCE_LOCAL_PG=1` skips it); else a
//!   project-local cluster in `.stack/pg` on `METERLINE_LOCAL_PG_PORT`
//!   (55432), installing Debian's postgresql first if needed. Databases
//!   `meterline` and `nisshi` (the broker's log) are created if missing.
//! - Kafka: `KAFKA_BROKERS` if set (no broker started; make the topic
//!   yourself); else the broker already on `127.0.0.1:METERLINE_BROKER_PORT`
//!   (9092) if one answers, else Nisshi started there. Topic
//!   `METERLINE_TOPIC` (usage.events.v1) with `METERLINE_PARTITIONS` (4).
//! - Redis: `REDIS_URL` if set; else the server on 127.0.0.1:6379 if it
//!   answers; else a `redis-server` started there, keeping nothing on disk.
//!
//! Values that `.stack/env` itself exported (marked by the
//! `METERLINE_STACK_*` copies it also exports) are not taken as user
//! settings, so `up` from a shell that sourced it behaves as from a clean one.
//! `down` stops only what `up` started; never the machine's own servers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::process::Signal;
use serde::{Deserialize, Serialize};
use sqlx::ConnectOptions;

use crate::detached::{self, Detached};
use crate::error::{DevstackError, Result};
use crate::health::{port_open, wait_tcp, wait_until};
use crate::postgres::{self, Cluster};
use crate::process;
use crate::{database, nisshi, redis, topic};

/// Where a component of the stack comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Named by the user's environment; never started or stopped here.
    External,
    /// Already running on this machine, not started by the stack.
    Reused,
    /// Started by `devstack up`; `down` stops it.
    Managed,
}

/// What `up` chose, kept in `.stack/state.json` for `down` and `status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub database_url: String,
    pub postgres: Origin,
    pub kafka_brokers: String,
    pub kafka: Origin,
    pub redis_url: String,
    pub redis: Origin,
}

/// The `.stack` directory of a checkout.
pub struct StackDir(PathBuf);

fn setting(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A user's setting: set, and not the copy `.stack/env` exported.
fn user_setting(name: &str) -> Option<String> {
    let value = setting(name)?;
    (setting(&format!("METERLINE_STACK_{name}")).as_deref() != Some(value.as_str()))
        .then_some(value)
}

fn number<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match setting(name) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| DevstackError::Setting {
            setting: name.to_owned(),
            problem: format!("must be a positive number, not {v:?}"),
        }),
    }
}

impl StackDir {
    /// `<root>/.stack`, created if missing.
    pub fn new(root: &Path) -> Result<Self> {
        let dir = root.join(".stack");
        std::fs::create_dir_all(&dir).map_err(DevstackError::io(dir.display().to_string()))?;
        Ok(Self(dir))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Holds `.stack/lock` until dropped, so two `up`s don't race.
    fn lock(&self) -> Result<std::fs::File> {
        let path = self.path("lock");
        let file =
            std::fs::File::create(&path).map_err(DevstackError::io(path.display().to_string()))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| DevstackError::io(path.display().to_string())(e.into()))?;
        Ok(file)
    }

    /// The state `up` wrote, if the stack is up.
    pub fn state(&self) -> Option<State> {
        let text = std::fs::read_to_string(self.path("state.json")).ok()?;
        serde_json::from_str(&text).ok()
    }

    fn pid(&self, name: &str) -> Option<u32> {
        let pid = std::fs::read_to_string(self.path(name))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        detached::pid_alive(pid).then_some(pid)
    }

    fn local_cluster(&self) -> Result<Cluster> {
        Cluster::init(
            &self.path("pg"),
            number("METERLINE_LOCAL_PG_PORT", 55432)?,
            &[],
        )
    }

    /// Brings the stack up (starting what is missing; safe to run again)
    /// and writes `.stack/env`. `say` receives one line per decision.
    pub async fn up(&self, say: &mut dyn FnMut(String)) -> Result<State> {
        let _lock = self.lock()?;
        let (database_url, pg) = self.up_postgres(say).await?;
        let (kafka_brokers, kafka) = self.up_kafka(&database_url, say).await?;
        let (redis_url, redis) = self.up_redis(say).await?;
        let state = State {
            database_url,
            postgres: pg,
            kafka_brokers,
            kafka,
            redis_url,
            redis,
        };
        self.write(&state)?;
        say(format!(
            "up: DATABASE_URL={} KAFKA_BROKERS={} REDIS_URL={} (source .stack/env)",
            redact(&state.database_url),
            state.kafka_brokers,
            state.redis_url
        ));
        Ok(state)
    }

    async fn up_postgres(&self, say: &mut dyn FnMut(String)) -> Result<(String, Origin)> {
        if let Some(url) = user_setting("DATABASE_URL") {
            postgres::parse(&url, "DATABASE_URL")?;
            say(format!("postgres: using DATABASE_URL ({})", redact(&url)));
            ensure_database(&url).await?;
            return Ok((url, Origin::External));
        }
        let system = postgres::parse(
            "postgres://postgres@127.0.0.1:5432/postgres",
            "DATABASE_URL",
        )?;
        let (port, origin) = if setting("METERLINE_FORCE_LOCAL_PG").as_deref() != Some("1")
            && postgres::answers(&system).await
        {
            say("postgres: using the server on 127.0.0.1:5432".into());
            (5432, Origin::Reused)
        } else {
            let cluster = self.local_cluster()?;
            if cluster.running_pid().is_some() {
                say(format!(
                    "postgres: project-local cluster already running on 127.0.0.1:{}",
                    cluster.port
                ));
            } else {
                if port_open(&format!("127.0.0.1:{}", cluster.port)) {
                    return Err(DevstackError::Conflict(format!(
                        "port {} is used by another process; stop it or set METERLINE_LOCAL_PG_PORT",
                        cluster.port
                    )));
                }
                say(format!(
                    "postgres: starting the project-local cluster .stack/pg on 127.0.0.1:{} (log .stack/pg/postgres.log)",
                    cluster.port
                ));
                detached::spawn_detached(&cluster.spec("project-local postgres"))?;
                cluster.wait_ready(None, Duration::from_secs(60)).await?;
            }
            (cluster.port, Origin::Managed)
        };
        let url = format!("postgres://postgres@127.0.0.1:{port}/meterline");
        ensure_database(&url).await?;
        Ok((url, origin))
    }

    async fn up_kafka(
        &self,
        database_url: &str,
        say: &mut dyn FnMut(String),
    ) -> Result<(String, Origin)> {
        let topic_name = setting("METERLINE_TOPIC").unwrap_or_else(|| "usage.events.v1".into());
        let partitions: i32 = number("METERLINE_PARTITIONS", 4)?;
        if partitions < 1 {
            return Err(DevstackError::Setting {
                setting: "METERLINE_PARTITIONS".into(),
                problem: format!("must be a positive number, not {partitions}"),
            });
        }
        if let Some(brokers) = user_setting("KAFKA_BROKERS") {
            say(format!(
                "kafka: using KAFKA_BROKERS={brokers}; no broker started, topic {topic_name} not created (create it with {partitions} partitions yourself)"
            ));
            return Ok((brokers, Origin::External));
        }
        let port: u16 = number("METERLINE_BROKER_PORT", 9092)?;
        let brokers = format!("127.0.0.1:{port}");
        let origin = if let Some(pid) = self.pid("nisshi.pid").filter(|p| is_broker(*p)) {
            say(format!(
                "kafka: nisshi broker already running on {brokers} (pid {pid})"
            ));
            Origin::Managed
        } else if port_open(&brokers) {
            say(format!(
                "kafka: reusing the broker already listening on {brokers} (not started by devstack; down leaves it alone)"
            ));
            Origin::Reused
        } else {
            let bin = nisshi::ensure_binary()?;
            let storage_db = postgres::with_database(database_url, "nisshi");
            ensure_database(&storage_db).await?;
            let spec = nisshi::broker_spec(
                "nisshi broker",
                bin,
                &nisshi::storage_url(&storage_db),
                port,
                &self.0,
                self.path("nisshi.log"),
            );
            let pid = Detached::start(&spec, &self.path("nisshi.pid"))?.pid;
            wait_until(
                "the nisshi broker",
                &format!("TCP {brokers}; log .stack/nisshi.log"),
                Duration::from_secs(30),
                None,
                || {
                    let brokers = brokers.clone();
                    async move {
                        if !detached::pid_alive(pid) {
                            return true; // reported below
                        }
                        tokio::task::spawn_blocking(move || port_open(&brokers))
                            .await
                            .unwrap_or(false)
                    }
                },
            )
            .await?;
            if !detached::pid_alive(pid) {
                return Err(DevstackError::Exited {
                    what: "the nisshi broker".into(),
                    status: "at startup".into(),
                    log: format!(":\n{}", process::log_tail(&self.path("nisshi.log"), 10)),
                });
            }
            say(format!(
                "kafka: nisshi broker started on {brokers} (pid {pid}, log .stack/nisshi.log)"
            ));
            Origin::Managed
        };
        topic::create(&brokers, &topic_name, partitions).await?;
        match topic::partitions(&brokers, &topic_name).await {
            Some(n) if n != partitions => say(format!(
                "warning: topic {topic_name} has {n} partitions, not {partitions}; delete it and run up again to change that"
            )),
            _ => say(format!("kafka: topic {topic_name} ready ({partitions} partitions)")),
        }
        Ok((brokers, origin))
    }

    async fn up_redis(&self, say: &mut dyn FnMut(String)) -> Result<(String, Origin)> {
        if let Some(url) = user_setting("REDIS_URL") {
            let addr = redis::address(&url)?;
            if !redis::pings(&addr) {
                say(format!("warning: REDIS_URL={url} does not answer PING"));
            }
            say(format!("redis: using REDIS_URL={url}"));
            return Ok((url, Origin::External));
        }
        let addr = "127.0.0.1:6379";
        let url = "redis://127.0.0.1:6379".to_owned();
        if let Some(pid) = self.pid("redis.pid") {
            say(format!("redis: already running on {addr} (pid {pid})"));
            return Ok((url, Origin::Managed));
        }
        if redis::pings(addr) {
            say(format!("redis: using the server on {addr}"));
            return Ok((url, Origin::Reused));
        }
        if port_open(addr) {
            return Err(DevstackError::Conflict(format!(
                "{addr} is in use but does not answer Redis PING; stop that process or set REDIS_URL"
            )));
        }
        let dir = self.path("redis");
        std::fs::create_dir_all(&dir).map_err(DevstackError::io(dir.display().to_string()))?;
        let spec = redis::spec("redis", redis::server_bin()?, 6379, &dir);
        let pid = Detached::start(&spec, &self.path("redis.pid"))?.pid;
        wait_tcp("redis", addr, None, Duration::from_secs(20)).await?;
        say(format!(
            "redis: started on {addr} (pid {pid}, log .stack/redis/redis.log)"
        ));
        Ok((url, Origin::Managed))
    }

    fn write(&self, state: &State) -> Result<()> {
        let mut env = format!(
            "# Written by devstack up (scripts/stack.sh up). Source it: . .stack/env\nexport DATABASE_URL={}\nexport KAFKA_BROKERS={}\nexport REDIS_URL={}\n",
            quote(&state.database_url),
            quote(&state.kafka_brokers),
            quote(&state.redis_url)
        );
        for (name, value, origin) in [
            ("DATABASE_URL", &state.database_url, state.postgres),
            ("KAFKA_BROKERS", &state.kafka_brokers, state.kafka),
            ("REDIS_URL", &state.redis_url, state.redis),
        ] {
            if origin != Origin::External {
                env.push_str(&format!("export METERLINE_STACK_{name}={}\n", quote(value)));
            }
        }
        write_file(&self.path("env"), &env)?;
        let json = serde_json::to_string_pretty(state)
            .map_err(|e| DevstackError::Conflict(format!("encoding the stack state: {e}")))?;
        write_file(&self.path("state.json"), &json)
    }

    /// Stops what `up` started (never the machine's own servers), drops
    /// the `mt_` databases killed runs left behind, removes `.stack/env`.
    pub async fn down(&self, say: &mut dyn FnMut(String)) -> Result<()> {
        let _lock = self.lock()?;
        let state = self.state();
        if let Some(pid) = self.pid("nisshi.pid").filter(|p| is_broker(*p)) {
            say(format!("stopping the nisshi broker (pid {pid})"));
            detached::stop_pid(pid, Signal::TERM, Duration::from_secs(10)).await;
        } else if state.as_ref().is_some_and(|s| s.kafka == Origin::Reused) {
            say("leaving the broker that devstack did not start alone".into());
        }
        let _ = std::fs::remove_file(self.path("nisshi.pid"));
        if let Some(pid) = self.pid("redis.pid") {
            say(format!("stopping redis (pid {pid})"));
            detached::stop_pid(pid, Signal::TERM, Duration::from_secs(10)).await;
        }
        let _ = std::fs::remove_file(self.path("redis.pid"));
        if let Some(state) = &state {
            match database::drop_leftovers(&state.database_url).await {
                Ok(0) => {}
                Ok(n) => say(format!("dropped {n} test database(s) left by killed runs")),
                Err(e) => say(format!(
                    "warning: could not drop leftover test databases: {e}"
                )),
            }
        }
        if self.path("pg/data/PG_VERSION").exists() {
            let cluster = self.local_cluster()?;
            if let Some(pid) = cluster.running_pid() {
                say("stopping the project-local Postgres cluster (.stack/pg)".into());
                // SIGINT is Postgres' fast shutdown.
                detached::stop_pid(pid, Signal::INT, Duration::from_secs(30)).await;
            }
        }
        if state.is_some_and(|s| s.postgres == Origin::Reused) {
            say("leaving the machine's Postgres on 127.0.0.1:5432 alone".into());
        }
        let _ = std::fs::remove_file(self.path("env"));
        let _ = std::fs::remove_file(self.path("state.json"));
        say("down".into());
        Ok(())
    }

    /// One line per component; `false` if something is not running.
    pub async fn status(&self) -> (Vec<String>, bool) {
        let Some(state) = self.state() else {
            return (
                vec!["stack is not up; run scripts/stack.sh up".into()],
                false,
            );
        };
        let mut ok = true;
        let mut lines = Vec::new();
        let note = |o: Origin| match o {
            Origin::External => "from the environment",
            Origin::Reused => "the machine's own, not managed by devstack",
            Origin::Managed => "started by devstack",
        };
        let pg_up = match postgres::parse(&state.database_url, "DATABASE_URL") {
            Ok(o) => o.connect().await.is_ok(),
            Err(_) => false,
        };
        let kafka_up = port_open(state.kafka_brokers.split(',').next().unwrap_or_default());
        let redis_up = redis::address(&state.redis_url).is_ok_and(|a| redis::pings(&a));
        for (name, up, at, origin) in [
            (
                "postgres",
                pg_up,
                redact(&state.database_url),
                state.postgres,
            ),
            (
                "kafka   ",
                kafka_up,
                state.kafka_brokers.clone(),
                state.kafka,
            ),
            ("redis   ", redis_up, state.redis_url.clone(), state.redis),
        ] {
            ok &= up;
            lines.push(format!(
                "{name}: {} at {at} ({})",
                if up { "running" } else { "NOT running" },
                note(origin)
            ));
        }
        (lines, ok)
    }

    /// The contents of `.stack/env`.
    pub fn env(&self) -> Result<String> {
        std::fs::read_to_string(self.path("env")).map_err(|_| DevstackError::Missing {
            tool: ".stack/env".into(),
            fix: "run scripts/stack.sh up".into(),
        })
    }
}

/// Whether `pid` runs a Nisshi broker (a reused pid is not ours).
fn is_broker(pid: u32) -> bool {
    detached::cmdline(pid).is_some_and(|c| c.contains("nisshi") && c.contains(" broker "))
}

/// Creates the database a URL names, through the server's `postgres` database.
async fn ensure_database(url: &str) -> Result<()> {
    let options = postgres::parse(url, "DATABASE_URL")?;
    if options.connect().await.is_ok() {
        return Ok(());
    }
    let name = options.get_database().unwrap_or("meterline").to_owned();
    let at = postgres::address(&options);
    let mut admin = options
        .clone()
        .database("postgres")
        .connect()
        .await
        .map_err(DevstackError::pg(at.clone()))?;
    let exists: Option<(i32,)> = sqlx::query_as("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(&name)
        .fetch_optional(&mut admin)
        .await
        .map_err(DevstackError::pg(at.clone()))?;
    if exists.is_none() {
        if let Err(e) = sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await
        {
            if !e.to_string().contains("already exists") {
                return Err(DevstackError::pg(format!("{at}: CREATE DATABASE {name}"))(
                    e,
                ));
            }
        }
    }
    options
        .connect()
        .await
        .map_err(DevstackError::pg(format!("{at}/{name}")))?;
    Ok(())
}

/// Hides the password in a URL.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((user, host)) if user.contains(':') => {
            let name = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{name}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

/// Single-quotes a value for sh.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(DevstackError::io(tmp.display().to_string()))?;
    std::fs::rename(&tmp, path).map_err(DevstackError::io(path.display().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted_and_rewritten() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(quote("it's"), "'it'\\''s'");
    }
}
