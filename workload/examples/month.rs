//! Generates a month of reference traffic and prints its totals and the
//! generation rate: `cargo run --release -p workload --example month --
//! [seed] [events] [from] [to]` (defaults: 1, 1500000, November 2026).

use std::io::Write;
use std::time::Instant;

use chrono::{DateTime, Utc};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.into());
    let seed: u64 = arg(0, "1").parse()?;
    let events: u64 = arg(1, "1500000").parse()?;
    let from: DateTime<Utc> = arg(2, "2026-11-01T00:00:00Z").parse()?;
    let to: DateTime<Utc> = arg(3, "2026-12-01T00:00:00Z").parse()?;
    let started = Instant::now();
    let mut generator = workload::Generator::reference(seed, from, to, events)?;
    for event in generator.by_ref() {
        std::hint::black_box(event);
    }
    let elapsed = started.elapsed();
    let summary = generator.summary();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{summary}")?;
    for t in &summary.tenants {
        for m in &t.models {
            writeln!(
                out,
                "  {:<18} {:<14} {:>9} req {:>14} prompt {:>13} cached {:>12} out {:>16} GPU-s",
                t.tenant,
                m.model,
                m.totals.requests,
                m.totals.prompt_tokens,
                m.totals.cached_tokens,
                m.totals.completion_tokens,
                m.totals.gpu_seconds
            )?;
        }
    }
    writeln!(
        out,
        "{events} events in {:.3} s: {:.0} events/s",
        elapsed.as_secs_f64(),
        events as f64 / elapsed.as_secs_f64()
    )?;
    Ok(())
}
