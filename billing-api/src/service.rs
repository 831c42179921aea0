//! Builds billing-api: state, router, serve loop.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use clap::Args;
use sqlx::PgPool;

use crate::auth::put_token;
use crate::error::BillingError;
use crate::usage;

#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
}

#[derive(Debug, Clone, Args)]
pub struct BillingConfig {
    /// Where the API listens.
    #[arg(long, env = "BILLING_ADDR", default_value = "127.0.0.1:8082")]
    pub addr: SocketAddr,
    /// Postgres URL.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/meterline"
    )]
    pub database_url: String,
    /// A finance token to register at start-up (stored hashed), for a new
    /// installation's first login and for the demo.
    #[arg(long, env = "BILLING_BOOTSTRAP_FINANCE_TOKEN")]
    pub bootstrap_finance_token: Option<String>,
}

pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/v1/tenants/{tenant}/usage", get(usage::tenant_usage))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
}

pub async fn run(
    config: BillingConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BillingError> {
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| BillingError::Config(format!("BILLING_ADDR {}: {e}", config.addr)))?;
    let pool = schema::connect(&config.database_url, 8, Duration::from_secs(60)).await?;
    if let Some(token) = &config.bootstrap_finance_token {
        if token.len() < 16 {
            return Err(BillingError::Config(
                "BILLING_BOOTSTRAP_FINANCE_TOKEN must be at least 16 characters".into(),
            ));
        }
        put_token(&pool, "bootstrap-finance", token, "finance", None).await?;
    }
    tracing::info!(addr = %config.addr, "billing-api listening");
    axum::serve(listener, app(AppState { pool }))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| BillingError::Config(format!("serving on {}: {e}", config.addr)))
}
