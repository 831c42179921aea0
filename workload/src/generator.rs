//! The generator: a [`Config`] (seed, UTC range, event count, tenants,
//! fleet) becomes an iterator of exactly that many valid usage events in
//! nondecreasing `started_at` order, holding one arrival slot at a time.
//!
//! Two random streams come from the seed, one for the arrival times and
//! one for the requests' figures, so the same seed always gives the same
//! events (for a given version of `rand`). Request ids are UUIDv7s built
//! from the start millisecond, 34 bits drawn from the seed and the event's
//! index, and the index itself in the last 40 bits: unique within a sample
//! however many events share a millisecond, and the same on every run, so
//! a backfill sent twice is a re-send, not new usage.

use chrono::{DateTime, TimeDelta, Utc};
use engine::profile::StepCosts;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rust_decimal::Decimal;
use usage_contract::{RequestId, UsageEvent, GPU_SECONDS_SCALE, SCHEMA_V1};

use crate::arrivals::{ms_to_time, Arrival, Arrivals};
use crate::diurnal::Shape;
use crate::fleet::{Fleet, FleetModel};
use crate::request::{self, Lengths};
use crate::summary::{Summary, Tally};
use crate::tenants::Tenant;
use crate::WorkloadError;

/// `gateway_id` on every generated event.
pub const GATEWAY_ID: &str = "backfill";
/// Request ids keep the event's index in 40 bits.
const MAX_EVENTS: u64 = 1 << 40;

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Everything random follows from it.
    pub seed: u64,
    /// First instant an event may start at (inclusive).
    pub from: DateTime<Utc>,
    /// Events start before it.
    pub to: DateTime<Utc>,
    /// Exactly this many events.
    pub events: u64,
    /// Who sends them; shares follow `requests_per_second`.
    pub tenants: Vec<Tenant>,
    /// What serves them, and the calibration of their GPU time.
    pub fleet: Fleet,
}

impl Config {
    /// `events` events of the reference tenants on the reference fleet.
    pub fn reference(seed: u64, from: DateTime<Utc>, to: DateTime<Utc>, events: u64) -> Self {
        Self {
            seed,
            from,
            to,
            events,
            tenants: Tenant::reference(),
            fleet: Fleet::reference(),
        }
    }
}

/// A tenant with its models resolved to fleet indices.
#[derive(Debug, Clone)]
struct Sender {
    tenant: Tenant,
    /// (cumulative percent, fleet index), in the order of `tenant.models`.
    models: Vec<(u32, usize)>,
}

/// The usage events of a [`Config`], in nondecreasing `started_at` order.
/// [`summary`](Self::summary) gives the totals of what it has yielded.
#[derive(Debug, Clone)]
pub struct Generator {
    arrival_rng: StdRng,
    figure_rng: StdRng,
    arrivals: Arrivals,
    senders: Vec<Sender>,
    models: Vec<(FleetModel, StepCosts)>,
    lengths: Lengths,
    salt: u64,
    index: u64,
    events: u64,
    tally: Tally,
}

impl Generator {
    /// Checks `config` and prepares the schedule (one pass over the range's
    /// slots; nothing is generated yet).
    pub fn new(config: Config) -> Result<Self, WorkloadError> {
        let from_ms = ceil_ms(config.from);
        let to_ms = ceil_ms(config.to);
        if config.events > 0 && to_ms <= from_ms {
            return Err(WorkloadError::EmptyRange {
                from: config.from,
                to: config.to,
                events: config.events,
            });
        }
        if config.events >= MAX_EVENTS {
            return Err(WorkloadError::TooManyEvents(config.events));
        }
        if config.tenants.iter().all(|t| t.requests_per_second == 0) {
            return Err(WorkloadError::NoTraffic);
        }
        if let Some(m) = config.fleet.models.iter().find(|m| m.concurrency == 0) {
            return Err(WorkloadError::ZeroConcurrency(m.profile.name.clone()));
        }
        let senders = config
            .tenants
            .iter()
            .map(|t| resolve(t, &config.fleet))
            .collect::<Result<Vec<_>, _>>()?;
        let shapes: Vec<Shape> = config.tenants.iter().map(Shape::of).collect();
        let rates: Vec<u64> = config
            .tenants
            .iter()
            .map(|t| u64::from(t.requests_per_second))
            .collect();
        let tally = Tally::new(
            config
                .tenants
                .iter()
                .map(|t| {
                    let models = t.models.iter().map(|m| m.model.clone()).collect();
                    (t.name.clone(), models)
                })
                .collect(),
        );
        Ok(Self {
            arrival_rng: StdRng::seed_from_u64(config.seed),
            figure_rng: StdRng::seed_from_u64(splitmix64(config.seed ^ 0x5eed_f1e1d5)),
            arrivals: Arrivals::new(&shapes, &rates, from_ms, to_ms, config.events),
            senders,
            models: config
                .fleet
                .models
                .into_iter()
                .map(|m| {
                    let costs = m.profile.costs();
                    (m, costs)
                })
                .collect(),
            lengths: Lengths::reference(),
            salt: splitmix64(config.seed),
            index: 0,
            events: config.events,
            tally,
        })
    }

    /// The reference tenants and fleet: `events` events in `[from, to)`.
    pub fn reference(
        seed: u64,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        events: u64,
    ) -> Result<Self, WorkloadError> {
        Self::new(Config::reference(seed, from, to, events))
    }

    /// Totals of the events yielded so far, per tenant and model.
    pub fn summary(&self) -> Summary {
        self.tally.summary()
    }

    /// Generates the rest without keeping it and returns the totals: what
    /// billing should show for the whole sample.
    pub fn into_summary(mut self) -> Summary {
        for _ in self.by_ref() {}
        self.summary()
    }

    fn event(&mut self, arrival: Arrival) -> Option<UsageEvent> {
        let sender = self.senders.get(arrival.tenant)?;
        let roll = self.figure_rng.random_range(0..100);
        let share = sender
            .models
            .iter()
            .position(|&(upto, _)| roll < upto)
            .unwrap_or(sender.models.len().saturating_sub(1));
        let &(_, model_index) = sender.models.get(share)?;
        let (model, costs) = self.models.get(model_index)?;
        let tenant = &sender.tenant;
        let f = request::draw(&mut self.figure_rng, &self.lengths, tenant, model, costs);
        let started_at = ms_to_time(arrival.at_ms);
        let after = |ms: u64| started_at + TimeDelta::milliseconds(i64::try_from(ms).unwrap_or(0));
        let event = UsageEvent {
            schema_version: SCHEMA_V1,
            request_id: request_id(self.salt, self.index, started_at),
            tenant_id: tenant.name.clone(),
            api_key_id: tenant.api_key_id.clone(),
            model: model.profile.name.clone(),
            model_version: model.profile.version.clone(),
            priority: tenant.priority,
            started_at,
            first_token_at: f.first_token_ms.map(after),
            finished_at: after(f.total_ms),
            prompt_tokens: count(f.prompt),
            cached_tokens: count(f.cached),
            completion_tokens: count(f.completion),
            gpu_seconds: micros(f.gpu_micros),
            preempted_gpu_seconds: micros(f.preempted_micros),
            finish_reason: f.finish,
            ttft_ms: f.first_token_ms.map(count),
            tpot_ms: f.tpot_ms.map(count),
            replica_id: model.replica_id.clone(),
            gateway_id: GATEWAY_ID.into(),
            stream: f.stream,
            placement: None,
        };
        if let Some(c) = self.tally.counts(arrival.tenant, share) {
            c.requests += 1;
            c.prompt_tokens += f.prompt;
            c.cached_tokens += f.cached;
            c.completion_tokens += f.completion;
            c.gpu_micros += f.gpu_micros;
            c.preempted_micros += f.preempted_micros;
            if arrival.off_peak {
                c.off_peak_micros += f.gpu_micros;
            }
        }
        Some(event)
    }
}

impl Iterator for Generator {
    type Item = UsageEvent;

    fn next(&mut self) -> Option<UsageEvent> {
        let arrival = self.arrivals.next(&mut self.arrival_rng)?;
        let event = self.event(arrival)?;
        self.index += 1;
        Some(event)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::try_from(self.events.saturating_sub(self.index)).unwrap_or(usize::MAX);
        (left, Some(left))
    }
}

impl ExactSizeIterator for Generator {}

fn resolve(tenant: &Tenant, fleet: &Fleet) -> Result<Sender, WorkloadError> {
    let bad = |message: String| WorkloadError::BadTenant {
        tenant: tenant.name.clone(),
        message,
    };
    if tenant.models.iter().map(|m| m.percent).sum::<u32>() != 100 {
        return Err(bad("model percents do not sum to 100".into()));
    }
    if tenant.max_context < 2 || tenant.max_output == 0 {
        return Err(bad(
            "max_context must be at least 2 and max_output positive".into(),
        ));
    }
    if !(1..=5).contains(&tenant.priority) {
        return Err(bad(format!(
            "priority {} is outside 1..=5",
            tenant.priority
        )));
    }
    let mut models = Vec::with_capacity(tenant.models.len());
    let mut cumulative = 0;
    for (i, share) in tenant.models.iter().enumerate() {
        if tenant.models[..i].iter().any(|m| m.model == share.model) {
            return Err(bad(format!("model {:?} is listed twice", share.model)));
        }
        let index = fleet
            .models
            .iter()
            .position(|m| m.profile.name == share.model)
            .ok_or_else(|| WorkloadError::UnknownModel {
                tenant: tenant.name.clone(),
                model: share.model.clone(),
            })?;
        cumulative += share.percent;
        models.push((cumulative, index));
    }
    Ok(Sender {
        tenant: tenant.clone(),
        models,
    })
}

/// A UUIDv7 at `at`'s millisecond: 34 bits of `salt` mixed with `index`,
/// then `index` in the last 40 bits, so no two events of a sample share one.
fn request_id(salt: u64, index: u64, at: DateTime<Utc>) -> RequestId {
    let mut bytes = [0u8; 10];
    bytes[..5].copy_from_slice(&splitmix64(salt ^ index).to_be_bytes()[..5]);
    bytes[5..].copy_from_slice(&index.to_be_bytes()[3..]);
    let ms = u64::try_from(at.timestamp_millis()).unwrap_or(0);
    let uuid = uuid::Builder::from_unix_timestamp_millis(ms, &bytes).into_uuid();
    // The builder always sets version 7.
    RequestId::from_uuid(uuid).unwrap_or_else(|_| RequestId::at(at))
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The first whole millisecond at or after `t`, since the epoch.
fn ceil_ms(t: DateTime<Utc>) -> i64 {
    let ms = t.timestamp_millis();
    if t.timestamp_subsec_nanos() % 1_000_000 == 0 {
        ms
    } else {
        ms + 1
    }
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn micros(n: u64) -> Decimal {
    Decimal::from_i128_with_scale(i128::from(n), GPU_SECONDS_SCALE)
}

#[cfg(test)]
mod tests;
