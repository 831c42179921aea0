//! Redis: the machine's shared server (`REDIS_URL`, else 127.0.0.1:6379),
//! and a [`PrivateRedis`] for each test that stops or kills Redis.
//!
//! Both keep nothing on disk (`--save "" --appendonly no`), as the shared
//! one on these machines does: a restart starts empty.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{DevstackError, Result};
use crate::health::{free_port, wait_until};
use crate::process::{self, Service, Spec};

/// The shared Redis URL: `REDIS_URL`, else `redis://127.0.0.1:6379`.
pub fn shared_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// `host:port` of a `redis://[user:pass@]host:port[/db]` URL.
pub fn address(url: &str) -> Result<String> {
    let rest = url
        .strip_prefix("redis://")
        .ok_or_else(|| DevstackError::Setting {
            setting: "REDIS_URL".into(),
            problem: format!("must be a redis://host:port URL, not {url:?}"),
        })?;
    let host_port = rest.rsplit_once('@').map_or(rest, |(_, hp)| hp);
    let host_port = host_port.split('/').next().unwrap_or(host_port);
    Ok(if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:6379")
    })
}

/// Whether a Redis server at `addr` (`host:port`, a name or an IP)
/// answers `PING` with `+PONG`.
pub fn pings(addr: &str) -> bool {
    let Some(mut stream) = crate::health::connect(addr) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// The `redis-server` binary: on the PATH, or Debian's package installed
/// when we are root.
pub fn server_bin() -> Result<PathBuf> {
    let find = || {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join("redis-server"))
                .find(|p| p.exists())
        })
    };
    if let Some(bin) = find() {
        return Ok(bin);
    }
    if rustix::process::geteuid().is_root() && std::path::Path::new("/usr/bin/apt-get").exists() {
        process::run(
            std::process::Command::new("apt-get")
                .args(["install", "-y", "redis-server"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
            "apt-get install -y redis-server",
        )?;
    }
    find().ok_or_else(|| DevstackError::Missing {
        tool: "redis-server".into(),
        fix: "install it: apt-get install -y redis-server".into(),
    })
}

/// The command of a `redis-server` on `port` keeping nothing on disk.
pub fn spec(name: &str, bin: PathBuf, port: u16, dir: &std::path::Path) -> Spec {
    Spec::new(name, bin, dir.join("redis.log"))
        .args(["--bind", "127.0.0.1", "--port"])
        .args([port.to_string()])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
        ])
        .args([dir.as_os_str().to_owned()])
        .cwd(dir)
}

/// A `redis-server` of one test's own on a free port; killed when dropped.
pub struct PrivateRedis {
    service: Service,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PrivateRedis {
    /// Starts it and waits until it answers `PING`.
    pub async fn start() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("meterline-redis-")
            .tempdir()
            .map_err(DevstackError::io(
                "a temporary directory for a private Redis",
            ))?;
        let port = free_port()?;
        // `DEBUG SLEEP` from this machine only: tests stall it on purpose.
        let spec = spec("private redis", server_bin()?, port, dir.path())
            .args(["--enable-debug-command", "local"]);
        let service = Service::spawn(spec)?;
        let mut redis = Self {
            service,
            port,
            _dir: dir,
        };
        redis.wait_ready().await?;
        Ok(redis)
    }

    /// Its URL, for a service's `REDIS_URL`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILL: every key is gone with it.
    pub async fn kill9(&mut self) {
        self.service.kill9().await;
    }

    /// `FLUSHALL`: every key gone, the server still up (as an operator's
    /// `redis-cli FLUSHALL`).
    pub async fn flushall(&self) -> Result<()> {
        self.ok("FLUSHALL".into(), Duration::from_secs(5)).await
    }

    /// `DEBUG SLEEP secs`: the server answers nobody for that long (as a
    /// Redis stalled by a slow command or a fork); returns when it is over.
    pub async fn stall(&self, secs: u32) -> Result<()> {
        let wait = Duration::from_secs(u64::from(secs) + 5);
        self.ok(format!("DEBUG SLEEP {secs}"), wait).await
    }

    /// Sends `command` (inline) and expects `+OK` within `wait`.
    async fn ok(&self, command: String, wait: Duration) -> Result<()> {
        let addr = format!("127.0.0.1:{}", self.port);
        let line = format!("{command}\r\n");
        let answered = tokio::task::spawn_blocking(move || {
            let mut stream = crate::health::connect(&addr)?;
            stream.set_read_timeout(Some(wait)).ok()?;
            stream.write_all(line.as_bytes()).ok()?;
            let mut buf = [0u8; 5];
            stream.read_exact(&mut buf).ok()?;
            (&buf == b"+OK\r\n").then_some(())
        })
        .await;
        match answered {
            Ok(Some(())) => Ok(()),
            _ => Err(DevstackError::Command {
                command: format!("{command} on the private redis at 127.0.0.1:{}", self.port),
                detail: "no +OK".into(),
            }),
        }
    }

    /// Starts it again on the same port (empty) and waits for `PING`.
    pub async fn restart(&mut self) -> Result<()> {
        self.service.restart()?;
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let addr = format!("127.0.0.1:{}", self.port);
        wait_until(
            "private redis",
            &format!("PING {addr}"),
            Duration::from_secs(20),
            Some(&mut self.service),
            || {
                let addr = addr.clone();
                async move {
                    tokio::task::spawn_blocking(move || pings(&addr))
                        .await
                        .unwrap_or(false)
                }
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_come_from_urls() {
        assert_eq!(
            address("redis://127.0.0.1:6380").expect("url"),
            "127.0.0.1:6380"
        );
        assert_eq!(
            address("redis://:secret@cache:7000/2").expect("url"),
            "cache:7000"
        );
        assert_eq!(address("redis://cache").expect("url"), "cache:6379");
        let err = address("http://cache:6379").expect_err("not redis");
        assert!(err.to_string().contains("REDIS_URL"), "{err}");
    }

    #[tokio::test]
    async fn a_private_redis_answers_and_comes_back_empty_after_a_kill() {
        let mut redis = PrivateRedis::start().await.expect("private redis");
        let addr = address(&redis.url()).expect("url");
        assert!(pings(&addr));
        // A host name, as a REDIS_URL may well carry, resolves too.
        assert!(pings(&addr.replace("127.0.0.1", "localhost")));
        redis.flushall().await.expect("FLUSHALL");
        assert!(pings(&addr), "still up after FLUSHALL");
        redis.kill9().await;
        assert!(!pings(&addr), "killed redis still answers");
        redis.restart().await.expect("restart");
        assert!(pings(&addr));
    }
}
