//! Builds billing-api: config, router, serve loop.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::{get, post, put};
use axum::Router;
use clap::Args;

use crate::error::BillingError;
use crate::rating::PriceBook;
use crate::state::AppState;
use crate::{admin, auth, pages, routes, store, tenant_admin, tokens, usage};

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
    /// A price book (YAML) to load at start-up, e.g. config/price-book.yaml.
    #[arg(long, env = "BILLING_PRICE_BOOK_FILE")]
    pub price_book_file: Option<std::path::PathBuf>,
    /// A finance token to register at start-up (stored hashed), for a new
    /// installation's first login and for the demo. Judged by its hash: once
    /// revoked it stays revoked across restarts, and a new value registers
    /// a new token (an earlier value's token stays as it was).
    #[arg(long, env = "BILLING_BOOTSTRAP_FINANCE_TOKEN")]
    pub bootstrap_finance_token: Option<String>,
    /// A tenants file (YAML, shaped like config/tenants.yaml) to upsert at
    /// start-up: tenants, API keys and limits, validated before anything is
    /// written: a bad time zone, billing mode, plan, priority or SLO is
    /// refused naming the tenant and the field, an API key under 16
    /// characters naming the tenant and the key's id (never the key).
    /// `billing-api tenants apply FILE` applies the same file without
    /// starting the service. billing-api owns tenants; the gateways only
    /// read them.
    #[arg(long, env = "BILLING_TENANTS_FILE")]
    pub tenants_file: Option<std::path::PathBuf>,
    /// The bearer token Prometheus sends for `/metrics` (at least 16
    /// characters). Unset: `/metrics` answers 401 to everyone.
    #[arg(long, env = "BILLING_METRICS_TOKEN")]
    pub metrics_token: Option<String>,
    /// How long a page session lasts after sign-in, in minutes.
    #[arg(long, env = "BILLING_SESSION_MINUTES", default_value_t = 480)]
    pub session_minutes: u64,
    /// Mark session cookies `Secure` (set when billing-api is served over TLS).
    #[arg(long, env = "BILLING_SECURE_COOKIES", default_value_t = false)]
    pub secure_cookies: bool,
    /// The Parquet archive, where request lookups find requests past
    /// request_log's 30 days: the archiver's `ARCHIVE_URL` (a directory,
    /// `file:///…` or `s3://bucket/prefix`, with the usual `AWS_*`
    /// variables); its manifest is in `DATABASE_URL`. `off`: lookups read
    /// request_log only.
    #[arg(long, env = "ARCHIVE_URL", default_value = ".stack/archive")]
    pub archive_url: String,
    /// Slow-client bounds and the shutdown grace of the listener.
    #[command(flatten)]
    pub http: serving::HttpSettings,
}

/// The API. Unknown paths answer 404 and known paths with another method
/// 405 (with `Allow`), both in the API's error shape; a NUL in a path
/// parameter or the query is refused before any handler runs.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/v1/tenants/{tenant}/usage", get(usage::tenant_usage))
        .route(
            "/v1/tenants/{tenant}/invoices/{period}",
            get(routes::get_invoice),
        )
        .route(
            "/v1/tenants/{tenant}/invoices/{period}/finalize",
            post(routes::finalize_invoice),
        )
        .route(
            "/v1/tenants/{tenant}/invoices/{period}/void",
            post(routes::void_invoice),
        )
        .route("/v1/tenants/{tenant}/shadow-bill", get(routes::shadow_bill))
        .route(
            "/v1/tenants/{tenant}/budgets/{period}",
            put(routes::put_budget),
        )
        .route("/v1/invoices", get(routes::list_invoices))
        .route("/v1/exports/focus", get(routes::focus_export))
        .route("/v1/requests/{request_id}", get(routes::lookup_request))
        .route("/v1/price-books", post(routes::put_price_book))
        .route("/v1/periods/{period}/close", post(admin::close_month))
        .route(
            "/v1/tokens",
            get(admin::list_tokens).post(admin::issue_token),
        )
        .route("/v1/tokens/{token_id}/revoke", post(admin::revoke_token))
        .merge(pages::routes())
        .route("/metrics", get(crate::cost_metrics::metrics))
        .route(
            "/openapi.json",
            get(|| async {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    crate::openapi::document(),
                )
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route_layer(axum::middleware::from_fn(crate::extract::reject_nul))
        .method_not_allowed_fallback(crate::extract::method_not_allowed)
        .fallback(crate::extract::unknown_path)
        .with_state(state)
        .layer(axum::middleware::from_fn(serving::nul::reject_in_query))
}

pub async fn run(
    config: BillingConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BillingError> {
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| BillingError::Config(format!("BILLING_ADDR {}: {e}", config.addr)))?;
    // Settings are checked before the database is touched: a bad value is
    // named whatever state the database is in.
    if let Some(token) = &config.bootstrap_finance_token {
        if token.len() < 16 {
            return Err(BillingError::Config(
                "BILLING_BOOTSTRAP_FINANCE_TOKEN must be at least 16 characters".into(),
            ));
        }
    }
    let metrics_token_hash = match &config.metrics_token {
        Some(t) if t.len() < 16 => {
            return Err(BillingError::Config(
                "BILLING_METRICS_TOKEN must be at least 16 characters".into(),
            ))
        }
        Some(t) => Some(auth::hash_token(t)),
        None => None,
    };
    if config.session_minutes == 0 {
        return Err(BillingError::Config(
            "BILLING_SESSION_MINUTES must be above 0".into(),
        ));
    }
    let pool = schema::connect(&config.database_url, 8, Duration::from_secs(60)).await?;
    if let Some(path) = &config.tenants_file {
        let seed = tenant_admin::load("BILLING_TENANTS_FILE", path)?;
        tenant_admin::apply(&pool, &seed).await?;
        tracing::info!(tenants = seed.tenants.len(), "seeded tenants");
    }
    if let Some(token) = &config.bootstrap_finance_token {
        match tokens::bootstrap(&pool, token).await? {
            tokens::Bootstrap::Registered(token_id) => {
                tracing::info!(%token_id, "registered BILLING_BOOTSTRAP_FINANCE_TOKEN")
            }
            tokens::Bootstrap::Live(token_id) => {
                tracing::info!(%token_id, "BILLING_BOOTSTRAP_FINANCE_TOKEN is registered")
            }
            tokens::Bootstrap::Revoked(token_id) => tracing::warn!(
                %token_id,
                "BILLING_BOOTSTRAP_FINANCE_TOKEN was revoked and stays revoked; set a new value or unset it"
            ),
        }
    }
    let mut conn = pool.acquire().await?;
    if let Some(path) = &config.price_book_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            BillingError::Config(format!("BILLING_PRICE_BOOK_FILE {}: {e}", path.display()))
        })?;
        let book = PriceBook::from_yaml(&text).map_err(|e| {
            BillingError::Config(format!("BILLING_PRICE_BOOK_FILE {}: {e}", path.display()))
        })?;
        store::price_books::put(&mut conn, &book).await?;
        tracing::info!(version = %book.version, "price book loaded");
    }
    drop(conn);
    let archive = match config.archive_url.as_str() {
        "off" => None,
        url => Some(crate::lookup::Archive {
            pool: pool.clone(),
            store: std::sync::Arc::new(
                archive::store::open(url)
                    .map_err(|e| BillingError::Config(format!("ARCHIVE_URL {url:?}: {e}")))?,
            ),
        }),
    };
    tracing::info!(addr = %config.addr, "billing-api listening");
    let state = AppState {
        pool,
        cost_metrics: Default::default(),
        metrics_token_hash,
        session_lifetime: Duration::from_secs(config.session_minutes.saturating_mul(60)),
        secure_cookies: config.secure_cookies,
        archive,
    };
    serving::serve(listener, app(state), config.http, shutdown)
        .await
        .map_err(|e| BillingError::Config(format!("serving on {}: {e}", config.addr)))
}
