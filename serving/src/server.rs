//! The accept loop: one HTTP/1.1 connection task per accepted socket, with
//! no-delay set, hyper's header-read timer on, the body-read middleware in
//! front of the router, and a graceful drain on shutdown.
//!
//! HTTP/1.1 only: hyper applies its header-read timeout to HTTP/1, and
//! every client of these services (OpenAI SDKs, reqwest, curl, Prometheus)
//! speaks it.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};

use crate::settings::HttpSettings;

/// Why serving stopped other than by shutdown.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot read the listener's address: {0}")]
    Listener(#[source] std::io::Error),
}

/// Serves `router` on `listener` until `shutdown` resolves, then drains
/// open connections for up to the shutdown grace and returns.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: HttpSettings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let addr = listener.local_addr().map_err(ServeError::Listener)?;
    let router = router.layer(axum::middleware::from_fn_with_state(
        settings.body_read_timeout(),
        crate::body::read_within,
    ));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout())
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = accept(&listener) => match accepted {
                Ok(stream) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: the listener
                    // itself is fine; wait a moment instead of spinning.
                    tracing::warn!(%addr, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                // A client that went away or timed out: its business.
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let grace = settings.shutdown_grace();
    tracing::info!(%addr, grace_secs = grace.as_secs(), "stopped accepting; draining connections");
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(%addr, "connections still open after the shutdown grace; closing them");
    }
    Ok(())
}

/// Accepts one connection and sets no-delay on it: without it, a response
/// written in pieces waits for the client's delayed ACK (~40 ms).
pub async fn accept(listener: &TcpListener) -> std::io::Result<TcpStream> {
    let (stream, _) = listener.accept().await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_sockets_have_no_delay() -> std::io::Result<()> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let client = tokio::spawn(TcpStream::connect(addr));
        let server_side = accept(&listener).await?;
        assert!(server_side.nodelay()?);
        drop(client.await);
        Ok(())
    }
}
