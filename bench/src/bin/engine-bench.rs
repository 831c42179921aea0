//! `engine-bench`: how fast the simulator itself runs. Drives one 70B
//! replica on the virtual clock through rounds of 10,000 requests in
//! flight at once (reference traffic shape: prompts p50 800 / p95 6,000
//! tokens, outputs p50 300 / p95 1,200, five tenants with shared system
//! prompts), and prints simulated requests per CPU-second, the simulated
//! time covered, and peak memory (VmHWM).
//!
//! `cargo build --release -p bench --bin engine-bench && target/release/engine-bench [rounds]`

use std::io::Write as _;

use anyhow::Context;
use engine::clock::{run_virtual, Input};
use engine::profile::BLOCK_TOKENS;
use engine::{ModelProfile, Replica, SeqRequest, ServiceClass};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const IN_FLIGHT: usize = 10_000;
const TENANTS: [(&str, ServiceClass); 5] = [
    ("acme-corp", ServiceClass::Reserved),
    ("medai-labs", ServiceClass::Reserved),
    ("finserv-team", ServiceClass::Standard),
    ("research-squad", ServiceClass::BestEffort),
    ("codegen-platform", ServiceClass::BestEffort),
];

/// A log-normal draw with this median and 95th percentile.
fn log_normal(rng: &mut StdRng, median: f64, p95: f64) -> f64 {
    let sigma = (p95 / median).ln() / 1.645;
    let (u1, u2): (f64, f64) = (rng.random_range(1e-12..1.0), rng.random());
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    median * (sigma * z).exp()
}

fn request(rng: &mut StdRng, tenant: usize, max_context: u32) -> SeqRequest {
    let prompt = (log_normal(rng, 800.0, 6_000.0) as u32).clamp(16, max_context / 2);
    let output = (log_normal(rng, 300.0, 1_200.0) as u32).clamp(1, max_context / 2);
    // A shared system prompt (one of eight per tenant), then unique text.
    let system = rng.random_range(0..8u64);
    let shared_blocks = rng.random_range(4..32u32);
    let unique: u64 = rng.random();
    let blocks = (0..prompt / BLOCK_TOKENS)
        .map(|i| {
            let base = if i < shared_blocks {
                (tenant as u64) << 40 | system << 32
            } else {
                unique
            };
            base ^ u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        })
        .collect();
    SeqRequest {
        class: TENANTS[tenant].1,
        prompt_tokens: prompt,
        blocks,
        output_tokens: output,
        capped: false,
        stream: false,
    }
}

/// CPU time of this thread, from /proc (nanoseconds).
fn cpu_nanos() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")
        .context("reading /proc/thread-self/schedstat")?;
    text.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .context("parsing schedstat")
}

fn vm_hwm() -> String {
    bench::procfs::status_kib(std::process::id(), "VmHWM:")
        .map_or_else(|| "unknown".into(), |kib| format!("{kib} kB"))
}

fn main() -> anyhow::Result<()> {
    let rounds: usize = match std::env::args().nth(1) {
        Some(s) => s.parse().context("rounds must be a positive integer")?,
        None => 10,
    };
    let profile = ModelProfile::reference()
        .into_iter()
        .find(|p| p.name == "llama-3.1-70b")
        .context("the 70B reference profile")?;
    let mut replica = Replica::new(&profile, "bench-r0")?;
    // A deep queue on purpose: the point is the simulator with 10,000 requests in flight.
    replica.set_queue_admission(false);
    let mut rng = StdRng::seed_from_u64(42);
    let mut done = 0u64;
    let mut rejected = 0usize;
    let mut cpu = 0u64;
    let mut tokens = 0u64;
    for _ in 0..rounds {
        let at = replica.now();
        let timeline: Vec<(u64, Input)> = (0..IN_FLIGHT)
            .map(|i| {
                let tenant = i % TENANTS.len();
                let req = request(&mut rng, tenant, profile.max_context);
                let input = Input::Arrive {
                    tenant: TENANTS[tenant].0.to_owned(),
                    req,
                };
                (at, input)
            })
            .collect();
        let start = cpu_nanos()?;
        let report = run_virtual(&mut replica, timeline);
        cpu += cpu_nanos()? - start;
        rejected += report.rejected;
        for o in report.outcomes.iter().flatten() {
            done += 1;
            tokens += u64::from(o.completion_tokens);
        }
    }
    let stats = replica.stats();
    let (prompt, hits) = replica.prompt_tokens_and_hits();
    let secs = cpu as f64 / 1e9;
    let mut out = std::io::stdout().lock();
    writeln!(out, "engine-bench: 70B replica, virtual clock, {rounds} rounds of {IN_FLIGHT} requests in flight")?;
    writeln!(out, "requests simulated     {done} ({rejected} rejected)")?;
    writeln!(out, "tokens generated       {tokens}")?;
    writeln!(
        out,
        "prompt tokens          {prompt} ({hits} from the prefix cache)"
    )?;
    writeln!(out, "steps                  {}", stats.steps)?;
    writeln!(out, "preemptions            {}", replica.preemptions())?;
    writeln!(
        out,
        "simulated time         {:.1} s busy",
        stats.busy_micros as f64 / 1e6
    )?;
    writeln!(out, "CPU time               {secs:.3} s")?;
    writeln!(out, "requests per CPU-second {:.0}", done as f64 / secs)?;
    writeln!(
        out,
        "steps per CPU-second    {:.0}",
        stats.steps as f64 / secs
    )?;
    writeln!(out, "memory (VmHWM)          {}", vm_hwm())?;
    Ok(())
}
