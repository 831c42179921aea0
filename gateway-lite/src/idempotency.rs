//! `Idempotency-Key`: a retry with the same key (per API key) within 24
//! hours gets the stored response and its `X-Request-Id` and is billed
//! once, whichever gateway it lands on; a duplicate that arrives while the
//! first is still running, anywhere, gets 409; the same key with a
//! different body gets 422.
//!
//! Where a claim lives:
//!
//! - **Redis** (shared by every gateway): the claim — body hash, state
//!   (`running`, `done`, `failed`), owning gateway, attempt number — and,
//!   once done, the answer. A `running` claim whose gateway stopped
//!   renewing its liveness (15 s) is taken over by the retry.
//! - **the outbox** (this gateway's disk): the answer, in the same commit
//!   as the request's usage event ([`Guard::answer`]), so a retry that
//!   comes back to this gateway is answered exactly when the first attempt
//!   was billed, even after Redis lost everything.
//!
//! The request id is not random: it is derived from the API key, the
//! Idempotency-Key, the body, the attempt number and the UTC day
//! ([`usage_contract::RequestId::derived`]). So when Redis lost a claim
//! (it keeps nothing on disk) and a retry runs again on another gateway,
//! its usage event carries the first attempt's id and ingest's dedupe
//! bills it once: the client gets a fresh answer under the same
//! `X-Request-Id`, and the first attempt's figures are what is billed (the
//! re-run's event is a dead letter, or nothing when identical).
//!
//! Only a billed attempt consumes an attempt number. One refused before
//! it ran (a limit's 429, a full queue's 503, anything before its usage
//! event is written: [`Guard::billed`] was never called) puts the claim
//! back as it found it — gone if it created it — before the refusal is
//! sent ([`Guard::refused`]; a guard merely dropped does it in the
//! background), so a retry anywhere runs at once, and the attempt that is
//! answered is attempt 0 unless a billed attempt failed before it, and a
//! gateway that finds no claim in Redis (flushed, restarted empty) derives
//! the same id. A failed or cancelled attempt (billed for what it used)
//! marks the claim `failed`; the retry runs as the next attempt, with the
//! next id. What this cannot cover: Redis lost the claim, the retry lands
//! on another gateway *and* after midnight UTC — then it is a new request
//! of the new day; and after a billed failure, a retry on another gateway
//! once Redis lost the claim runs under the failed attempt's id (billed
//! once, as the failed attempt).
//!
//! Keys in flight on this gateway are also tracked in memory, so two
//! concurrent duplicates on one gateway never reach Redis both. When Redis
//! is unreachable, this gateway's memory and outbox are all there is (a
//! duplicate on another gateway runs, and the derived id bills it once).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use redis::Script;
use sha2::{Digest, Sha256};
use usage_contract::RequestId;

use crate::outbox::{Outbox, OutboxError};
use admission::cluster::Cluster;

/// How long a key is remembered (in this gateway's outbox, and by default
/// in Redis: `GATEWAY_IDEMPOTENCY_SHARED_TTL_SECS`).
pub const TTL: Duration = Duration::from_secs(24 * 3600);
/// Answers larger than this stay in the answering gateway's outbox only: a
/// retry elsewhere runs again under the same id (billed once).
pub const MAX_SHARED_ANSWER: usize = 1 << 20;
/// The longest key accepted.
pub const MAX_KEY_LEN: usize = 255;

/// Claims a key, or says what it already is.
///
/// KEYS[1]: the claim. ARGV: body hash, this gateway, liveness key prefix,
/// TTL ms, whether a retry may run (`1`; else it is shed, nothing changed).
/// Returns `{'new', attempt, retry (0/1), state, owner, attempt}` (the
/// last three: the claim as it was, `''` when there was none, to put back
/// if this attempt is refused), `{'replay', request id, content type,
/// body}`, `{'in_flight'}`, `{'mismatch'}` or `{'shed'}`.
const BEGIN: &str = r"
local k, body, me, alive, ttl, may = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local v = redis.call('HMGET', k, 'body', 'state', 'owner', 'attempt', 'rid', 'ctype', 'answer')
if not v[1] then
  redis.call('HSET', k, 'body', body, 'state', 'running', 'owner', me, 'attempt', 0)
  redis.call('PEXPIRE', k, ttl)
  return {'new', 0, 0, '', '', ''}
end
if v[1] ~= body then return {'mismatch'} end
if v[2] == 'done' then return {'replay', v[5], v[6], v[7]} end
local attempt = tonumber(v[4]) or 0
local state, owner = v[2] or 'failed', v[3] or ''
if state == 'kept' then
  -- Answered, the answer too large to share: run again, same attempt.
  if may ~= '1' then return {'shed'} end
  redis.call('HSET', k, 'state', 'running', 'owner', me)
  return {'new', attempt, 1, state, owner, attempt}
end
if state == 'running' then
  if owner ~= me and redis.call('EXISTS', alive .. owner) == 1 then return {'in_flight'} end
  if may ~= '1' then return {'shed'} end
  redis.call('HSET', k, 'owner', me)
  return {'new', attempt, 1, state, owner, attempt}
end
if may ~= '1' then return {'shed'} end
redis.call('HSET', k, 'state', 'running', 'owner', me, 'attempt', attempt + 1)
return {'new', attempt + 1, 1, state, owner, attempt}
";

/// Puts a claim back as an attempt refused before it ran found it.
/// KEYS[1]: the claim. ARGV: this gateway, attempt, then the claim as it
/// was: state (`''`: there was none), owner, attempt. Nothing changes
/// unless the claim is still this attempt's.
const RELEASE: &str = r"
local k, me, attempt = KEYS[1], ARGV[1], ARGV[2]
local v = redis.call('HMGET', k, 'state', 'owner', 'attempt')
if v[1] ~= 'running' or v[2] ~= me or v[3] ~= attempt then return 0 end
if ARGV[3] == '' then
  redis.call('DEL', k)
else
  redis.call('HSET', k, 'state', ARGV[3], 'owner', ARGV[4], 'attempt', ARGV[5])
end
return 1
";

/// Ends a claim: `done` with the answer, `kept` (answered, the answer
/// too large to share: kept in the answering gateway's outbox only), or
/// `failed`.
/// KEYS[1]: the claim. ARGV: this gateway, attempt, state, TTL ms, then
/// (done) request id, content type, answer, body hash (the claim is whole
/// again even if Redis lost it while the request ran).
const FINISH: &str = r"
local k, me, attempt, state = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local v = redis.call('HMGET', k, 'state', 'attempt')
if v[1] == 'done' or (v[2] and v[2] ~= attempt) then return 0 end
if state == 'done' or state == 'kept' then
  redis.call('HSET', k, 'state', state, 'rid', ARGV[5], 'ctype', ARGV[6], 'answer', ARGV[7],
    'owner', me, 'body', ARGV[8], 'attempt', attempt)
  redis.call('PEXPIRE', k, ARGV[4])
elseif v[1] then
  redis.call('HSET', k, 'state', 'failed')
end
return 1
";

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
    /// Run it under the guard's request id; its answer is stored with its
    /// usage event and published to the other gateways.
    New(Guard),
    /// Answered before: send this.
    Replay(Stored),
    /// The first request with this key is still running.
    InFlight,
    /// The key was used with a different request body.
    Mismatch,
    /// A retry that would run again, refused by the retry budget (nothing
    /// changed: the same retry later runs as it would have now).
    Shed,
}

/// The claim scripts.
struct Scripts {
    begin: Script,
    finish: Script,
    release: Script,
}

/// The key store; cheap to clone.
#[derive(Clone)]
pub struct Idempotency {
    /// Store key → body hash of the request running under it here.
    in_flight: Arc<Mutex<HashMap<Vec<u8>, [u8; 32]>>>,
    store: Outbox,
    cluster: Cluster,
    scripts: Arc<Scripts>,
    /// How long claims and answers live in Redis.
    shared_ttl: Duration,
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

fn content_type(text: &str) -> &'static str {
    if text == "text/event-stream" {
        "text/event-stream"
    } else {
        "application/json"
    }
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
    pub fn new(store: Outbox, cluster: Cluster) -> Self {
        Self {
            in_flight: Arc::default(),
            store,
            cluster,
            scripts: Arc::new(Scripts {
                begin: Script::new(BEGIN),
                finish: Script::new(FINISH),
                release: Script::new(RELEASE),
            }),
            shared_ttl: TTL,
        }
    }

    /// Claims and answers live `ttl` in Redis (at most [`TTL`]; the outbox
    /// keeps answers [`TTL`] whatever this is): Redis holds every answer of
    /// that long, so size it as idempotent requests/s × `ttl` × answer size.
    pub fn with_shared_ttl(mut self, ttl: Duration) -> Self {
        self.shared_ttl = ttl.min(TTL);
        self
    }

    fn in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, [u8; 32]>> {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Looks `key` up for `api_key_id` at `now_ms` (unix ms), claiming it
    /// when it is new: here, in this gateway's outbox, then in Redis.
    pub async fn begin(
        &self,
        api_key_id: &str,
        key: &str,
        body: &[u8],
        now_ms: i64,
        may_retry: bool,
    ) -> Result<Begin, OutboxError> {
        let body_hash: [u8; 32] = Sha256::digest(body).into();
        let id = store_key(api_key_id, key);
        {
            let mut in_flight = self.in_flight();
            if let Some(h) = in_flight.get(&id) {
                return Ok(if *h == body_hash {
                    Begin::InFlight
                } else {
                    Begin::Mismatch
                });
            }
            in_flight.insert(id.clone(), body_hash);
        }
        // From here on, anything but `New` must release the local claim.
        let release = |b: Begin| {
            if !matches!(b, Begin::New(_)) {
                self.in_flight().remove(&id);
            }
            b
        };
        let ttl_ms = TTL.as_millis() as i64;
        if let Some((at, h, stored)) = self.store.answer(&id)?.as_deref().and_then(decode) {
            if now_ms - at < ttl_ms {
                return Ok(release(if h == body_hash {
                    Begin::Replay(stored)
                } else {
                    Begin::Mismatch
                }));
            }
        }
        let claim = self.claim_key(&id);
        let (attempt, retry, prior) = match self.cluster.conn() {
            None => (0, false, None),
            Some(mut conn) => {
                let mut call = self.scripts.begin.key(&claim);
                call.arg(hex::encode(body_hash))
                    .arg(self.cluster.gateway_id())
                    .arg(self.cluster.alive_key(""))
                    .arg(self.shared_ttl.as_millis() as u64)
                    .arg(if may_retry { "1" } else { "0" });
                admission::telemetry::redis_call("idempotency");
                let reply: Result<Vec<redis::Value>, _> = match call.invoke_async(&mut conn).await {
                    // Redis restarted: once more, on a new connection.
                    Err(e) if e.is_connection_dropped() => {
                        admission::telemetry::redis_call("idempotency");
                        call.invoke_async(&mut conn).await
                    }
                    other => other,
                };
                match reply {
                    Err(e) => {
                        self.cluster.failed(&e);
                        (0, false, None)
                    }
                    Ok(v) => match parse_begin(&v) {
                        Claimed::New {
                            attempt,
                            retry,
                            prior,
                        } => (attempt, retry, Some(prior)),
                        Claimed::Other(b) => return Ok(release(b)),
                    },
                }
            }
        };
        let day = chrono::DateTime::from_timestamp_millis(now_ms)
            .unwrap_or_default()
            .date_naive();
        let mut seed = id.clone();
        seed.push(0);
        seed.extend_from_slice(&body_hash);
        seed.extend_from_slice(&attempt.to_be_bytes());
        Ok(Begin::New(Guard {
            keys: self.clone(),
            id,
            claim,
            body_hash,
            attempt,
            retry,
            prior,
            request_id: RequestId::derived(day, &seed),
            billed: false,
            published: false,
        }))
    }

    fn claim_key(&self, id: &[u8]) -> String {
        self.cluster
            .key(&format!("idem:{}", hex::encode(Sha256::digest(id))))
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

    /// Ends the claim in Redis (best effort: a claim Redis does not hear
    /// about is taken over when this gateway's liveness lapses).
    async fn finish(
        &self,
        claim: &str,
        attempt: u64,
        body_hash: &[u8; 32],
        answer: Option<&Stored>,
    ) {
        let Some(mut conn) = self.cluster.conn() else {
            return;
        };
        admission::telemetry::redis_call("idempotency");
        let mut call = self.scripts.finish.key(claim);
        let state = match answer {
            None => "failed",
            Some(a) if a.body.len() > MAX_SHARED_ANSWER => "kept",
            Some(_) => "done",
        };
        call.arg(self.cluster.gateway_id())
            .arg(attempt)
            .arg(state)
            .arg(self.shared_ttl.as_millis() as u64);
        if let Some(a) = answer {
            let body: &[u8] = if state == "kept" {
                b""
            } else {
                a.body.as_ref()
            };
            call.arg(&a.request_id)
                .arg(a.content_type)
                .arg(body)
                .arg(hex::encode(body_hash));
        }
        if let Err(e) = call.invoke_async::<i64>(&mut conn).await {
            tracing::warn!(error = %e, "idempotency claim not updated in Redis");
            self.cluster.failed(&e);
        }
    }

    /// Puts the claim back as `prior` (an attempt refused before it ran:
    /// it consumes no attempt number).
    async fn put_back(&self, claim: &str, attempt: u64, prior: &Prior) {
        let Some(mut conn) = self.cluster.conn() else {
            return;
        };
        admission::telemetry::redis_call("idempotency");
        let result = self
            .scripts
            .release
            .key(claim)
            .arg(self.cluster.gateway_id())
            .arg(attempt)
            .arg(&prior.state)
            .arg(&prior.owner)
            .arg(&prior.attempt)
            .invoke_async::<i64>(&mut conn)
            .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, "refused attempt's idempotency claim not put back in Redis");
            self.cluster.failed(&e);
        }
    }
}

/// A claim as [`BEGIN`] found it (`state` empty: there was none).
#[derive(Debug, Clone, Default)]
struct Prior {
    state: String,
    owner: String,
    attempt: String,
}

enum Claimed {
    New {
        attempt: u64,
        retry: bool,
        prior: Prior,
    },
    Other(Begin),
}

fn parse_begin(v: &[redis::Value]) -> Claimed {
    let text = |i: usize| -> Option<String> {
        match v.get(i)? {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            redis::Value::SimpleString(s) => Some(s.clone()),
            redis::Value::Int(n) => Some(n.to_string()),
            _ => None,
        }
    };
    match text(0).as_deref() {
        Some("new") => Claimed::New {
            attempt: text(1).and_then(|a| a.parse().ok()).unwrap_or(0),
            retry: text(2).as_deref() == Some("1"),
            prior: Prior {
                state: text(3).unwrap_or_default(),
                owner: text(4).unwrap_or_default(),
                attempt: text(5).unwrap_or_default(),
            },
        },
        Some("shed") => Claimed::Other(Begin::Shed),
        Some("replay") => {
            let body = match v.get(3) {
                Some(redis::Value::BulkString(b)) => Bytes::from(b.clone()),
                _ => Bytes::new(),
            };
            Claimed::Other(Begin::Replay(Stored {
                content_type: content_type(&text(2).unwrap_or_default()),
                request_id: text(1).unwrap_or_default(),
                body,
            }))
        }
        Some("mismatch") => Claimed::Other(Begin::Mismatch),
        // `in_flight`, or a reply this version does not know: not twice at once.
        _ => Claimed::Other(Begin::InFlight),
    }
}

/// A claimed key, held while its request runs. Dropping it releases the
/// claim here and, unless [`Guard::publish`] was called, in Redis: marked
/// failed if the attempt was [`Guard::billed`] (the retry runs as the next
/// attempt), else put back as it was (the retry runs as this attempt).
#[derive(Debug)]
pub struct Guard {
    keys: Idempotency,
    id: Vec<u8>,
    claim: String,
    body_hash: [u8; 32],
    attempt: u64,
    /// The claim was there before: this request runs again.
    retry: bool,
    /// The claim in Redis as this attempt found it (`None`: not claimed
    /// in Redis, which was unreachable).
    prior: Option<Prior>,
    request_id: RequestId,
    billed: bool,
    published: bool,
}

impl Guard {
    /// The id this attempt runs under (derived; see the module docs).
    pub fn request_id(&self) -> RequestId {
        self.request_id
    }

    /// Whether this request runs again under a claim that was there.
    pub fn is_retry(&self) -> bool {
        self.retry
    }

    /// This attempt was refused before it ran (a limit, a full queue): the
    /// claim is put back as it was before the client is answered, so a
    /// retry on any gateway runs at once, under this attempt's id.
    pub async fn refused(mut self) {
        if let Some(prior) = self.prior.take() {
            self.keys.put_back(&self.claim, self.attempt, &prior).await;
        }
        // Dropped here: released on this gateway, nothing more in Redis.
    }

    /// This attempt's usage event is durable: it used its attempt number,
    /// and a retry runs under the next one.
    pub fn billed(&mut self) {
        self.billed = true;
    }

    /// The store entry for `response`, to commit with the usage event.
    pub fn answer(&self, response: &Stored, now_ms: i64) -> (Vec<u8>, Vec<u8>) {
        (self.id.clone(), encode(now_ms, &self.body_hash, response))
    }

    /// After the answer is durable with its usage event: tells every
    /// gateway, so a retry anywhere gets it.
    pub async fn publish(&mut self, response: &Stored) {
        self.published = true;
        self.keys
            .finish(&self.claim, self.attempt, &self.body_hash, Some(response))
            .await;
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let (false, Some(prior)) = (self.published, self.prior.take()) {
            if let (Some(_), Ok(rt)) = (
                self.keys.cluster.conn(),
                tokio::runtime::Handle::try_current(),
            ) {
                // The key stays claimed here (a retry gets 409) until Redis
                // knows how this attempt ended: a billed one failed, and a
                // retry must run under the next id, never under this one's;
                // a refused one never ran, and its retry runs under this id.
                let (keys, claim, id) = (self.keys.clone(), self.claim.clone(), self.id.clone());
                let (attempt, hash, billed) = (self.attempt, self.body_hash, self.billed);
                rt.spawn(async move {
                    if billed {
                        keys.finish(&claim, attempt, &hash, None).await;
                    } else {
                        keys.put_back(&claim, attempt, &prior).await;
                    }
                    keys.in_flight().remove(&id);
                });
                return;
            }
        }
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
        let s = Idempotency::new(store.clone(), Cluster::local("gw"));
        let t0 = 1_000_000;
        let Ok(Begin::New(g)) = s.begin("k", "a", b"x", t0, true).await else {
            unreachable!()
        };
        assert!(matches!(
            s.begin("k", "a", b"x", t0, true).await,
            Ok(Begin::InFlight)
        ));
        assert!(matches!(
            s.begin("k", "a", b"y", t0, true).await,
            Ok(Begin::Mismatch)
        ));
        // Another API key has its own namespace.
        assert!(matches!(
            s.begin("k2", "a", b"x", t0, true).await,
            Ok(Begin::New(_))
        ));
        complete(g, &store, t0).await;
        assert!(
            matches!(s.begin("k", "a", b"x", t0, true).await, Ok(Begin::Replay(r)) if r == stored())
        );
        assert!(matches!(
            s.begin("k", "a", b"y", t0, true).await,
            Ok(Begin::Mismatch)
        ));
        let later = t0 + TTL.as_millis() as i64 + 1;
        assert!(matches!(
            s.begin("k", "a", b"x", later, true).await,
            Ok(Begin::New(_))
        ));
        assert_eq!(s.sweep(later).unwrap(), 1);
    }

    #[tokio::test]
    async fn answers_survive_a_restart_and_a_failed_attempt_releases_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox");
        {
            let store = Outbox::open(&path).unwrap();
            let s = Idempotency::new(store.clone(), Cluster::local("gw"));
            let first = s.begin("k", "a", b"x", 5, true).await.unwrap();
            drop(first);
            let Ok(Begin::New(g)) = s.begin("k", "a", b"x", 5, true).await else {
                unreachable!()
            };
            complete(g, &store, 5).await;
        }
        let s = Idempotency::new(crate::outbox::reopen(&path).await, Cluster::local("gw"));
        assert!(
            matches!(s.begin("k", "a", b"x", 6, true).await, Ok(Begin::Replay(r)) if r == stored())
        );
    }
}
