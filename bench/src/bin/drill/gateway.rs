//! One replay's gateway: the real gateway-lite app in process, on a
//! loopback socket, over a simulated pool of 70B replicas in real time,
//! with the five reference tenants as its callers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use admission::admission_queue::{Discipline, Queues};
use admission::cluster::Cluster;
use admission::limits::Limiter;
use admission::upstream::Upstreams;
use engine::{ModelProfile, Simulator};
use gateway_lite::outbox::Outbox;
use gateway_lite::service::{app, AppState};
use gateway_lite::tenants::{Caller, ModelLimits, Registry, RequestRate};

use crate::Drill;

pub const MODEL: &str = "llama-3.1-70b";

/// Which fairness the replay runs with (see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Fair,
    /// Fair, with every tenant's rate and concurrency caps lifted: the
    /// fairness layer alone against the whole burst.
    FairUncapped,
    Classes,
    Fifo,
    /// Caps lifted, the queue with priority levels only (no weights, no
    /// preemption, no ladder): one mechanism added to FIFO.
    Levels,
    /// + weights within a level.
    Weights,
    /// + priority preemption (still no ladder; `fair-uncapped` adds it).
    Preemption,
}

impl Mode {
    pub fn title(self) -> &'static str {
        match self {
            Self::Fair => "fair (the default: priority queues + WFQ + ladder + preemption, dedicated replicas)",
            Self::FairUncapped => {
                "fair with every tenant's caps lifted (the fairness layer alone against the burst)"
            }
            Self::Classes => "classes only (GATEWAY_QUEUE=off: KV admission by class, 503 when full)",
            Self::Fifo => "FIFO (one line, shared pool, caps lifted: the reference incident; the line bounded by --fifo-depth)",
            Self::Levels => "priority levels only (caps lifted, no weights, preemption or ladder)",
            Self::Weights => "levels + weights (caps lifted, no preemption or ladder)",
            Self::Preemption => "levels + weights + preemption (caps lifted, no ladder)",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Fair => "fair",
            Self::FairUncapped => "fair-uncapped",
            Self::Classes => "classes",
            Self::Fifo => "fifo",
            Self::Levels => "levels",
            Self::Weights => "weights",
            Self::Preemption => "preemption",
        })
    }
}

/// A reference tenant as the drill drives it.
#[derive(Debug, Clone, Copy)]
pub struct Tenant {
    pub id: &'static str,
    pub key: &'static str,
    pub priority: i16,
    pub weight: u32,
    pub rate: RequestRate,
    pub max_concurrency: u32,
    pub ttft_p95_ms: Option<u32>,
    pub e2e_p95_ms: Option<u32>,
}

/// REFERENCE.md's five tenants.
pub const TENANTS: [Tenant; 5] = [
    Tenant {
        id: "acme-corp",
        key: "sk-drill-acme-corp",
        priority: 5,
        weight: 8,
        rate: RequestRate {
            per_second: 200,
            burst: 50,
        },
        max_concurrency: 100,
        ttft_p95_ms: Some(200),
        e2e_p95_ms: Some(500),
    },
    Tenant {
        id: "medai-labs",
        key: "sk-drill-medai-labs",
        priority: 4,
        weight: 4,
        rate: RequestRate {
            per_second: 50,
            burst: 20,
        },
        max_concurrency: 30,
        ttft_p95_ms: Some(400),
        e2e_p95_ms: Some(800),
    },
    Tenant {
        id: "finserv-team",
        key: "sk-drill-finserv-team",
        priority: 3,
        weight: 2,
        rate: RequestRate {
            per_second: 30,
            burst: 10,
        },
        max_concurrency: 20,
        ttft_p95_ms: None,
        e2e_p95_ms: Some(1_500),
    },
    Tenant {
        id: "research-squad",
        key: "sk-drill-research-squad",
        priority: 2,
        weight: 1,
        rate: RequestRate {
            per_second: 10,
            burst: 5,
        },
        max_concurrency: 10,
        ttft_p95_ms: None,
        e2e_p95_ms: None,
    },
    Tenant {
        id: "codegen-platform",
        key: "sk-drill-codegen-platform",
        priority: 1,
        weight: 1,
        rate: RequestRate {
            per_second: 100,
            burst: 10,
        },
        max_concurrency: 40,
        ttft_p95_ms: None,
        e2e_p95_ms: Some(30_000),
    },
];

/// A running replay's gateway and what the report reads back.
pub struct Gateway {
    pub url: String,
    pub outbox: Outbox,
    pub simulator: Arc<Simulator>,
    /// GPUs in the pool (replicas × GPUs per replica).
    pub gpus: u64,
    /// When every replica had been started (their GPU time counts from
    /// then), by the drill's own clock: between these two instants.
    pub pool_started: (std::time::Instant, std::time::Instant),
    _dir: tempfile::TempDir,
}

/// Whether the tenants' rate and concurrency caps and the global bucket
/// apply.
fn capped(mode: Mode) -> bool {
    matches!(mode, Mode::Fair | Mode::Classes)
}

fn caller(t: &Tenant, mode: Mode) -> Caller {
    let slo = fleet::slo::Slo {
        ttft_p95_ms: t.ttft_p95_ms,
        e2e_p95_ms: t.e2e_p95_ms,
        availability_bp: None,
    };
    let fifo = mode == Mode::Fifo;
    let capped = capped(mode);
    // In the one line everybody waits as long as the gateway lets anyone
    // (30 s), whatever its objectives: that is what FIFO means.
    let slo = if fifo {
        fleet::slo::Slo {
            ttft_p95_ms: None,
            e2e_p95_ms: Some(150_000),
            availability_bp: None,
        }
    } else {
        slo
    };
    Caller {
        tenant_id: t.id.into(),
        api_key_id: format!("key_{}", t.id),
        priority: if fifo { 3 } else { t.priority },
        weight: t.weight,
        max_concurrency: capped.then_some(t.max_concurrency),
        max_kv_mib_seconds: None,
        rate: capped.then_some(t.rate),
        slo,
        limits: Arc::new(HashMap::from([("*".to_owned(), ModelLimits::default())])),
    }
}

/// Starts the gateway of a `mode` replay.
pub async fn start(mode: Mode, drill: &Drill) -> anyhow::Result<Gateway> {
    let dir = tempfile::tempdir()?;
    let registry = Registry::default();
    for t in &TENANTS {
        let mut c = caller(t, mode);
        // Two standard-tier tenants: codegen-platform on finserv-team's level.
        if drill.same_level && mode != Mode::Fifo && t.id == "codegen-platform" {
            c.priority = 3;
        }
        registry.insert(t.key, c);
    }
    let mut profiles: Vec<ModelProfile> = ModelProfile::reference()
        .into_iter()
        .filter(|p| p.name == MODEL)
        .collect();
    ModelProfile::set_replicas(&mut profiles, &format!("{MODEL}={}", drill.replicas))?;
    if mode != Mode::Fifo && drill.dedicated > 0 {
        ModelProfile::set_dedicated(
            &mut profiles,
            &format!("{MODEL}:acme-corp={}", drill.dedicated),
        )?;
    }
    let gpus = profiles
        .iter()
        .map(|p| u64::from(p.replicas) * u64::from(p.gpus))
        .sum();
    let simulator = Arc::new(Simulator::try_new(profiles, 1)?);
    // Start every replica now, so the pool's GPU time and the clock's
    // elapsed time begin together.
    let before = std::time::Instant::now();
    simulator.gpu_time().await;
    let pool_started = (before, std::time::Instant::now());
    let outbox = Outbox::open(&dir.path().join("outbox"))?;
    let cluster = Cluster::local("gw-drill");
    let global = capped(mode).then_some(RequestRate {
        per_second: 400,
        burst: 60,
    });
    let fair = matches!(mode, Mode::Fair | Mode::FairUncapped);
    let ladder = fair.then(admission::ladder::Ladder::new);
    let mut limiter = Limiter::new(global, cluster);
    if let Some(l) = &ladder {
        limiter = limiter.with_ladder(l.clone());
    }
    let discipline = match mode {
        Mode::Fair | Mode::FairUncapped | Mode::Preemption => Some(Discipline::Full),
        Mode::Weights => Some(Discipline::Weighted),
        Mode::Levels => Some(Discipline::Levels),
        Mode::Fifo => Some(Discipline::Fifo),
        Mode::Classes => None,
    };
    let depth = if mode == Mode::Fifo {
        drill.fifo_depth
    } else {
        1_000
    };
    let queues = discipline.map(|d| Queues::with([MODEL.to_owned()], depth, d));
    let state = AppState {
        speedup: 1,
        request_timeout: Duration::from_secs(300),
        limiter,
        ladder,
        queues,
        ..AppState::alone(
            "gw-drill",
            registry,
            Arc::new(Upstreams::new(simulator.clone(), Vec::new())?),
            outbox.clone(),
        )
    };
    state.spawn_ladder();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(serving::serve(
        listener,
        app(state, None),
        serving::HttpSettings::default(),
        std::future::pending(),
    ));
    Ok(Gateway {
        url,
        outbox,
        simulator,
        gpus,
        pool_started,
        _dir: dir,
    })
}
