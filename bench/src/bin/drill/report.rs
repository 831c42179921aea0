//! What a replay measured, the criteria with pass/fail, and the bills.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use bench::percentiles::Percentiles;
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

use crate::gateway::{Gateway, Mode, TENANTS};
use crate::traffic::Outcome;
use crate::Drill;

/// The windows acme's TTFT p95 is judged in.
const WINDOW: Duration = Duration::from_secs(5);

/// Writes a line of the report to stdout (the drill's output is its report).
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

pub fn preamble(drill: &Drill) {
    say!(
        "noisy-neighbour drill: {} replicas of the 70B profile ({} dedicated to acme-corp outside FIFO), \
         engine in real time",
        drill.replicas,
        drill.dedicated
    );
    say!(
        "traffic: {} s warm-up, codegen-platform's burst of {} requests in {} s, {} s after; \
         acme-corp 200/s streamed (120-token prompts, 12 tokens out), medai-labs 50/s, \
         finserv-team 30/s, research-squad 10/s (short), codegen 2,000-token prompts with up to 200 tokens out",
        drill.warmup_secs,
        drill.burst_requests,
        drill.burst_secs,
        drill.cooldown_secs
    );
}

/// One tenant's line.
#[derive(Debug, Default, Clone)]
struct Line {
    sent: u64,
    ok: u64,
    refused_429: u64,
    refused_503: u64,
    failed: u64,
    ttft_ms: Vec<f64>,
    e2e_ms: Vec<f64>,
    /// Every request's time to its answer or its refusal.
    all_e2e_ms: Vec<f64>,
    gpu_seconds: Decimal,
    preempted: Decimal,
    /// Refusals and errors by their OpenAI `code` (or limit type).
    why: BTreeMap<String, u64>,
    /// Where the time went, from the usage events: the wait in the
    /// gateway's queue, the run on the engine (start to finish), the
    /// engine's time per output token.
    queue_wait_ms: Vec<f64>,
    run_ms: Vec<f64>,
    tpot_ms: Vec<f64>,
}

/// One replay's figures.
pub struct Replay {
    mode: Mode,
    lines: Vec<Line>,
    /// acme-corp's TTFT p95 in each window with samples: (window start s, p95 ms).
    acme_windows: Vec<(u64, f64)>,
    /// codegen's answered requests sent while its requests/s bucket, as
    /// the client's own clock recomputes it, held less than one token.
    codegen_without_token: u64,
    codegen_e2e_p95_ms: f64,
    busy_gpu_seconds: Decimal,
    idle_gpu_seconds: Decimal,
    /// The pool's GPUs × the time between its replicas starting and their
    /// GPU time being read, by the drill's clock: at least, at most.
    clock_gpu_seconds: (Decimal, Decimal),
    events: u64,
    /// Preemptions the gateway carried out (the events' `placement.preemptions`).
    preemptions: i64,
    /// acme-corp's dedicated pool as billing prices it, at peak rates.
    reserved: Option<Reserved>,
    /// The shared replicas' idle GPU time: the idle overhead pool's input.
    shared_idle_gpu_seconds: Decimal,
}

/// acme-corp's reservation and what its invoice shows for it.
struct Reserved {
    replicas: usize,
    busy: Decimal,
    idle: Decimal,
    own_usage_gpu_seconds: Decimal,
    /// What the dedicated replicas ran for others, as they counted it
    /// (what the replica reports carry to billing).
    lent_gpu_seconds: Decimal,
    /// The GPU time of others' requests that *ended* there (their events).
    lent_by_events: Decimal,
    /// The reserved line, the credit for its own usage, the credit for lending.
    lines: Vec<billing_api::rating::Line>,
}

fn gpu_seconds(micros: u64) -> Decimal {
    Decimal::new(micros as i64, 6)
}

impl Replay {
    pub async fn of(mode: Mode, outcomes: &[Outcome], gw: &Gateway) -> anyhow::Result<Self> {
        let mut lines = vec![Line::default(); TENANTS.len()];
        let mut acme: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        for o in outcomes {
            let l = &mut lines[o.tenant];
            l.sent += 1;
            l.all_e2e_ms.push(o.e2e.as_secs_f64() * 1000.0);
            match o.status {
                200 => {
                    l.ok += 1;
                    l.e2e_ms.push(o.e2e.as_secs_f64() * 1000.0);
                    if let Some(t) = o.ttft {
                        let ms = t.as_secs_f64() * 1000.0;
                        l.ttft_ms.push(ms);
                        if o.tenant == 0 {
                            let w = o.sent_at.as_secs() / WINDOW.as_secs() * WINDOW.as_secs();
                            acme.entry(w).or_default().push(ms);
                        }
                    }
                }
                429 => l.refused_429 += 1,
                503 => l.refused_503 += 1,
                _ => l.failed += 1,
            }
            if o.status != 200 {
                let why = o
                    .code
                    .clone()
                    .unwrap_or_else(|| format!("status {}", o.status));
                *l.why.entry(why).or_default() += 1;
            }
        }
        let events = gw.outbox.peek(usize::MAX)?;
        let mut preemptions = 0;
        // acme-corp's own usage on its dedicated replicas, and others' there.
        let mut own: BTreeMap<(String, i16), billing_api::rating::UsageGroup> = BTreeMap::new();
        let mut lent = Decimal::ZERO;
        for e in &events {
            let event = usage_contract::decode(&e.payload, chrono::Utc::now())
                .map_err(|v| anyhow::anyhow!("an event of the drill is not valid: {v:?}"))?;
            if let Some(i) = TENANTS.iter().position(|t| t.id == event.tenant_id) {
                let l = &mut lines[i];
                l.gpu_seconds += event.gpu_seconds;
                l.preempted += event.preempted_gpu_seconds;
                let run = event.finished_at - event.started_at;
                l.run_ms.push(run.num_milliseconds() as f64);
                l.tpot_ms.extend(event.tpot_ms.map(|ms| ms as f64));
                if let Some(p) = &event.placement {
                    l.queue_wait_ms.push(p.queue_wait_ms as f64);
                }
            }
            let Some(p) = &event.placement else { continue };
            preemptions += p.preemptions;
            if p.dedicated_to.as_deref() == Some(TENANTS[0].id) {
                if event.tenant_id == TENANTS[0].id {
                    let g = own
                        .entry((event.model.clone(), event.priority))
                        .or_insert_with(|| billing_api::rating::UsageGroup {
                            model: event.model.clone(),
                            priority: event.priority,
                            off_peak: false,
                            requests: 0,
                            prompt_tokens: 0,
                            cached_tokens: 0,
                            completion_tokens: 0,
                            gpu_seconds: Decimal::ZERO,
                        });
                    g.requests += 1;
                    g.prompt_tokens += event.prompt_tokens;
                    g.cached_tokens += event.cached_tokens;
                    g.completion_tokens += event.completion_tokens;
                    g.gpu_seconds += event.gpu_seconds;
                } else {
                    lent += event.gpu_seconds;
                }
            }
        }
        // Every replica's GPU time, idle brought up to now (what the
        // replica reports would carry to billing).
        let (mut busy, mut idle, mut shared_idle) = (0u64, 0u64, 0u64);
        let (mut reserved_busy, mut reserved_idle, mut dedicated) = (0u64, 0u64, 0usize);
        let mut reserved_lent = 0u64;
        let read_from = std::time::Instant::now();
        let times = gw.simulator.gpu_time().await;
        let read_until = std::time::Instant::now();
        let (started_from, started_until) = gw.pool_started;
        let clock = |d: Duration| gpu_seconds(d.as_micros() as u64 * gw.gpus);
        let clock_gpu_seconds = (
            clock(read_from - started_until),
            clock(read_until - started_from),
        );
        for r in times {
            busy += r.time.busy_gpu_micros;
            idle += r.time.idle_gpu_micros;
            match r.dedicated_to.as_deref() {
                Some(owner) if owner == TENANTS[0].id => {
                    dedicated += 1;
                    reserved_busy += r.time.busy_gpu_micros;
                    reserved_idle += r.time.idle_gpu_micros;
                    reserved_lent += r.time.lent_gpu_micros;
                }
                _ => shared_idle += r.time.idle_gpu_micros,
            }
        }
        let reserved = if dedicated == 0 {
            None
        } else {
            let book = billing_api::rating::PriceBook::from_yaml(include_str!(
                "../../../../config/price-book.yaml"
            ))
            .map_err(|e| anyhow::anyhow!("the reference price book: {e}"))?;
            let own_usage: Vec<_> = own.into_values().collect();
            let reservation = billing_api::rating::Reservation {
                model: crate::gateway::MODEL.to_owned(),
                reserved_gpu_seconds: gpu_seconds(reserved_busy + reserved_idle),
                own_usage: own_usage.clone(),
                lent_gpu_seconds: gpu_seconds(reserved_lent),
            };
            Some(Reserved {
                replicas: dedicated,
                busy: gpu_seconds(reserved_busy),
                idle: gpu_seconds(reserved_idle),
                own_usage_gpu_seconds: own_usage.iter().map(|g| g.gpu_seconds).sum(),
                lent_gpu_seconds: gpu_seconds(reserved_lent),
                lent_by_events: lent,
                lines: billing_api::rating::reserved_lines(
                    &[reservation],
                    &book,
                    billing_api::rating::BillingMode::PerToken,
                    5,
                )
                .map_err(|e| anyhow::anyhow!("rating acme-corp's reservation: {e}"))?,
            })
        };
        Ok(Self {
            mode,
            acme_windows: acme
                .into_iter()
                .map(|(w, ms)| (w, Percentiles::new(ms).at(0.95)))
                .collect(),
            codegen_without_token: admitted_without_token(outcomes, 4),
            codegen_e2e_p95_ms: Percentiles::new(lines[4].e2e_ms.clone()).at(0.95),
            busy_gpu_seconds: gpu_seconds(busy),
            idle_gpu_seconds: gpu_seconds(idle),
            clock_gpu_seconds,
            events: events.len() as u64,
            preemptions,
            reserved,
            shared_idle_gpu_seconds: gpu_seconds(shared_idle),
            lines,
        })
    }

    fn acme_worst_window_ms(&self) -> f64 {
        self.acme_windows
            .iter()
            .map(|(_, p)| *p)
            .fold(f64::NAN, f64::max)
    }

    fn acme_ok(&self) -> bool {
        !self.acme_windows.is_empty() && self.acme_worst_window_ms() < 200.0
    }

    pub fn print(&self) {
        say!("\n== {}", self.mode.title());
        say!(
            "{:<18} {:>6} {:>6} {:>6} {:>6} {:>6} {:>10} {:>10} {:>14} {:>12}",
            "tenant",
            "sent",
            "ok",
            "429",
            "503",
            "error",
            "TTFT p95",
            "e2e p95",
            "GPU-seconds",
            "preempted"
        );
        for (t, l) in TENANTS.iter().zip(&self.lines) {
            let ms = |v: &[f64]| {
                let p = Percentiles::new(v.to_vec()).at(0.95);
                if p.is_nan() {
                    "-".to_owned()
                } else {
                    format!("{p:.0} ms")
                }
            };
            let why: Vec<String> = l.why.iter().map(|(k, n)| format!("{k} {n}")).collect();
            say!(
                "{:<18} {:>6} {:>6} {:>6} {:>6} {:>6} {:>10} {:>10} {:>14} {:>12}  {}",
                t.id,
                l.sent,
                l.ok,
                l.refused_429,
                l.refused_503,
                l.failed,
                ms(&l.ttft_ms),
                ms(&l.e2e_ms),
                l.gpu_seconds,
                l.preempted,
                why.join(", ")
            );
        }
        // Each tenant's share of the GPU time against its weight's, and
        // Jain's index over the weight-normalized shares (printed, not
        // judged: a tenant that asked for less than its weight lowers it).
        let total: Decimal = self.lines.iter().map(|l| l.gpu_seconds).sum();
        let weights: u32 = TENANTS.iter().map(|t| t.weight).sum();
        let mut normalized = Vec::new();
        let shares: Vec<String> = TENANTS
            .iter()
            .zip(&self.lines)
            .map(|(t, l)| {
                let share = if total.is_zero() {
                    0.0
                } else {
                    (l.gpu_seconds / total).to_f64().unwrap_or(0.0)
                };
                let want = f64::from(t.weight) / f64::from(weights);
                normalized.push(share / want);
                format!("{} {share:.3} (weight {want:.3})", t.id)
            })
            .collect();
        let (sum, squares): (f64, f64) = (
            normalized.iter().sum(),
            normalized.iter().map(|x| x * x).sum(),
        );
        say!(
            "GPU share: {}; Jain's index over the five {:.3}; codegen e2e p95 over all its requests (refused ones at their refusal) {}",
            shares.join(", "),
            sum * sum / (normalized.len() as f64 * squares),
            {
                let all = Percentiles::new(self.lines[4].all_e2e_ms.clone()).at(0.95);
                if all.is_nan() { "-".to_owned() } else { format!("{all:.0} ms") }
            }
        );
        let windows: Vec<String> = self
            .acme_windows
            .iter()
            .map(|(w, p)| format!("{w}s:{p:.0}"))
            .collect();
        say!(
            "acme-corp TTFT p95 by 5 s window (ms): {}",
            windows.join(" ")
        );
        let verdict = |ok: bool| if ok { "pass" } else { "FAIL" };
        if matches!(
            self.mode,
            Mode::FairUncapped | Mode::Levels | Mode::Weights | Mode::Preemption
        ) {
            say!(
                "  [n/a ] fewer than 10 of codegen's requests admitted while its bucket held less than one token: \
                 no bucket in this replay ({} of the burst answered, {} of them while the bucket would have been empty)",
                self.lines[4].ok,
                self.codegen_without_token
            );
        } else {
            say!(
                "  [{}] fewer than 10 of codegen's requests admitted while its bucket held less than one token \
                 (recomputed from the client's send times; FIFO has none, as in the incident): {}",
                verdict(self.codegen_without_token < 10),
                self.codegen_without_token
            );
        }
        say!(
            "  [{}] acme-corp's TTFT p95 under 200 ms in every 5 s window: worst {:.0} ms",
            verdict(self.acme_ok()),
            self.acme_worst_window_ms()
        );
        if self.preemptions == 0 {
            say!("  [n/a ] acme recovers within 15 s of a preemption: preemption never activated");
        } else {
            // Every window over 200 ms is followed within 15 s by one under it.
            let late = self.acme_windows.iter().any(|(w, p)| {
                *p >= 200.0
                    && !self
                        .acme_windows
                        .iter()
                        .any(|(v, q)| v > w && *v <= w + 15 && *q < 200.0)
            });
            say!(
                "  [{}] acme recovers within 15 s of a preemption: {} preemptions; every 5 s window over 200 ms is followed within 15 s by one under it",
                verdict(!late),
                self.preemptions
            );
        }
        say!(
            "  [{}] codegen's admitted work completes within its 30 s SLO: p95 {:.1} s",
            verdict(self.codegen_e2e_p95_ms.is_nan() || self.codegen_e2e_p95_ms <= 30_000.0),
            self.codegen_e2e_p95_ms / 1000.0
        );
        let codegen = &self.lines[4];
        let p = |v: &[f64], q: f64| Percentiles::new(v.to_vec()).at(q);
        say!(
            "        where codegen's time went (its usage events): queue wait p50 {:.1} s / p95 {:.1} s; run on the engine p50 {:.1} s / p95 {:.1} s; time per output token p50 {:.0} ms / p95 {:.0} ms",
            p(&codegen.queue_wait_ms, 0.5) / 1000.0,
            p(&codegen.queue_wait_ms, 0.95) / 1000.0,
            p(&codegen.run_ms, 0.5) / 1000.0,
            p(&codegen.run_ms, 0.95) / 1000.0,
            p(&codegen.tpot_ms, 0.5),
            p(&codegen.tpot_ms, 0.95),
        );
        let attributed: Decimal = self.lines.iter().map(|l| l.gpu_seconds).sum();
        let wasted: Decimal = self.lines.iter().map(|l| l.preempted).sum();
        say!(
            "  bills: {} usage events; attributed {} GPU-s (of which preemption waste {}) + idle {} GPU-s \
             = {} GPU-s; the replicas were busy {} GPU-s and idle {} GPU-s",
            self.events,
            attributed,
            wasted,
            self.idle_gpu_seconds,
            attributed + self.idle_gpu_seconds,
            self.busy_gpu_seconds,
            self.idle_gpu_seconds
        );
        say!(
            "  [{}] attributed GPU-seconds equal the replicas' busy GPU-seconds exactly",
            verdict(attributed == self.busy_gpu_seconds)
        );
        // The events' GPU time includes what preemption threw away.
        let useful = attributed - wasted;
        let accounted = useful + wasted + self.idle_gpu_seconds;
        say!(
            "  pool: attributed {} + wasted {} + idle {} = {} GPU-s; the pool's GPU-seconds (busy + idle): {}",
            useful,
            wasted,
            self.idle_gpu_seconds,
            accounted,
            self.busy_gpu_seconds + self.idle_gpu_seconds
        );
        let (least, most) = self.clock_gpu_seconds;
        let pool = self.busy_gpu_seconds + self.idle_gpu_seconds;
        say!(
            "  [{}] the pool's busy + idle {} GPU-s against its GPUs × the time by the drill's clock: {} to {} GPU-s",
            verdict(pool >= least && pool <= most),
            pool,
            least,
            most
        );
        say!(
            "  idle line: the shared replicas' idle {} GPU-s go to the overhead pool (the dedicated replicas' idle is acme-corp's)",
            self.shared_idle_gpu_seconds
        );
        match &self.reserved {
            None => say!("  reserved line: none (no dedicated replicas in this replay)"),
            Some(r) => {
                let amounts: Vec<String> = r
                    .lines
                    .iter()
                    .map(|l| format!("{} ${}", l.description, l.amount))
                    .collect();
                let net: Decimal = r.lines.iter().map(|l| l.amount).sum();
                say!(
                    "  reserved line: acme-corp's {} dedicated replicas, {} GPU-s busy + {} idle; its own usage there {} GPU-s, lent {} GPU-s (events that ended there: {}); at P5 peak rates: {}; net ${}",
                    r.replicas,
                    r.busy,
                    r.idle,
                    r.own_usage_gpu_seconds,
                    r.lent_gpu_seconds,
                    r.lent_by_events,
                    amounts.join("; "),
                    net
                );
            }
        }
    }
}

/// `tenant`'s answered requests that its requests/s bucket could not have
/// paid for, recomputed from the client's own clock (independently of the
/// gateway's bucket): `burst` tokens, full when the replay began, refilled
/// at `per_second`; each answered request takes a token at the moment it
/// was sent, and one sent while the bucket held less than one counts.
/// The gateway sees each request a little later than the client sent it
/// (a little more refilled), so this may count a few the gateway's bucket
/// did pay for; never fewer.
fn admitted_without_token(outcomes: &[Outcome], tenant: usize) -> u64 {
    /// Micro-tokens per token: exact integer refills.
    const UNIT: u64 = 1_000_000;
    let rate = TENANTS[tenant].rate;
    let mut sent: Vec<Duration> = outcomes
        .iter()
        .filter(|o| o.tenant == tenant && o.status == 200)
        .map(|o| o.sent_at)
        .collect();
    sent.sort();
    let full = u64::from(rate.burst) * UNIT;
    let (mut bucket, mut last, mut without) = (full, Duration::ZERO, 0);
    for at in sent {
        // `per_second` tokens a second are `per_second` micro-tokens a µs.
        let refill = (at - last).as_micros() as u64 * u64::from(rate.per_second);
        bucket = (bucket + refill).min(full);
        last = at;
        if bucket >= UNIT {
            bucket -= UNIT;
        } else {
            without += 1;
        }
    }
    without
}

pub fn closing(replays: &[Replay]) {
    say!("\n== side by side: acme-corp's worst 5 s TTFT p95, its requests answered, codegen's e2e p95");
    for r in replays {
        let acme = &r.lines[0];
        say!(
            "{:<14} {:>8.0} ms  {:>6} of {:<6} {:>8.1} s",
            r.mode.to_string(),
            r.acme_worst_window_ms(),
            acme.ok,
            acme.sent,
            r.codegen_e2e_p95_ms / 1000.0
        );
    }
    if let Some(fifo) = replays.iter().find(|r| r.mode == Mode::Fifo) {
        if fifo.acme_ok() {
            say!(
                "FIFO did not breach acme-corp's SLO: the load is too light to prove anything \
                 (raise --burst-requests or lower --replicas)"
            );
        } else {
            say!("FIFO breached acme-corp's SLO, as the reference incident did: the load is heavy enough to judge the others");
        }
    }
}
