//! GPU time of an HTTP upstream replica that reports none, attributed in
//! one ledger for every gateway in front of it: the same arithmetic as
//! `crate::upstream::ledger::Ledger` (each interval × GPUs split among the
//! requests in flight by their in-flight tokens; the last one out of a busy
//! period takes what rounding left), run as Lua scripts in Redis on
//! Redis's own clock, in integers only: the per-weight integral in fixed
//! point ([`SCALE`]), each member's share as whole GPU-µs plus a remainder,
//! every value below 2^53 so Lua's doubles hold it exactly.
//!
//! Guarantee: over every busy period of a replica — an interval during
//! which at least one request from any gateway is in flight on it — the
//! GPU-seconds handed to its requests add up exactly to the period's
//! length × the replica's GPUs (`busy` in the replica's hash counts the
//! same total, to the microsecond). What it costs: one Redis call when a
//! request starts, one per [`crate::upstream::ledger::SHARED_GROW_EVERY`]
//! tokens it receives, one when it ends — never one per token; the split
//! between concurrent requests lags by at most that many tokens.
//!
//! A request whose gateway died stays in the ledger until that gateway's
//! liveness lapses (15 s), or until it restarts under the same id (members
//! are held by `id#incarnation`, like capacity in `limits`); the heartbeat
//! then removes it (its share until then is not billed to anyone, as its
//! usage event never existed). A
//! request the upstream refused (429/503) leaves at once, its share (the
//! moment before the refusal) counted with the reaped, not the
//! attributed: no usage event exists for it either. While
//! Redis is unreachable a request gets its own gateway's figure, which
//! over-counts when several gateways use the replica at once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use redis::Script;

use std::fmt::Write as _;

use crate::cluster::Cluster;
use crate::telemetry;

/// The fixed-point scale of the per-weight integral `pw`: GPU-µs × `S`
/// per unit of weight. Redis runs Lua 5.1, whose numbers are doubles:
/// every value the scripts keep is an integer below 2^53, so each sum,
/// product and floor division below is exact. A product that could pass
/// 2^53 is split (`mulq`), and the integral starts again from 0 (every
/// member settled first) before it reaches [`REBASE_AT`].
pub const SCALE: u64 = 1_000_000;
/// `pw` is rebased before it reaches this (2^50).
pub const REBASE_AT: u64 = 1 << 50;

/// Shared by every script: lets time run to now.
const ADVANCE: &str = r"
-- Integers are written with %.0f (Lua's own tostring keeps 14 digits, and
-- Redis's clock in µs has 16). Every value is an integer below 2^53.
local S, REBASE = __SCALE__, __REBASE__
local function I(x) return string.format('%.0f', x) end
-- floor(a * b / S) and its remainder, exact for a, b < 2^53 whose
-- product may not be: a * b = (a * bq) * S + a * br with b = bq * S + br.
local function mulq(a, b)
  local bq = math.floor(b / S)
  local br = b - bq * S
  local lo = a * br
  local lq = math.floor(lo / S)
  return a * bq + lq, lo - lq * S
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local r = redis.call('HMGET', K, 'last', 'w', 'pw', 'total', 'given', 'n')
local last, w, pw, total, given, n =
  tonumber(r[1]) or now, tonumber(r[2]) or 0, tonumber(r[3]) or 0,
  tonumber(r[4]) or 0, tonumber(r[5]) or 0, tonumber(r[6]) or 0
local function member(id)
  local raw = redis.call('HGET', M, id)
  if not raw then return nil end
  local v = {}
  for x in string.gmatch(raw, '%S+') do v[#v + 1] = x end
  -- weight, snap (pw when last settled), owed GPU-µs, owed remainder
  -- (GPU-µs × S, below S), gateway, joined (µs)
  return {tonumber(v[1]), tonumber(v[2]), tonumber(v[3]), tonumber(v[4]), v[5], tonumber(v[6])}
end
local function put(id, v)
  redis.call('HSET', M, id, I(v[1]) .. ' ' .. I(v[2]) .. ' ' .. I(v[3]) .. ' ' .. I(v[4]) .. ' ' .. v[5] .. ' ' .. I(v[6]))
end
-- What the member owes, up to pw: v[3] and v[4] brought forward.
local function settle(v)
  local q, rem = mulq(v[1], pw - v[2])
  local frac = v[4] + rem
  local carry = math.floor(frac / S)
  v[3] = v[3] + q + carry
  v[4] = frac - carry * S
  v[2] = pw
  return v
end
if now > last then
  local gpu = (now - last) * gpus
  if w > 0 then
    -- floor(gpu * S / w), exact: gpu = gq * w + gr.
    local gq = math.floor(gpu / w)
    local gr = gpu - gq * w
    pw = pw + gq * S + math.floor(gr * S / w)
    total = total + gpu
    redis.call('HINCRBY', K, 'busy', I(gpu))
  end
  last = now
end
-- The integral starts again from 0 before it could lose exactness: every
-- member settled at the old one (rare: a replica busy for days).
if pw >= REBASE then
  local all = redis.call('HGETALL', M)
  for j = 1, #all, 2 do
    local v = member(all[j])
    if v then
      settle(v)
      v[2] = 0
      put(all[j], v)
    end
  end
  pw = 0
end
local function save()
  redis.call('HSET', K, 'last', I(last), 'w', I(w), 'pw', I(pw), 'total', I(total), 'given', I(given), 'n', I(n))
  redis.call('EXPIRE', K, 86400)
  redis.call('EXPIRE', M, 86400)
end
-- The ledger's epoch: when this hash began, and its counters then (the
-- replica reports count from here; a hash Redis lost starts anew). Set
-- where members enter (JOIN) and where it is read (READ): time is busy
-- only with a member in.
local function epoch()
  if not redis.call('HGET', K, 'epoch_us') then
    local at = redis.call('HMGET', K, 'busy', 'attributed', 'reaped', 'lent')
    redis.call('HSET', K, 'epoch_us', I(now), 'epoch_busy', at[1] or '0',
               'epoch_attributed', at[2] or '0', 'epoch_reaped', at[3] or '0', 'epoch_lent', at[4] or '0')
  end
end
";

/// KEYS: replica hash, members hash. ARGV: gpus, weight, the gateway's
/// holder (`id#incarnation`).
const JOIN: &str = r"
local K, M, gpus = KEYS[1], KEYS[2], tonumber(ARGV[1])
__ADVANCE__
epoch()
local id = redis.call('HINCRBY', K, 'next', 1)
local weight = tonumber(ARGV[2])
w = w + weight
n = n + 1
put(id, {weight, pw, 0, 0, ARGV[3], now})
save()
return id
";

/// KEYS: replica hash, members hash. ARGV: gpus, id, tokens.
const GROW: &str = r"
local K, M, gpus = KEYS[1], KEYS[2], tonumber(ARGV[1])
__ADVANCE__
local v = member(ARGV[2])
if not v then return 0 end
settle(v)
local add = tonumber(ARGV[3])
v[1] = v[1] + add
put(ARGV[2], v)
w = w + add
save()
return 1
";

/// KEYS: replica hash, members hash. ARGV: gpus, id, (to reap) a
/// liveness key prefix: members of gateways without a liveness key leave
/// without a share, and `unbilled` when `id` leaves without a usage event
/// (the upstream refused it): its share counts as reaped, not attributed;
/// `lent` when it ran on a replica dedicated to another tenant: its share
/// counts as lent too.
/// Returns the micro-GPU-seconds of `id`.
const LEAVE: &str = r"
local K, M, gpus = KEYS[1], KEYS[2], tonumber(ARGV[1])
__ADVANCE__
local function out(id, v)
  w = w - v[1]
  n = n - 1
  redis.call('HDEL', M, id)
  settle(v)
  -- Rounded to the nearest GPU-µs (half up).
  local micros = v[3]
  if v[4] * 2 >= S then micros = micros + 1 end
  if n <= 0 then
    micros = total - given
    w, pw, total, given, n = 0, 0, 0, 0, 0
  else
    micros = math.max(0, math.min(micros, total - given))
    given = given + micros
  end
  return micros
end
-- A member's gateway is alive while its liveness key holds the member's
-- incarnation (`id#incarnation`): a restart under the same id is a new
-- life, and what the previous one left in flight is reaped.
local function live(field)
  local id, inc = string.match(field, '^(.*)#([^#]*)$')
  if not id then return redis.call('EXISTS', ARGV[3] .. field) == 1 end
  return redis.call('GET', ARGV[3] .. id) == inc
end
local result = 0
if ARGV[2] ~= '' then
  local v = member(ARGV[2])
  if v then
    result = out(ARGV[2], v)
    if ARGV[4] == 'unbilled' then
      redis.call('HINCRBY', K, 'reaped', I(result))
    else
      redis.call('HINCRBY', K, 'attributed', I(result))
      if ARGV[4] == 'lent' then
        redis.call('HINCRBY', K, 'lent', I(result))
      end
    end
  end
end
if ARGV[3] and ARGV[3] ~= '' then
  local all = redis.call('HGETALL', M)
  for j = 1, #all, 2 do
    local v = member(all[j])
    if v and not live(v[5]) then
      redis.call('HINCRBY', K, 'reaped', I(out(all[j], v)))
    end
  end
end
save()
return result
";

/// One replica's shared ledger, in micro-GPU-seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicaFigures {
    /// Busy wall time × GPUs, every gateway together.
    pub busy: u64,
    /// Handed to requests that left.
    pub attributed: u64,
    /// Taken from requests whose gateway died in flight.
    pub reaped: u64,
}

/// The ledger in Redis; cheap to clone.
#[derive(Clone)]
pub struct RedisLedger {
    cluster: Cluster,
    scripts: Arc<[Script; 4]>,
    /// Replicas this gateway used (the heartbeat reaps their dead members).
    replicas: Arc<Mutex<HashSet<(String, u32)>>>,
}

impl std::fmt::Debug for RedisLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLedger").finish_non_exhaustive()
    }
}

impl RedisLedger {
    pub fn new(cluster: Cluster) -> Self {
        let advance = ADVANCE
            .replace("__SCALE__", &SCALE.to_string())
            .replace("__REBASE__", &REBASE_AT.to_string());
        let script = |body: &str| Script::new(&body.replace("__ADVANCE__", &advance));
        Self {
            cluster,
            scripts: Arc::new([script(JOIN), script(GROW), script(LEAVE), script(READ)]),
            replicas: Arc::default(),
        }
    }

    fn keys(&self, replica: &str) -> (String, String) {
        // The key names the members' format (all integers), so gateways
        // of a build that kept another format never share a ledger.
        let k = self.cluster.key(&format!("gpu-ledger:{replica}"));
        (k.clone(), format!("{k}:members"))
    }

    async fn call<T: redis::FromRedisValue>(
        &self,
        script: usize,
        replica: &str,
        args: &[String],
    ) -> Option<T> {
        let mut conn = self.cluster.conn()?;
        let (k, m) = self.keys(replica);
        let mut call = self.scripts[script].key(k);
        call.key(m);
        for a in args {
            call.arg(a);
        }
        telemetry::redis_call("gpu_ledger");
        match call.invoke_async(&mut conn).await {
            Ok(v) => Some(v),
            Err(e) => {
                self.cluster.failed(&e);
                None
            }
        }
    }

    /// The ledger's whole (busy µs × GPUs, every gateway together), what
    /// it handed to requests that left, and what it took from requests of
    /// gateways that died, per replica in `replicas`, in micro-GPU-seconds
    /// (one call; `None` when Redis does not answer).
    pub async fn figures(&self, replicas: &[String]) -> Option<Vec<ReplicaFigures>> {
        let mut conn = self.cluster.conn()?;
        let mut pipe = redis::pipe();
        for r in replicas {
            pipe.cmd("HMGET")
                .arg(self.keys(r).0)
                .arg("busy")
                .arg("attributed")
                .arg("reaped");
        }
        let rows: Vec<(Option<u64>, Option<u64>, Option<u64>)> =
            pipe.query_async(&mut conn).await.ok()?;
        Some(
            rows.into_iter()
                .map(|(b, a, r)| ReplicaFigures {
                    busy: b.unwrap_or(0),
                    attributed: a.unwrap_or(0),
                    reaped: r.unwrap_or(0),
                })
                .collect(),
        )
    }

    /// `replica`'s busy time since the ledger's epoch, time run to now
    /// (`None` when Redis does not answer).
    pub async fn reading(&self, replica: &str, gpus: u32) -> Option<LedgerReading> {
        let (epoch, now, busy, attributed, reaped, lent): (i64, i64, i64, i64, i64, i64) =
            self.call(3, replica, &[gpus.to_string()]).await?;
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        Some(LedgerReading {
            epoch_us: epoch,
            now_us: now,
            busy_gpu_micros: n(busy),
            attributed_gpu_micros: n(attributed),
            reaped_gpu_micros: n(reaped),
            lent_gpu_micros: n(lent),
        })
    }

    /// Removes the members of gateways whose liveness lapsed, on every
    /// replica this gateway used (from the heartbeat).
    pub async fn reap(&self) {
        let replicas: Vec<(String, u32)> = self
            .replicas
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        let alive = self.cluster.alive_key("");
        for (replica, gpus) in replicas {
            let _: Option<u64> = self
                .call(
                    2,
                    &replica,
                    &[
                        gpus.to_string(),
                        String::new(),
                        alive.clone(),
                        String::new(),
                    ],
                )
                .await;
        }
    }
}

impl crate::upstream::ledger::SharedLedger for RedisLedger {
    fn join<'a>(&'a self, replica: &'a str, gpus: u32, weight: u64) -> BoxFuture<'a, Option<u64>> {
        async move {
            self.replicas
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert((replica.to_owned(), gpus));
            let args = [
                gpus.to_string(),
                weight.to_string(),
                self.cluster.holder().to_owned(),
            ];
            self.call(0, replica, &args).await
        }
        .boxed()
    }

    fn grow<'a>(
        &'a self,
        replica: &'a str,
        gpus: u32,
        id: u64,
        tokens: u64,
    ) -> BoxFuture<'a, Option<()>> {
        async move {
            let args = [gpus.to_string(), id.to_string(), tokens.to_string()];
            self.call::<i64>(1, replica, &args).await.map(|_| ())
        }
        .boxed()
    }

    fn leave<'a>(
        &'a self,
        replica: &'a str,
        gpus: u32,
        id: u64,
        lent: bool,
    ) -> BoxFuture<'a, Option<u64>> {
        async move {
            let how = if lent { "lent" } else { "" };
            let args = [
                gpus.to_string(),
                id.to_string(),
                String::new(),
                how.to_owned(),
            ];
            self.call::<i64>(2, replica, &args)
                .await
                .map(|m| m.max(0) as u64)
        }
        .boxed()
    }

    fn refused<'a>(&'a self, replica: &'a str, gpus: u32, id: u64) -> BoxFuture<'a, Option<()>> {
        async move {
            let args = [
                gpus.to_string(),
                id.to_string(),
                String::new(),
                "unbilled".to_owned(),
            ];
            self.call::<i64>(2, replica, &args).await.map(|_| ())
        }
        .boxed()
    }
}

/// KEYS: replica hash, members hash. ARGV: gpus. Lets time run to now and
/// returns the epoch (µs), now (µs), and since the epoch the GPU-µs busy,
/// attributed, reaped and lent.
const READ: &str = r"
local K, M, gpus = KEYS[1], KEYS[2], tonumber(ARGV[1])
__ADVANCE__
epoch()
save()
local e = redis.call('HMGET', K, 'epoch_us', 'busy', 'epoch_busy', 'attributed', 'epoch_attributed',
                   'reaped', 'epoch_reaped', 'lent', 'epoch_lent')
local function since(i) return I((tonumber(e[i]) or 0) - (tonumber(e[i + 1]) or 0)) end
return {e[1], I(now), since(2), since(4), since(6), since(8)}
";

/// A replica's GPU time as the shared ledger counts it, for its replica
/// reports: GPU-µs since the ledger's epoch (when it began, µs), at
/// `now_us` (Redis's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerReading {
    pub epoch_us: i64,
    pub now_us: i64,
    /// Every interval with a request in flight, × GPUs.
    pub busy_gpu_micros: u64,
    /// Handed to requests that ended (their usage events' GPU time).
    pub attributed_gpu_micros: u64,
    /// Held by requests that ended without a usage event.
    pub reaped_gpu_micros: u64,
    /// Of attributed, what ran other tenants' requests on a dedicated replica.
    pub lent_gpu_micros: u64,
}

/// The shared ledger of every gateway in front of each HTTP replica
/// (see [`crate::gpu_ledger`]): its whole, what it handed to requests, and
/// what it took back from requests of gateways that died, in GPU-seconds.
/// `figures` is per replica, in the order of `upstreams.remote()`.
pub fn render(upstreams: &crate::upstream::Upstreams, figures: &[ReplicaFigures]) -> String {
    type Pick = fn(&ReplicaFigures) -> u64;
    let mut out = String::new();
    let families: [(&str, &str, Pick); 3] = [
        (
            telemetry::UPSTREAM_SHARED_BUSY,
            "HTTP upstream replicas: busy wall time times GPUs over every gateway in front of them, in GPU-seconds (the shared ledger's whole)",
            |f| f.busy,
        ),
        (
            telemetry::UPSTREAM_SHARED_ATTRIBUTED,
            "HTTP upstream replicas: GPU-seconds the shared ledger handed to finished requests, every gateway together (equals busy less reaped when idle)",
            |f| f.attributed,
        ),
        (
            telemetry::UPSTREAM_SHARED_REAPED,
            "HTTP upstream replicas: GPU-seconds of requests that left without a usage event: their gateway died in flight, or the upstream refused them (429/503)",
            |f| f.reaped,
        ),
    ];
    for (name, help, pick) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (u, f) in upstreams.remote().iter().zip(figures) {
            let _ = writeln!(
                out,
                "{name}{{model=\"{}\",replica=\"{}\"}} {}",
                telemetry::label_value(&u.config.model),
                telemetry::label_value(u.config.replica()),
                engine::attribution::to_gpu_seconds(pick(f))
            );
        }
    }
    out
}
