//! The state every handler shares. Below the handlers and the router, so
//! no module that uses it imports the module that builds it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::Mutex;

#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    /// `/metrics`' last rendering ([`crate::cost_metrics`]).
    pub cost_metrics: MetricsCache,
    /// The bearer token `/metrics` asks for (its SHA-256); `None` leaves
    /// `/metrics` closed to everyone.
    pub metrics_token_hash: Option<[u8; 32]>,
    /// How long a page session lasts after sign-in.
    pub session_lifetime: Duration,
    /// Whether session cookies carry `Secure` (behind TLS).
    pub secure_cookies: bool,
    /// Where request lookups find requests past request_log's retention
    /// (`None`: request_log only).
    pub archive: Option<crate::lookup::Archive>,
}

impl AppState {
    /// State on `pool` with the defaults: `/metrics` closed, 8-hour
    /// sessions, cookies without `Secure`, lookups in request_log only.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            cost_metrics: Default::default(),
            metrics_token_hash: None,
            session_lifetime: Duration::from_secs(8 * 3600),
            secure_cookies: false,
            archive: None,
        }
    }
}

/// The last rendering of the cost metrics and when it was made.
#[derive(Clone, Default)]
pub struct MetricsCache(pub(crate) Arc<Mutex<Option<(Instant, String)>>>);
