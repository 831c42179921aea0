//! The limits' side in Redis: the one home of the limiter's Redis commands.
//!
//! Two kinds of shared resource:
//!
//! - a **rate** (requests or tokens per unit of time): a token bucket in a
//!   Redis hash (`level`, `at` in Redis's own milliseconds). A gateway
//!   *leases* a block of tokens — taken from the bucket at once — and
//!   spends it locally, so Redis sees one call per block, not per
//!   request. Tokens a gateway leased and did not spend within a second
//!   are given back. Whatever is leased is out of the bucket, so the
//!   gateways together never admit more than the bucket allows; what sits
//!   unspent in a lease only makes the others stricter, for a second.
//! - a **capacity** (requests or KV·seconds in flight): a hash of holder
//!   (`{gateway}#{incarnation}`) → units it holds. A gateway leases what
//!   its requests need plus at most one block, and keeps at most two
//!   blocks beyond what its requests use (all of it goes back after a
//!   second unused), so a gateway that dies holds little more than it
//!   used. A holder's units count only while its gateway's liveness key
//!   holds its incarnation (see [`crate::cluster`]): a SIGKILLed gateway's
//!   units return within 15 s, at once when it restarts under the same
//!   id, and a live one's never expire. No capacity is leased while Redis
//!   settles after losing everything, nor to a gateway whose liveness
//!   Redis does not hold.
//!
//! Both scripts run atomically in Redis: one lease call checks and takes
//! every resource a request needs, or takes nothing and says which one is
//! short and for how long.

use redis::Script;

/// Checks every resource, then takes a block of each, or nothing.
///
/// KEYS: the resources. ARGV: this process's holder field (`{id}#{incarnation}`),
/// the liveness key prefix, the epoch key, the settling key, settle ms,
/// then five values per resource: kind (`r` rate, `c` capacity), need,
/// want (need plus the block), capacity, refill per millisecond.
/// Returns `{1, register, grant, left, grant, left, ...}` or
/// `{0, register, index, wait_ms, why}` (`why`: 0 short, 1 settling after
/// Redis lost everything, 2 this gateway's liveness is not in Redis);
/// `register` is 1 when Redis does not hold this gateway's liveness.
const LEASE: &str = r"
local me, alive, epoch, settling, settle = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', epoch) == 0 then
  -- Redis lost everything since the first heartbeat: the gateways must
  -- register what they hold before any capacity is leased.
  redis.call('SET', epoch, now)
  redis.call('SET', settling, now, 'PX', settle, 'NX')
end
local function holder(field)
  local id, inc = string.match(field, '^(.*)#([^#]*)$')
  return id, inc
end
local my_id, my_inc = holder(me)
local mine = redis.call('GET', alive .. my_id) == my_inc
local register = 0
if not mine then register = 1 end
local function live(field)
  if field == me then return true end
  local id, inc = holder(field)
  if not id then return redis.call('EXISTS', alive .. field) == 1 end
  return redis.call('GET', alive .. id) == inc
end
local avail = {}
for i = 1, #KEYS do
  local b = 5 + (i - 1) * 5
  local kind, need, cap, rate = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  if need > cap then need = cap end
  if kind == 'r' then
    local v = redis.call('HMGET', KEYS[i], 'level', 'at')
    local level, at = tonumber(v[1]), tonumber(v[2])
    if level == nil or at == nil then level = cap; at = now end
    if now > at then level = math.min(cap, level + (now - at) * rate) end
    if level < need then
      local wait = 60000
      if rate > 0 then wait = math.ceil((need - level) / rate) end
      return {0, register, i, wait, 0}
    end
    avail[i] = level
  else
    local left = redis.call('PTTL', settling)
    if left > 0 then return {0, register, i, left, 1} end
    if not mine then return {0, register, i, 1000, 2} end
    local held = redis.call('HGETALL', KEYS[i])
    local used = 0
    for j = 1, #held, 2 do
      if live(held[j]) then
        used = used + tonumber(held[j + 1])
      else
        redis.call('HDEL', KEYS[i], held[j])
      end
    end
    if used + need > cap then return {0, register, i, 1000, 0} end
    avail[i] = cap - used
  end
end
local out = {1, register}
for i = 1, #KEYS do
  local b = 5 + (i - 1) * 5
  local kind, want, cap, rate = ARGV[b + 1], tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  local grant = math.floor(math.min(want, avail[i]))
  local left = avail[i] - grant
  if kind == 'r' then
    redis.call('HSET', KEYS[i], 'level', tostring(left), 'at', now)
    local ttl = 3600000
    if rate > 0 then ttl = math.ceil((cap - left) / rate) + 60000 end
    redis.call('PEXPIRE', KEYS[i], ttl)
  else
    redis.call('HINCRBY', KEYS[i], me, grant)
    redis.call('PEXPIRE', KEYS[i], 3600000)
  end
  out[#out + 1] = grant
  out[#out + 1] = math.floor(left)
end
return out
";

/// Gives back what a gateway leased and did not use.
///
/// KEYS: the resources. ARGV: this process's holder field, then four values per
/// resource: kind, amount, capacity, refill per millisecond.
const GIVE_BACK: &str = r"
local me = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #KEYS do
  local b = 1 + (i - 1) * 4
  local kind, amount, cap, rate = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  if kind == 'r' then
    local v = redis.call('HMGET', KEYS[i], 'level', 'at')
    local level, at = tonumber(v[1]), tonumber(v[2])
    if level ~= nil and at ~= nil then
      if now > at then level = level + (now - at) * rate end
      level = math.min(cap, level + amount)
      redis.call('HSET', KEYS[i], 'level', tostring(level), 'at', now)
    end
  else
    local h = tonumber(redis.call('HGET', KEYS[i], me) or '0') - amount
    if h > 0 then redis.call('HSET', KEYS[i], me, h) else redis.call('HDEL', KEYS[i], me) end
  end
end
return 1
";

/// What a resource is, for Redis.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// Refills at `per_ms` up to `capacity`.
    Rate { capacity: f64, per_ms: f64 },
    /// At most `capacity` units held at once.
    Capacity { capacity: u64 },
}

impl Kind {
    fn args(self) -> (&'static str, String, String) {
        match self {
            Self::Rate { capacity, per_ms } => (
                "r",
                (capacity.floor() as u64).max(1).to_string(),
                per_ms.to_string(),
            ),
            Self::Capacity { capacity } => ("c", capacity.to_string(), "0".into()),
        }
    }
}

/// One resource to lease: its Redis key, kind, the least that must be
/// granted and how much to take if there is room.
#[derive(Debug, Clone)]
pub struct Ask {
    pub key: String,
    pub kind: Kind,
    pub need: u64,
    pub want: u64,
}

/// What a lease call answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leased {
    /// Per ask, in order: granted units and what the resource has left.
    Granted(Vec<(u64, u64)>),
    /// Ask number `index` is short; it could pass in `wait_ms`.
    Short {
        index: usize,
        wait_ms: u64,
        why: Short,
    },
}

/// Why a lease was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Short {
    /// The resource has too little left.
    Limit,
    /// Redis lost everything lately: no capacity is leased until every
    /// gateway registered what it holds.
    Settling,
    /// Redis does not hold this gateway's liveness: no capacity until its
    /// heartbeat registers it.
    Unregistered,
}

/// A lease call's answer, and whether Redis does not hold this gateway's
/// liveness (what it holds must be registered again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseReply {
    pub leased: Leased,
    pub register: bool,
}

/// The limiter's scripts.
#[derive(Debug)]
pub struct Scripts {
    lease: Script,
    give_back: Script,
}

impl Default for Scripts {
    fn default() -> Self {
        Self {
            lease: Script::new(LEASE),
            give_back: Script::new(GIVE_BACK),
        }
    }
}

impl Scripts {
    /// One call: every ask granted at least its need, or nothing taken.
    pub async fn lease(
        &self,
        conn: &mut redis::aio::ConnectionManager,
        cluster: &crate::cluster::Cluster,
        asks: &[Ask],
    ) -> Result<LeaseReply, redis::RedisError> {
        let mut call = self.lease.prepare_invoke();
        call.arg(cluster.holder())
            .arg(cluster.alive_key(""))
            .arg(cluster.epoch_key())
            .arg(cluster.settling_key())
            .arg(crate::cluster::SETTLE.as_millis() as u64);
        for a in asks {
            let (kind, capacity, per_ms) = a.kind.args();
            call.key(&a.key)
                .arg(kind)
                .arg(a.need)
                .arg(a.want.max(a.need))
                .arg(capacity)
                .arg(per_ms);
        }
        let reply: Vec<i64> = call.invoke_async(conn).await?;
        let num = |i: usize| reply.get(i).copied().unwrap_or(0).max(0) as u64;
        let leased = if reply.first() == Some(&1) {
            Leased::Granted(
                (0..asks.len())
                    .map(|i| (num(2 + 2 * i), num(3 + 2 * i)))
                    .collect(),
            )
        } else {
            Leased::Short {
                index: (num(2) as usize).saturating_sub(1),
                wait_ms: num(3),
                why: match num(4) {
                    1 => Short::Settling,
                    2 => Short::Unregistered,
                    _ => Short::Limit,
                },
            }
        };
        Ok(LeaseReply {
            leased,
            register: num(1) == 1,
        })
    }

    /// Gives back `amount` of each resource, in one call.
    pub async fn give_back(
        &self,
        conn: &mut redis::aio::ConnectionManager,
        holder: &str,
        returns: &[(String, Kind, u64)],
    ) -> Result<(), redis::RedisError> {
        if returns.is_empty() {
            return Ok(());
        }
        let mut call = self.give_back.prepare_invoke();
        call.arg(holder);
        for (key, kind, amount) in returns {
            let (k, capacity, per_ms) = kind.args();
            call.key(key).arg(k).arg(amount).arg(capacity).arg(per_ms);
        }
        let _: i64 = call.invoke_async(conn).await?;
        Ok(())
    }
}

/// The renewal of what this gateway holds, in one pipeline: its capacity
/// units under its holder field (`register`: set to the units it holds,
/// after Redis lost them) and
/// the per-tenant lease records (request id → estimated KV·s, start,
/// gateway), each list expiring 15 s after its last renewal.
pub fn renewal(
    holder: &str,
    capacities: &[(String, u64)],
    register: bool,
    leases: &[(String, Vec<(String, String)>)],
) -> redis::Pipeline {
    let reclaim = crate::cluster::RECLAIM_AFTER.as_secs();
    let mut pipe = redis::pipe();
    for (key, units) in capacities {
        if register {
            if *units > 0 {
                pipe.cmd("HSET").arg(key).arg(holder).arg(units).ignore();
            } else {
                pipe.cmd("HDEL").arg(key).arg(holder).ignore();
            }
        }
        pipe.cmd("PEXPIRE").arg(key).arg(3_600_000).ignore();
    }
    for (key, entries) in leases {
        pipe.cmd("DEL").arg(key).ignore();
        if !entries.is_empty() {
            let mut hset = redis::cmd("HSET");
            hset.arg(key);
            for (field, value) in entries {
                hset.arg(field).arg(value);
            }
            pipe.add_command(hset).ignore();
            pipe.cmd("EXPIRE").arg(key).arg(reclaim).ignore();
        }
    }
    pipe
}
