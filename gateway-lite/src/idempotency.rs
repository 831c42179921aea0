//! `Idempotency-Key`: a retry with the same key (per API key) within 24
//! hours gets the stored response and is billed once; a duplicate that
//! arrives while the first is still running gets 409; the same key with a
//! different body gets 422.
//!
//! **In memory only**: a gateway restart forgets every key, so a retry that
//! crosses a restart runs (and is billed) again. Only successful answers
//! are kept; a request that failed or was cancelled releases its key so a
//! retry runs afresh. Entries are swept once they are older than the TTL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use sha2::{Digest, Sha256};

/// How long a key is remembered.
pub const TTL: Duration = Duration::from_secs(24 * 3600);
/// The longest key accepted.
pub const MAX_KEY_LEN: usize = 255;

/// A stored successful response, replayed as is (its `X-Request-Id` included).
#[derive(Debug, Clone)]
pub struct Stored {
    pub content_type: &'static str,
    pub request_id: String,
    pub body: Bytes,
}

#[derive(Debug)]
enum Slot {
    InFlight {
        body_hash: [u8; 32],
    },
    Done {
        body_hash: [u8; 32],
        at: Instant,
        response: Stored,
    },
}

/// What to do with a request carrying an `Idempotency-Key`.
#[derive(Debug)]
pub enum Begin {
    /// First time: run it; the guard stores the answer or releases the key.
    New(Guard),
    /// Answered before: send this.
    Replay(Stored),
    /// The first request with this key is still running.
    InFlight,
    /// The key was used with a different request body.
    Mismatch,
}

#[derive(Default)]
struct Inner {
    slots: HashMap<(String, String), Slot>,
    last_sweep: Option<Instant>,
}

/// The key store; cheap to clone.
#[derive(Clone, Default)]
pub struct Idempotency {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency").finish_non_exhaustive()
    }
}

impl Idempotency {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Looks `key` up for `api_key_id`, claiming it when it is new.
    pub fn begin(&self, api_key_id: &str, key: &str, body: &[u8], now: Instant) -> Begin {
        let body_hash: [u8; 32] = Sha256::digest(body).into();
        let mut inner = self.lock();
        if inner
            .last_sweep
            .is_none_or(|t| now.saturating_duration_since(t) > Duration::from_secs(60))
        {
            inner.slots.retain(|_, s| match s {
                Slot::InFlight { .. } => true,
                Slot::Done { at, .. } => now.saturating_duration_since(*at) < TTL,
            });
            inner.last_sweep = Some(now);
        }
        let id = (api_key_id.to_owned(), key.to_owned());
        match inner.slots.get(&id) {
            Some(Slot::InFlight { body_hash: h }) if *h != body_hash => Begin::Mismatch,
            Some(Slot::InFlight { .. }) => Begin::InFlight,
            Some(Slot::Done {
                body_hash: h,
                at,
                response,
            }) if now.saturating_duration_since(*at) < TTL => {
                if *h == body_hash {
                    Begin::Replay(response.clone())
                } else {
                    Begin::Mismatch
                }
            }
            _ => {
                inner.slots.insert(id.clone(), Slot::InFlight { body_hash });
                Begin::New(Guard {
                    store: self.clone(),
                    id,
                    body_hash,
                    done: false,
                })
            }
        }
    }
}

/// A claimed key. [`Guard::complete`] stores the answer; dropping the guard
/// without completing releases the key.
#[derive(Debug)]
pub struct Guard {
    store: Idempotency,
    id: (String, String),
    body_hash: [u8; 32],
    done: bool,
}

impl Guard {
    pub fn complete(mut self, response: Stored, now: Instant) {
        self.done = true;
        let mut inner = self.store.lock();
        inner.slots.insert(
            self.id.clone(),
            Slot::Done {
                body_hash: self.body_hash,
                at: now,
                response,
            },
        );
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.done {
            self.store.lock().slots.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    fn stored() -> Stored {
        Stored {
            content_type: "application/json",
            request_id: "req_1".into(),
            body: Bytes::from_static(b"{}"),
        }
    }

    #[test]
    fn retry_replays_duplicate_conflicts_and_keys_expire() {
        let s = Idempotency::default();
        let t0 = Instant::now();
        let Begin::New(g) = s.begin("k", "a", b"x", t0) else {
            unreachable!()
        };
        assert!(matches!(s.begin("k", "a", b"x", t0), Begin::InFlight));
        assert!(matches!(s.begin("k", "a", b"y", t0), Begin::Mismatch));
        // Another API key has its own namespace.
        assert!(matches!(s.begin("k2", "a", b"x", t0), Begin::New(_)));
        g.complete(stored(), t0);
        assert!(matches!(s.begin("k", "a", b"x", t0), Begin::Replay(r) if r.request_id == "req_1"));
        assert!(matches!(s.begin("k", "a", b"y", t0), Begin::Mismatch));
        assert!(matches!(
            s.begin("k", "a", b"x", t0 + TTL + Duration::from_secs(1)),
            Begin::New(_)
        ));
    }

    #[test]
    fn a_failed_first_attempt_releases_the_key() {
        let s = Idempotency::default();
        let t0 = Instant::now();
        let first = s.begin("k", "a", b"x", t0);
        drop(first);
        assert!(matches!(s.begin("k", "a", b"x", t0), Begin::New(_)));
    }
}
