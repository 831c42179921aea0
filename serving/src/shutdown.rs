//! The one shutdown signal of every Meterline binary.

/// Resolves on SIGTERM or Ctrl-C (SIGINT), whichever comes first. If the
/// SIGTERM handler cannot be installed, Ctrl-C alone.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => tracing::info!("ctrl-c received; shutting down"),
                    _ = term.recv() => tracing::info!("sigterm received; shutting down"),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; stopping on ctrl-c only");
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
