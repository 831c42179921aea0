//! The fair queue's own cost: nanoseconds per enqueue + dequeue with
//! 10,000 requests waiting across the five reference tenants (each at its
//! priority level, with its WFQ weight), next to a plain FIFO (`VecDeque`)
//! doing the same in the same run — the cost of fairness itself. Then the
//! same through admission's queues as `place` uses them (the lock, the
//! waiter's wake-up, join then dispatch), p50 and p99 per request; and
//! `place`'s fast-path check (does anyone wait at my level?) on an empty
//! queue, p99, next to reading the clock (what timing one call costs). And the
//! router's: nanoseconds to place a request on a pool of 12 replicas by
//! power of two choices on KV headroom (a fresh reading of one replica
//! every 12 placements), next to round robin.
//!
//! ```sh
//! cargo build --release -p bench --bin fleet-bench && target/release/fleet-bench [queued] [rounds]
//! ```

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Instant;

use bench::percentiles::Percentiles;
use fleet::pool::{Placement, Pool, Replica};
use fleet::{Queue, QueueConfig};
use rand::SeedableRng;

/// (tenant, priority, weight) of the reference tenants.
const TENANTS: [(&str, i16, u32); 5] = [
    ("acme-corp", 5, 8),
    ("medai-labs", 4, 4),
    ("finserv-team", 3, 2),
    ("research-squad", 2, 1),
    ("codegen-platform", 1, 1),
];

fn cost(i: u64) -> u64 {
    // GPU-µs of a request: spread like the reference workload's sizes.
    1_000 + (i * 7_919) % 200_000
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let queued: u64 = args.get(1).map_or(Ok(10_000), |a| a.parse())?;
    let rounds: usize = args.get(2).map_or(Ok(7), |a| a.parse())?;
    let ops: u64 = 1_000_000;
    let mut fair_ns = Vec::new();
    let mut fifo_ns = Vec::new();
    for _ in 0..rounds {
        let mut q = Queue::new(QueueConfig {
            depth: [usize::MAX; fleet::queue::LEVELS],
        });
        let mut fifo = VecDeque::new();
        for i in 0..queued {
            let (t, p, w) = TENANTS[(i % 5) as usize];
            q.push(t, p, w, cost(i), i)?;
            fifo.push_back((t, i));
        }
        // Steady state: one in, one out, the queue staying at `queued`.
        let started = Instant::now();
        for i in queued..queued + ops {
            let (t, p, w) = TENANTS[(i % 5) as usize];
            q.push(t, p, w, cost(i), i)?;
            black_box(q.pop());
        }
        fair_ns.push(started.elapsed().as_nanos() as f64 / ops as f64);
        let started = Instant::now();
        for i in queued..queued + ops {
            let (t, _, _) = TENANTS[(i % 5) as usize];
            fifo.push_back((t, i));
            black_box(fifo.pop_front());
        }
        fifo_ns.push(started.elapsed().as_nanos() as f64 / ops as f64);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    admission_queues(queued);
    let (mut p2c_ns, mut rr_ns) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (p2c, rr) = routing(ops);
        p2c_ns.push(p2c);
        rr_ns.push(rr);
    }
    let (p2c, rr) = (median(&mut p2c_ns), median(&mut rr_ns));
    let (fair, fifo) = (median(&mut fair_ns), median(&mut fifo_ns));
    eprintln!(
        "{queued} queued across 5 tenants and 5 levels, {ops} enqueue+dequeue pairs, median of {rounds} rounds\n  \
         fair queue (levels + weights): {fair:.0} ns per enqueue+dequeue\n  \
         plain FIFO (VecDeque):         {fifo:.0} ns per enqueue+dequeue\n  \
         fairness costs {:.0} ns more per request",
        fair - fifo
    );
    eprintln!(
        "12 replicas, {ops} placements, median of {rounds} rounds\n  \
         power of two choices on KV headroom: {p2c:.0} ns per placement\n  \
         round robin:                         {rr:.0} ns per placement"
    );
    Ok(())
}

/// Per-call ns at the 50th and 99th percentile of `f` over `calls` calls.
fn percentiles(calls: u64, mut f: impl FnMut(u64)) -> (f64, f64) {
    let ns = Percentiles::new(
        (0..calls)
            .map(|i| {
                let started = Instant::now();
                f(i);
                started.elapsed().as_nanos() as f64
            })
            .collect(),
    );
    (ns.at(0.50), ns.at(0.99))
}

/// `place`'s side of the queue: the fast path's check on an empty queue,
/// and join + dispatch with `queued` waiting, as admission runs them.
fn admission_queues(queued: u64) {
    use admission::admission_queue::Queues;
    use admission::caller::Caller;
    const MODEL: &str = "llama-3.1-70b";
    let callers: Vec<Caller> = TENANTS
        .iter()
        .map(|(t, p, w)| Caller {
            weight: *w,
            ..Caller::unlimited(t, &format!("key-{t}"), *p)
        })
        .collect();
    let calls = 1_000_000;
    let queues = Queues::new([MODEL.to_owned()], usize::MAX);
    let clock = percentiles(calls, |_| {
        black_box(Instant::now());
    });
    let fast = percentiles(calls, |i| {
        black_box(queues.must_queue(MODEL, &callers[(i % 5) as usize]));
    });
    // 10,000 waiting; then one joins and the first in line is dispatched.
    let mut waiting: VecDeque<_> = (0..queued)
        .map(|i| queues.join(MODEL, &callers[(i % 5) as usize], cost(i)))
        .collect::<Result<_, _>>()
        .unwrap_or_default();
    let both = percentiles(calls, |i| {
        if let Ok(spot) = queues.join(MODEL, &callers[(i % 5) as usize], cost(i)) {
            waiting.push_back(spot);
        }
        // The request each tenant's turn comes to; any one leaves as fast.
        if let Some(spot) = waiting.pop_front() {
            spot.dispatched();
        }
    });
    eprintln!(
        "admission's queues, {calls} calls each\n  \
         fast path (an empty queue: does anyone wait at my level?): p50 {:.0} ns  p99 {:.0} ns  (reading the clock: p99 {:.0} ns)\n  \
         join + dispatch with {queued} waiting across 5 tenants:     p50 {:.0} ns  p99 {:.0} ns",
        fast.0, fast.1, clock.1, both.0, both.1
    );
}

/// ns per placement: power of two choices on a 12-replica pool (one
/// replica re-read every 12 placements), and round robin.
fn routing(ops: u64) -> (f64, f64) {
    const GIB: u64 = 1 << 30;
    let mut pool = Pool::new(
        (0..12)
            .map(|i| Replica::new(format!("llama-3.1-70b-r{i}"), 172 * GIB))
            .collect(),
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let placement = Placement {
        tenant: "acme-corp",
        kv: 50 << 20,
        threshold_percent: 92,
    };
    let started = Instant::now();
    for i in 0..ops {
        if i % 12 == 0 {
            // A snapshot arrives: that replica's KV back to a steady level.
            pool.observe((i / 12 % 12) as usize, 40 * GIB);
        }
        let _ = black_box(pool.route(&placement, &mut rng));
    }
    let p2c = started.elapsed().as_nanos() as f64 / ops as f64;
    let started = Instant::now();
    for i in 0..ops {
        black_box(i % 12);
    }
    let rr = started.elapsed().as_nanos() as f64 / ops as f64;
    (p2c, rr)
}
