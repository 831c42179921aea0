//! Waiting for a service to come up, with an error that names what did
//! not (and shows the last lines of its log), and the ports they listen on.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::error::{DevstackError, Result};
use crate::process::Watched;

/// A free TCP port on 127.0.0.1 (the kernel's pick; free when returned).
pub fn free_port() -> Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(DevstackError::io("binding a free port on 127.0.0.1"))
}

/// A TCP connection to `addr` (`host:port`, a name or an IP), trying each
/// address it resolves to for up to 2 s.
pub fn connect(addr: &str) -> Option<TcpStream> {
    let addrs: Vec<SocketAddr> = addr.to_socket_addrs().ok()?.collect();
    addrs
        .iter()
        .find_map(|a| TcpStream::connect_timeout(a, Duration::from_secs(2)).ok())
}

/// Whether something accepts TCP connections at `addr` (`host:port`).
pub fn port_open(addr: &str) -> bool {
    connect(addr).is_some()
}

/// Polls `ready` every 100 ms until it says yes; fails after `within`
/// naming `what` and `check`, or as soon as `service` (if given) exits.
pub async fn wait_until<F, Fut>(
    what: &str,
    check: &str,
    within: Duration,
    mut service: Option<&mut dyn Watched>,
    mut ready: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if ready().await {
            return Ok(());
        }
        if let Some(s) = service.as_deref_mut() {
            if let Some(status) = s.exit() {
                return Err(DevstackError::Exited {
                    what: what.to_owned(),
                    status,
                    log: format!(":\n{}", s.log_tail()),
                });
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(DevstackError::NotUp {
                what: what.to_owned(),
                check: check.to_owned(),
                within,
                log: service.map_or_else(String::new, |s| format!(":\n{}", s.log_tail())),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `url` answers 2xx; fails naming the service (with its log)
/// if it exits first or is not healthy within `within`.
pub async fn wait_http(url: &str, service: &mut dyn Watched, within: Duration) -> Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| DevstackError::Conflict(format!("building an HTTP client: {e}")))?;
    let what = service.name().to_owned();
    wait_until(&what, &format!("GET {url}"), within, Some(service), || {
        let request = client.get(url).send();
        async move { request.await.is_ok_and(|r| r.status().is_success()) }
    })
    .await
}

/// Waits until `addr` accepts TCP connections.
pub async fn wait_tcp(
    what: &str,
    addr: &str,
    service: Option<&mut dyn Watched>,
    within: Duration,
) -> Result<()> {
    wait_until(what, &format!("TCP {addr}"), within, service, || {
        let addr = addr.to_owned();
        async move {
            tokio::task::spawn_blocking(move || port_open(&addr))
                .await
                .unwrap_or(false)
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::{Service, Spec};

    #[tokio::test]
    async fn a_service_that_exits_is_named_with_its_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = Spec::new("flaky", "/bin/sh", dir.path().join("flaky.log"))
            .args(["-c", "echo 'config error: PORT is not a number'; exit 3"]);
        let mut service = Service::spawn(spec).expect("spawn");
        let port = free_port().expect("port");
        let err = wait_http(
            &format!("http://127.0.0.1:{port}/healthz"),
            &mut service,
            Duration::from_secs(10),
        )
        .await
        .expect_err("never healthy");
        let text = err.to_string();
        assert!(text.contains("flaky exited"), "{text}");
        assert!(text.contains("PORT is not a number"), "{text}");
    }

    #[tokio::test]
    async fn nothing_listening_times_out_naming_the_check() {
        let port = free_port().expect("port");
        let addr = format!("127.0.0.1:{port}");
        let err = wait_tcp("the broker", &addr, None, Duration::from_millis(300))
            .await
            .expect_err("nothing listens");
        let text = err.to_string();
        assert!(
            text.contains("the broker did not come up") && text.contains(&addr),
            "{text}"
        );
    }
}
