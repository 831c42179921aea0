//! The noisy-neighbour drill, reduced and deterministic: the five
//! reference tenants (their priorities, weights and objectives) on one
//! simulated pool of two replicas, codegen's burst against acme's steady
//! traffic, through [`place`] on tokio's paused clock — the same figures
//! every run, in seconds of CI. The same traffic is replayed with one
//! mechanism more each time ([`Discipline`]): one FIFO line; priority
//! levels; + weights; + preemption. A second scenario puts two backlogged
//! tenants on one level, where only the weights tell them apart.
//!
//! What it does not replay: the gateway's limits and ladder (SLO
//! borrowing, the degraded priority 1) and dedicated replicas — the full
//! real-time drill (`bench --bin drill`) does, through a real gateway.
//!
//! Every figure is read from the requests' own clocks and the replicas'
//! own account of their GPU time, never from the queue: TTFT from the
//! request's arrival to its first token; GPU time as the replica
//! attributed it; the pool's busy and idle time against replicas × GPUs ×
//! the elapsed time by the clock.

use std::collections::BTreeMap;

use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

use super::*;

/// How long the traffic runs; codegen bursts from [`BURST_FROM`] for
/// [`BURST_FOR`].
const LENGTH: Duration = Duration::from_secs(25);
const BURST_FROM: Duration = Duration::from_secs(5);
const BURST_FOR: Duration = Duration::from_secs(10);
/// TTFT is judged over windows of this length (the worst one counts).
const TTFT_WINDOW: Duration = Duration::from_secs(5);
/// The queue's estimate of a request's GPU time, per token.
const EST_GPU_MICROS_PER_TOKEN: u64 = 200;
const REPLICAS: u64 = 2;

fn pool(discipline: Discipline) -> Arc<Rig> {
    Rig::with_discipline(Rig::fast_pool(REPLICAS), discipline)
}

/// One tenant's traffic: a request every `every` from `from` to `until`.
#[derive(Clone, Copy)]
struct Tenant {
    name: &'static str,
    priority: i16,
    weight: u32,
    ttft_ms: Option<u32>,
    e2e_ms: Option<u32>,
    prompt_words: usize,
    output: u32,
    every: Duration,
    from: Duration,
    until: Duration,
}

impl Tenant {
    fn caller(&self, discipline: Discipline) -> Caller {
        Caller {
            weight: self.weight,
            slo: fleet::slo::Slo {
                ttft_p95_ms: self.ttft_ms,
                e2e_p95_ms: self.e2e_ms,
                ..Default::default()
            },
            // The reference incident: one class for everyone.
            ..Caller::unlimited(
                self.name,
                &format!("key-{}", self.name),
                if discipline == Discipline::Fifo {
                    3
                } else {
                    self.priority
                },
            )
        }
    }
}

const fn tenant(
    name: &'static str,
    priority: i16,
    weight: u32,
    (ttft_ms, e2e_ms): (Option<u32>, Option<u32>),
    (prompt_words, output): (usize, u32),
    every_ms: u64,
) -> Tenant {
    Tenant {
        name,
        priority,
        weight,
        ttft_ms,
        e2e_ms,
        prompt_words,
        output,
        every: Duration::from_millis(every_ms),
        from: Duration::ZERO,
        until: LENGTH,
    }
}

/// The reference tenants at a tenth of their rates, on a pool a tenth of
/// the size: codegen sends 1,000 requests in 10 s.
fn reference() -> Vec<Tenant> {
    vec![
        tenant("acme", 5, 8, (Some(200), Some(500)), (100, 16), 50),
        tenant("medai", 4, 4, (Some(400), Some(800)), (200, 16), 100),
        tenant("finserv", 3, 2, (None, Some(1_500)), (150, 24), 100),
        tenant("research", 2, 1, (None, None), (200, 16), 200),
        Tenant {
            from: BURST_FROM,
            until: BURST_FROM + BURST_FOR,
            ..tenant("codegen", 1, 1, (None, Some(30_000)), (300, 24), 10)
        },
    ]
}

/// What became of one request.
struct Outcome {
    tenant: &'static str,
    arrived: Duration,
    admitted: bool,
    ttft: Option<Duration>,
    e2e: Duration,
    gpu_micros: u64,
}

fn micros(gpu_seconds: Decimal) -> u64 {
    (gpu_seconds * Decimal::from(1_000_000)).to_u64().unwrap()
}

/// One request of `t`, arriving `arrived` into the run, as the gateway
/// runs it: placed, registered as preemptible, run to its end (again from
/// the queue if preempted), its tenant charged what it used.
async fn one(
    rig: Arc<Rig>,
    t: Tenant,
    discipline: Discipline,
    n: u64,
    arrived: Duration,
) -> Outcome {
    let caller = t.caller(discipline);
    let cost = (t.prompt_words as u64 + u64::from(t.output)) * EST_GPU_MICROS_PER_TOKEN;
    let start = Instant::now();
    let outcome = |admitted, ttft, gpu_micros| Outcome {
        tenant: t.name,
        arrived,
        admitted,
        ttft,
        e2e: start.elapsed(),
        gpu_micros,
    };
    let Ok(placed) = rig
        .place_sized(&caller, n, t.prompt_words, t.output, cost)
        .await
    else {
        return outcome(false, None, 0);
    };
    let Placed {
        mut generation,
        mut permit,
        ..
    } = placed;
    // TTFT: from its arrival to the start of its last attempt, then the
    // replica's own time to its first token.
    let (mut started, mut lost, mut attempts) = (start.elapsed(), 0, 1);
    let (used, ttft) = loop {
        let mut registration = rig.queues.preemptions(MODEL).map(|r| {
            r.register(Run {
                model: MODEL,
                replica: generation.replica_id().unwrap(),
                owner: generation.dedicated_to(),
                tenant: t.name,
                priority: caller.priority,
            })
        });
        let preempted = loop {
            let told = async {
                match registration.as_mut() {
                    Some(r) => r.preempted().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                piece = generation.next() => match piece.unwrap() {
                    engine::Piece::Token(_) => {}
                    engine::Piece::Done(done) => break Ok(done),
                },
                p = told => break Err(p),
            }
        };
        match preempted {
            Ok(done) => break (micros(done.gpu_seconds), started + done.ttft),
            Err(p) => {
                drop(registration);
                lost += micros(generation.cancel().await.unwrap().gpu_seconds);
                rig.queues.wake(MODEL);
                let request = Rig::request(&caller, n, t.prompt_words, t.output);
                match again(rig.admission(), &caller, &request, cost, p.depth).await {
                    Ok(g) => (generation, started, attempts) = (g, start.elapsed(), attempts + 1),
                    Err(_) => {
                        permit.settle(0, Instant::now().into_std());
                        return outcome(true, None, lost);
                    }
                }
            }
        }
    };
    permit.settle(0, Instant::now().into_std());
    // As the gateway does: every attempt was charged its estimate, and
    // every attempt's GPU time counts.
    rig.queues
        .completed(MODEL, &caller, cost * attempts, used + lost);
    outcome(true, Some(ttft), used + lost)
}

/// A replay's figures.
struct Replay {
    name: String,
    outcomes: Vec<Outcome>,
    elapsed: Duration,
    /// The pool's busy + idle GPU-µs by its replicas' own counters.
    busy_idle_micros: u64,
    weights: BTreeMap<&'static str, u32>,
}

/// Replays `tenants` on a fresh pool under `discipline`.
async fn replay(name: &str, tenants: &[Tenant], discipline: Discipline) -> Replay {
    let rig = pool(discipline);
    let began = Instant::now();
    let mut n = 0;
    let mut requests = Vec::new();
    for t in tenants {
        let mut at = t.from;
        while at < t.until {
            n += 1;
            let (rig, t, n) = (rig.clone(), *t, n);
            requests.push(tokio::spawn(async move {
                tokio::time::sleep_until(began + at).await;
                one(rig, t, discipline, n, at).await
            }));
            at += t.every;
        }
    }
    let mut outcomes = Vec::new();
    for r in requests {
        outcomes.push(r.await.unwrap());
    }
    let elapsed = began.elapsed();
    let busy_idle_micros = rig
        .simulator
        .gpu_time()
        .await
        .iter()
        .map(|r| r.time.busy_gpu_micros + r.time.idle_gpu_micros)
        .sum();
    Replay {
        name: name.to_owned(),
        outcomes,
        elapsed,
        busy_idle_micros,
        weights: tenants.iter().map(|t| (t.name, t.weight)).collect(),
    }
}

fn p95(mut xs: Vec<Duration>) -> Duration {
    if xs.is_empty() {
        return Duration::ZERO;
    }
    xs.sort();
    xs[(xs.len() * 95).div_ceil(100) - 1]
}

impl Replay {
    fn of<'a>(&'a self, tenant: &'a str) -> impl Iterator<Item = &'a Outcome> {
        self.outcomes.iter().filter(move |o| o.tenant == tenant)
    }

    /// The worst p95 TTFT of `tenant` over [`TTFT_WINDOW`] windows of
    /// arrivals; a request refused counts as never answered.
    fn worst_ttft_p95(&self, tenant: &str) -> Duration {
        let mut windows: BTreeMap<u128, Vec<Duration>> = BTreeMap::new();
        for o in self.of(tenant) {
            let w = o.arrived.as_millis() / TTFT_WINDOW.as_millis();
            windows
                .entry(w)
                .or_default()
                .push(o.ttft.unwrap_or(Duration::MAX));
        }
        windows.into_values().map(p95).max().unwrap_or_default()
    }

    fn gpu(&self, tenant: &str) -> u64 {
        self.of(tenant).map(|o| o.gpu_micros).sum()
    }

    /// Jain's index over the tenants' weight-normalized GPU time.
    fn jain(&self) -> f64 {
        let xs: Vec<f64> = self
            .weights
            .iter()
            .map(|(t, w)| self.gpu(t) as f64 / f64::from(*w))
            .collect();
        let sum: f64 = xs.iter().sum();
        let squares: f64 = xs.iter().map(|x| x * x).sum();
        sum * sum / (xs.len() as f64 * squares)
    }

    fn print(&self) {
        let total: u64 = self.weights.keys().map(|t| self.gpu(t)).sum();
        let weights: u32 = self.weights.values().sum();
        eprintln!("-- {} --", self.name);
        for (t, w) in &self.weights {
            let admitted = self.of(t).filter(|o| o.admitted).count();
            let ttft = self.worst_ttft_p95(t);
            let ttft = if ttft == Duration::MAX {
                "refused".to_owned()
            } else {
                format!("{ttft:.3?}")
            };
            eprintln!(
                "  {t:<9} {admitted:>5}/{:<5} admitted  GPU share {:.3} (weight {:.3})  worst-5s TTFT p95 {ttft:>9}  e2e p95 admitted {:>9.3?}, all {:>9.3?}",
                self.of(t).count(),
                self.gpu(t) as f64 / total.max(1) as f64,
                f64::from(*w) / f64::from(weights),
                p95(self.of(t).filter(|o| o.admitted).map(|o| o.e2e).collect()),
                p95(self.of(t).map(|o| o.e2e).collect()),
            );
        }
        let clock = self.elapsed.as_micros() as u64 * REPLICAS;
        eprintln!(
            "  Jain {:.3}; pool busy+idle {:.3} GPU-s against {:.3} by the clock ({} replicas x {:?})",
            self.jain(),
            self.busy_idle_micros as f64 / 1e6,
            clock as f64 / 1e6,
            REPLICAS,
            self.elapsed
        );
    }

    /// The pool's counters account for every GPU-µs the clock saw (within
    /// one step per replica, the last one in flight).
    fn accounts_for_the_clock(&self) {
        let clock = self.elapsed.as_micros() as u64 * REPLICAS;
        let slack = 20_000 * REPLICAS;
        assert!(
            self.busy_idle_micros.abs_diff(clock) <= slack,
            "{}: busy+idle {} µs, the clock {clock} µs",
            self.name,
            self.busy_idle_micros
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_drill_reduced_each_mechanism_in_turn() {
    let tenants = reference();
    let mut replays = Vec::new();
    for (name, d) in [
        ("FIFO", Discipline::Fifo),
        ("levels", Discipline::Levels),
        ("levels + weights", Discipline::Weighted),
        ("levels + weights + preemption", Discipline::Full),
    ] {
        let r = replay(name, &tenants, d).await;
        r.print();
        r.accounts_for_the_clock();
        replays.push(r);
    }
    let objective = Duration::from_millis(200);
    let fifo = &replays[0];
    assert!(
        fifo.worst_ttft_p95("acme") > objective,
        "FIFO met acme's objective ({:?}): the load proves nothing",
        fifo.worst_ttft_p95("acme")
    );
    let full = &replays[3];
    assert!(
        full.worst_ttft_p95("acme") <= objective,
        "acme {:?}",
        full.worst_ttft_p95("acme")
    );
    assert!(
        full.worst_ttft_p95("medai") <= Duration::from_millis(400),
        "medai {:?}",
        full.worst_ttft_p95("medai")
    );
    let finserv = p95(full.of("finserv").map(|o| o.e2e).collect());
    assert!(
        finserv <= Duration::from_millis(1_500),
        "finserv e2e {finserv:?}"
    );
    let codegen = p95(full
        .of("codegen")
        .filter(|o| o.admitted)
        .map(|o| o.e2e)
        .collect());
    assert!(
        codegen <= Duration::from_secs(30),
        "codegen e2e {codegen:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_drill_reduced_two_tenants_on_one_level_share_by_weight() {
    // finserv (weight 2) and research (weight 1) both at priority 3, each
    // with more than the pool can serve.
    let tenants = [
        Tenant {
            priority: 3,
            every: Duration::from_millis(8),
            ..reference()[2]
        },
        Tenant {
            priority: 3,
            e2e_ms: Some(1_500),
            every: Duration::from_millis(8),
            prompt_words: 150,
            output: 24,
            ..reference()[3]
        },
    ];
    let ratio = |r: &Replay| r.gpu("finserv") as f64 / r.gpu("research") as f64;
    let levels = replay("same level, weights ignored", &tenants, Discipline::Levels).await;
    levels.print();
    let weighted = replay("same level, weights 2:1", &tenants, Discipline::Weighted).await;
    weighted.print();
    eprintln!(
        "  finserv/research GPU: {:.3} ignored, {:.3} weighted",
        ratio(&levels),
        ratio(&weighted)
    );
    assert!((ratio(&levels) - 1.0).abs() <= 0.1, "{:.3}", ratio(&levels));
    assert!(
        (ratio(&weighted) - 2.0).abs() <= 0.2,
        "{:.3}",
        ratio(&weighted)
    );
}
