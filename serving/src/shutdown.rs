//! The one shutdown signal of every Meterline binary.

use std::future::Future;

/// Resolves on SIGTERM or Ctrl-C (SIGINT), whichever comes first. If the
/// SIGTERM handler cannot be installed, Ctrl-C alone.
///
/// The SIGTERM handler is installed when this is called, not when the
/// future is first polled: a server polls its shutdown future only once it
/// serves, and a SIGTERM that arrives before (right after the listener
/// answers its first health check, say) would otherwise kill the process
/// with the default action instead of stopping it cleanly. Call it inside
/// the runtime, before the service starts.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let term = {
        use tokio::signal::unix::{signal, SignalKind};
        signal(SignalKind::terminate())
            .map_err(|e| {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; stopping on ctrl-c only");
            })
            .ok()
    };
    async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        if let Some(mut term) = term {
            tokio::select! {
                _ = ctrl_c => tracing::info!("ctrl-c received; shutting down"),
                _ = term.recv() => tracing::info!("sigterm received; shutting down"),
            }
            return;
        }
        let _ = ctrl_c.await;
    }
}
