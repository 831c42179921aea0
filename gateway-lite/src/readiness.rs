//! Readiness, apart from liveness: `/readyz` answers 200 while the gateway
//! wants new requests and 503 (`draining`) from the moment it is told to
//! stop, so a load balancer sends new work elsewhere while the gateway
//! still accepts for `GATEWAY_DRAIN_DELAY_MS`, then stops accepting, lets
//! its admitted requests finish and drains its outbox. `/healthz` stays
//! 200 until the process exits (it is alive, just not taking work).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::GatewayError;

/// Whether the gateway is taking new work; shared by every handler.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// From now on `/readyz` answers 503.
    pub fn drain(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`drain`](Self::drain) has been called.
    pub fn draining(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What `GET /readyz` answers.
pub fn answer(readiness: &Readiness) -> Result<&'static str, GatewayError> {
    if readiness.draining() {
        Err(GatewayError::Draining)
    } else {
        Ok("ready")
    }
}
