//! The noisy-neighbour drill (REFERENCE.md): codegen-platform submits
//! 5,000 requests in 30 s while acme-corp sends 200 requests/s and the
//! other three tenants send at their reference rates, on a simulated pool
//! of 12 replicas of the 70B profile, acme-corp owning 4 of them. The same
//! traffic is replayed four times through a real gateway (in process, on a
//! loopback socket, the engine in real time):
//!
//! - **fair**: the fairness layer on (the gateway's `GATEWAY_QUEUE=on`:
//!   priority levels and WFQ before the engine, the degradation ladder),
//!   every tenant's limits, acme's dedicated replicas;
//! - **uncapped**: the same, with every tenant's rate and concurrency caps
//!   lifted, and no global bucket: the fairness layer alone against the
//!   whole burst;
//! - **classes only**: the fairness layer off (`GATEWAY_QUEUE=off`) —
//!   limits, the replicas' KV admission by class (60/85/92%), 503 when no
//!   replica admits, dedicated replicas;
//! - **FIFO**: the reference incident — one first-in-first-out line in
//!   front of a shared pool, no priorities, no weights, no dedicated
//!   replicas, every tenant at the standard class with its rate and
//!   concurrency caps lifted.
//!
//! `--modes fifo,levels,weights,preemption,fair-uncapped` replays the
//! queue's mechanisms one at a time instead (caps lifted in each, so only
//! the queue differs; `fair-uncapped` adds the ladder and SLO borrowing);
//! `--dedicated 0` without acme's replicas; `--same-level` with
//! codegen-platform on finserv-team's level (two standard-tier tenants),
//! where the weights must show: finserv-team asks for less than its share
//! of that level and should get all it asks, whatever codegen's burst.
//!
//! Each replay prints what every tenant got, the criteria with their
//! measured figures and pass/fail, and the GPU time the replicas spent
//! against what the usage events bill. The FIFO replay must breach acme's
//! SLO; if it does not, the load is too light to prove anything and the
//! drill says so.
//!
//! ```sh
//! cargo build --release -p bench --bin drill && target/release/drill
//! ```
//!
//! No Postgres, broker or Redis: the gateway's limits are in memory and its
//! usage events stay in a temporary outbox, read back for the bills.

mod gateway;
mod report;
mod traffic;

use clap::Parser;

/// The drill's settings; the defaults are the reference drill.
#[derive(Debug, Clone, Parser)]
#[command(about = "The noisy-neighbour drill: fair, classes only and FIFO, side by side")]
pub struct Drill {
    /// Seconds of traffic before codegen's burst starts.
    #[arg(long, default_value_t = 10)]
    pub warmup_secs: u64,
    /// codegen-platform's burst: this many requests...
    #[arg(long, default_value_t = 5_000)]
    pub burst_requests: u64,
    /// ...spread evenly over this many seconds.
    #[arg(long, default_value_t = 30)]
    pub burst_secs: u64,
    /// Seconds of traffic after the burst.
    #[arg(long, default_value_t = 10)]
    pub cooldown_secs: u64,
    /// Replicas of the 70B profile in the pool.
    #[arg(long, default_value_t = 12)]
    pub replicas: u32,
    /// Of which acme-corp owns this many.
    #[arg(long, default_value_t = 4)]
    pub dedicated: u32,
    /// codegen-platform on finserv-team's level (priority 3, both standard
    /// tier), so two tenants share one level and their weights (2 and 1)
    /// must show (FIFO already puts every tenant on one level).
    #[arg(long)]
    pub same_level: bool,
    /// FIFO's one line holds at most this many waiting requests; more are
    /// refused (429 `queue_full`). Every open request holds two of the
    /// drill's file descriptors (its client's and the gateway's side), and
    /// an unbounded line keeps ~14,000 open at once, past a common
    /// `ulimit -n` of 20,000: a bound both sides count, instead of client
    /// errors.
    #[arg(long, default_value_t = 6_000)]
    pub fifo_depth: usize,
    /// Only these replays (fair, fair-uncapped, classes, fifo; and the
    /// mechanisms one at a time: levels, weights, preemption),
    /// comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [gateway::Mode::Fair, gateway::Mode::FairUncapped, gateway::Mode::Classes, gateway::Mode::Fifo])]
    pub modes: Vec<gateway::Mode>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let drill = Drill::parse();
    report::preamble(&drill);
    let mut verdicts = Vec::new();
    for &mode in &drill.modes {
        let gw = gateway::start(mode, &drill).await?;
        let outcomes = traffic::replay(&gw.url, &drill).await;
        let replay = report::Replay::of(mode, &outcomes, &gw).await?;
        replay.print();
        verdicts.push(replay);
    }
    report::closing(&verdicts);
    Ok(())
}
