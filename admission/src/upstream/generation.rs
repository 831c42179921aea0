//! A request running on whichever engine serves its model, and an
//! owner's wait for room on its dedicated replicas.

use engine::error::EngineError;
use engine::simulator::{self, Completion, Piece};

use super::dedicated;
use super::http::HttpGeneration;

/// An owner's request waiting for room (see [`Upstreams::owner_waiting`]);
/// dropping it ends the wait.
#[derive(Debug)]
pub enum OwnerWaiting {
    Simulated(engine::replica_pool::OwnerWaiting),
    Http(dedicated::OwnerBusy),
}

/// A request running on whichever engine serves its model.
pub enum Generation {
    Simulated(simulator::Generation),
    Http(Box<HttpGeneration>),
}

impl Generation {
    /// The replica running it (an HTTP upstream's configured name, as its
    /// usage event carries it unless the engine names another).
    pub fn replica_id(&self) -> Option<&str> {
        match self {
            Self::Simulated(g) => Some(g.replica_id()),
            Self::Http(g) => Some(g.replica_id()),
        }
    }

    /// The tenant the replica running it is dedicated to, if any.
    pub fn dedicated_to(&self) -> Option<&str> {
        match self {
            Self::Simulated(g) => g.dedicated_to(),
            Self::Http(g) => g.dedicated_to(),
        }
    }

    pub async fn next(&mut self) -> Result<Piece, EngineError> {
        match self {
            Self::Simulated(g) => g.next().await,
            Self::Http(g) => g.next().await,
        }
    }

    pub async fn finish(self) -> Result<Completion, EngineError> {
        match self {
            Self::Simulated(g) => g.finish().await,
            Self::Http(g) => g.finish().await,
        }
    }

    /// Stops the request at its engine (KV freed) and returns what it used.
    pub async fn cancel(self) -> Result<Completion, EngineError> {
        match self {
            Self::Simulated(g) => g.cancel().await,
            Self::Http(g) => Ok(g.cancel().await),
        }
    }
}
