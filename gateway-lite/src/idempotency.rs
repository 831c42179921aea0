//! `Idempotency-Key`: a retry with the same key (per API key) within 24
//! hours gets the stored response and is billed once; a duplicate that
//! arrives while the first is still running gets 409; the same key with a
//! different body gets 422.
//!
//! Answers are durable: they are written to the outbox in the same record
//! as the request's usage event (see [`Guard::answer`]),
//! so a retry after a gateway crash or restart is answered from the store
//! exactly when the first attempt was billed, and runs afresh otherwise.
//! Keys in flight are tracked in memory only (a crash ends them anyway).
//! A request that failed or was cancelled stores nothing, so its retry
//! runs again. Answers older than the TTL are swept in the background.
//!
//! The store is per gateway: with several gateways, route an API key's
//! retries to the same one (or put a shared store behind this module).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use sha2::{Digest, Sha256};

use crate::outbox::{Outbox, OutboxError};

/// How long a key is remembered.
pub const TTL: Duration = Duration::from_secs(24 * 3600);
/// The longest key accepted.
pub const MAX_KEY_LEN: usize = 255;

/// A stored successful response, replayed as is (its `X-Request-Id` included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub content_type: &'static str,
    pub request_id: String,
    pub body: Bytes,
}

/// What to do with a request carrying an `Idempotency-Key`.
#[derive(Debug)]
pub enum Begin {
    /// First time: run it; the guard's answer is stored with its usage event.
    New(Guard),
    /// Answered before: send this.
    Replay(Stored),
    /// The first request with this key is still running.
    InFlight,
    /// The key was used with a different request body.
    Mismatch,
}

/// The key store; cheap to clone.
#[derive(Clone)]
pub struct Idempotency {
    /// Store key → body hash of the request running under it.
    in_flight: Arc<Mutex<HashMap<Vec<u8>, [u8; 32]>>>,
    store: Outbox,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency").finish_non_exhaustive()
    }
}

fn store_key(api_key_id: &str, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(api_key_id.len() + 1 + key.len());
    k.extend_from_slice(api_key_id.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

/// A stored answer: stored at (unix ms) | body hash | content type | request id | body.
fn encode(at_ms: i64, body_hash: &[u8; 32], s: &Stored) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + 32 + 1 + 2 + s.request_id.len() + s.body.len());
    v.extend_from_slice(&at_ms.to_be_bytes());
    v.extend_from_slice(body_hash);
    v.push(u8::from(s.content_type == "text/event-stream"));
    v.extend_from_slice(&(s.request_id.len() as u16).to_be_bytes());
    v.extend_from_slice(s.request_id.as_bytes());
    v.extend_from_slice(&s.body);
    v
}

fn stored_at(v: &[u8]) -> Option<i64> {
    Some(i64::from_be_bytes(v.get(..8)?.try_into().ok()?))
}

fn decode(v: &[u8]) -> Option<(i64, [u8; 32], Stored)> {
    let at = stored_at(v)?;
    let hash: [u8; 32] = v.get(8..40)?.try_into().ok()?;
    let content_type = if *v.get(40)? == 1 {
        "text/event-stream"
    } else {
        "application/json"
    };
    let n = u16::from_be_bytes(v.get(41..43)?.try_into().ok()?) as usize;
    let request_id = std::str::from_utf8(v.get(43..43 + n)?).ok()?.to_owned();
    let body = Bytes::copy_from_slice(v.get(43 + n..)?);
    Some((
        at,
        hash,
        Stored {
            content_type,
            request_id,
            body,
        },
    ))
}

impl Idempotency {
    pub fn new(store: Outbox) -> Self {
        Self {
            in_flight: Arc::default(),
            store,
        }
    }

    fn in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, [u8; 32]>> {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Looks `key` up for `api_key_id` at `now_ms` (unix ms), claiming it
    /// when it is new.
    pub fn begin(
        &self,
        api_key_id: &str,
        key: &str,
        body: &[u8],
        now_ms: i64,
    ) -> Result<Begin, OutboxError> {
        let body_hash: [u8; 32] = Sha256::digest(body).into();
        let id = store_key(api_key_id, key);
        let mut in_flight = self.in_flight();
        if let Some(h) = in_flight.get(&id) {
            return Ok(if *h == body_hash {
                Begin::InFlight
            } else {
                Begin::Mismatch
            });
        }
        let ttl_ms = TTL.as_millis() as i64;
        if let Some((at, h, stored)) = self.store.answer(&id)?.as_deref().and_then(decode) {
            if now_ms - at < ttl_ms {
                return Ok(if h == body_hash {
                    Begin::Replay(stored)
                } else {
                    Begin::Mismatch
                });
            }
        }
        in_flight.insert(id.clone(), body_hash);
        Ok(Begin::New(Guard {
            keys: self.clone(),
            id,
            body_hash,
        }))
    }

    /// Deletes answers older than the TTL; returns how many.
    pub fn sweep(&self, now_ms: i64) -> Result<u64, OutboxError> {
        let ttl_ms = TTL.as_millis() as i64;
        self.store
            .sweep_answers(|v| stored_at(v).is_none_or(|at| now_ms - at >= ttl_ms))
    }

    /// Sweeps expired answers every `every`, in the background.
    pub fn spawn_sweeper(&self, every: Duration) {
        let keys = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let now = chrono::Utc::now().timestamp_millis();
                let k = keys.clone();
                match tokio::task::spawn_blocking(move || k.sweep(now)).await {
                    Ok(Ok(n)) if n > 0 => tracing::info!(removed = n, "expired idempotent answers"),
                    Ok(Err(e)) => tracing::warn!(error = %e, "sweeping idempotent answers"),
                    _ => {}
                }
            }
        });
    }
}

/// A claimed key, held while its request runs. Dropping it releases the
/// claim; the answer, if any, is stored with the usage event through
/// [`Guard::answer`].
#[derive(Debug)]
pub struct Guard {
    keys: Idempotency,
    id: Vec<u8>,
    body_hash: [u8; 32],
}

impl Guard {
    /// The store entry for `response`, to commit with the usage event.
    pub fn answer(&self, response: &Stored, now_ms: i64) -> (Vec<u8>, Vec<u8>) {
        (self.id.clone(), encode(now_ms, &self.body_hash, response))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.keys.in_flight().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    fn stored() -> Stored {
        Stored {
            content_type: "text/event-stream",
            request_id: "req_1".into(),
            body: Bytes::from_static(b"data: {}\n\n"),
        }
    }

    async fn complete(guard: Guard, store: &Outbox, at: i64) {
        store
            .append_with_answer(
                "t".into(),
                b"{}".to_vec(),
                Some(guard.answer(&stored(), at)),
            )
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn retry_replays_duplicate_conflicts_and_keys_expire() {
        let dir = tempfile::tempdir().unwrap();
        let store = Outbox::open(&dir.path().join("outbox")).unwrap();
        let s = Idempotency::new(store.clone());
        let t0 = 1_000_000;
        let Ok(Begin::New(g)) = s.begin("k", "a", b"x", t0) else {
            unreachable!()
        };
        assert!(matches!(s.begin("k", "a", b"x", t0), Ok(Begin::InFlight)));
        assert!(matches!(s.begin("k", "a", b"y", t0), Ok(Begin::Mismatch)));
        // Another API key has its own namespace.
        assert!(matches!(s.begin("k2", "a", b"x", t0), Ok(Begin::New(_))));
        complete(g, &store, t0).await;
        assert!(matches!(s.begin("k", "a", b"x", t0), Ok(Begin::Replay(r)) if r == stored()));
        assert!(matches!(s.begin("k", "a", b"y", t0), Ok(Begin::Mismatch)));
        let later = t0 + TTL.as_millis() as i64 + 1;
        assert!(matches!(s.begin("k", "a", b"x", later), Ok(Begin::New(_))));
        assert_eq!(s.sweep(later).unwrap(), 1);
    }

    #[tokio::test]
    async fn answers_survive_a_restart_and_a_failed_attempt_releases_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox");
        {
            let store = Outbox::open(&path).unwrap();
            let s = Idempotency::new(store.clone());
            let first = s.begin("k", "a", b"x", 5).unwrap();
            drop(first);
            let Ok(Begin::New(g)) = s.begin("k", "a", b"x", 5) else {
                unreachable!()
            };
            complete(g, &store, 5).await;
        }
        let s = Idempotency::new(crate::outbox::reopen(&path).await);
        assert!(matches!(s.begin("k", "a", b"x", 6), Ok(Begin::Replay(r)) if r == stored()));
    }
}
