//! The printed table, and the check that ingest's result is right.

use std::time::Duration;

use anyhow::{ensure, Result};
use bench::percentiles::Percentiles;
use bench::prometheus::{bucket_quantile, metric};
use ingest::store::WritePath;

use crate::cpu_time::Part;
use crate::freshness::Fresh;
use crate::processes::Bulk;
use crate::{Args, FRESH_LINGER_MS, PARTITIONS};

/// Everything the report is made of.
pub(crate) struct Measured {
    pub(crate) load: String,
    pub(crate) produce: Duration,
    pub(crate) read: Duration,
    pub(crate) rounds: Vec<Round>,
    /// The real ingest, once per write path.
    pub(crate) runs: Vec<PathRun>,
}

/// One round of ceilings (b) and (c).
pub(crate) struct Round {
    pub(crate) copy: Duration,
    /// (c) per write path, in the order they ran.
    pub(crate) transactions: Vec<(WritePath, Duration)>,
}

/// The ingest binary on one write path.
pub(crate) struct PathRun {
    pub(crate) path: WritePath,
    pub(crate) bulk: Bulk,
    /// `/metrics` of each ingest process.
    pub(crate) metrics: Vec<String>,
    /// request_log rows, usage_hourly requests, dead letters.
    pub(crate) checks: (i64, i64, i64),
    pub(crate) hwm_kib: u64,
    pub(crate) fresh: Fresh,
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The smallest, median and largest of `values` (`NaN`s if none).
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |i: usize| values.get(i).copied().unwrap_or(f64::NAN);
    let n = values.len();
    let median = if n % 2 == 1 {
        at(n / 2)
    } else {
        (at((n / 2).saturating_sub(1)) + at(n / 2)) / 2.0
    };
    (at(0), median, at(n.saturating_sub(1)))
}

/// Prints the table; fails if ingest's result is wrong on any path.
pub(crate) fn report(args: &Args, r: &Measured) -> Result<()> {
    let n = args.events;
    let rate = |d: Duration| n as f64 / secs(d);
    let cores = std::thread::available_parallelism().map_or(0, |c| c.get());
    let load = r.load.split_whitespace().next().unwrap_or("?");
    let (order, procs) = (args.order, args.processes);
    let (max_batch, linger_ms, sync) = (args.max_batch, args.linger_ms, args.synchronous_commit);
    let (produce_r, read_s, read_r) = (rate(r.produce), secs(r.read), rate(r.read));
    println!(
        r#"
== ingest benchmark: {n} events, {PARTITIONS} partitions, {cores} cores (nproc), load {load} at start
   request ids in {order:?} order (--order)
   ingest: {procs} process(es) in one group (--processes), INGEST_MAX_BATCH={max_batch}, INGEST_LINGER_MS={linger_ms}, INGEST_SYNCHRONOUS_COMMIT={sync:?}
   produce (idempotent, acks=all, lz4, linger 5 ms): {produce_r:.0} events/s (informational)
   (a) broker read ceiling: {read_s:.2} s, {read_r:.0} events/s

   (b) raw COPY ceiling, no indexes, and (c) ingest's own transactions for the same
   events (batches of {max_batch} decoded beforehand, no broker), per write path
   (INGEST_WRITE_PATH), each on a fresh database; {procs} connection(s), each on its
   share of the partitions; (c) / (b) within each round:"#
    );
    let mut header = "   round   (b) events/s".to_owned();
    for path in &args.paths {
        let name = format!("{path:?}");
        header.push_str(&format!("   (c) {name:<7} events/s   (c)/(b)"));
    }
    println!("{header}");
    let mut ratios: Vec<(WritePath, Vec<f64>)> =
        args.paths.iter().map(|p| (*p, Vec::new())).collect();
    for (i, round) in r.rounds.iter().enumerate() {
        let copy_r = rate(round.copy);
        let mut line = format!("   {:>5} {:>14.0}", i + 1, copy_r);
        for (path, ratios) in &mut ratios {
            let Some((_, took)) = round.transactions.iter().find(|(p, _)| p == path) else {
                continue;
            };
            let ratio = rate(*took) / copy_r;
            ratios.push(ratio);
            line.push_str(&format!("   {:>19.0} {:>9.2}", rate(*took), ratio));
        }
        println!("{line}");
    }
    for (path, values) in &ratios {
        let (lo, mid, hi) = spread(values.clone());
        println!("   (c)/(b), {path:?}: {lo:.2}–{hi:.2}, median {mid:.2}");
    }
    if let [(first, before), (second, after)] = &ratios[..] {
        let gains = before.iter().zip(after).map(|(b, a)| a / b).collect();
        let (lo, mid, hi) = spread(gains);
        println!(
            "   (c) {second:?} / (c) {first:?} in the same round: {lo:.2}–{hi:.2}, median {mid:.2}"
        );
    }
    let copy_median = spread(r.rounds.iter().map(|x| rate(x.copy)).collect()).1;
    let mut correct = true;
    for run in &r.runs {
        correct &= path_report(args, run, read_r, copy_median)?;
    }
    ensure!(correct, "ingest's result is wrong (see above)");
    Ok(())
}

/// Prints one write path's ingest run; whether its result is right.
fn path_report(args: &Args, r: &PathRun, read_r: f64, copy_r: f64) -> Result<bool> {
    let n = args.events;
    let path = r.path;
    let total_s = secs(r.bulk.total);
    let total_r = n as f64 / total_s;
    let steady_s = secs(r.bulk.total - r.bulk.first);
    let steady_r = (n as i64 - r.bulk.at_first) as f64 / steady_s;
    let (vs_read, vs_copy) = (steady_r / read_r, steady_r / copy_r);
    let (first_s, at_first) = (secs(r.bulk.first), r.bulk.at_first);
    let (rss, hwm) = (
        r.bulk.max_rss_kib as f64 / 1024.0,
        r.hwm_kib as f64 / 1024.0,
    );
    let (cpu, cpu_pct) = (r.bulk.cpu_s, 100.0 * r.bulk.cpu_s / total_s);
    // Counters add up over the processes; of quantiles, the worst is shown.
    let sum = |name: &str| r.metrics.iter().map(|t| metric(t, name)).sum::<f64>();
    let worst = |name: &str, q: f64| {
        r.metrics
            .iter()
            .map(|t| bucket_quantile(t, name, q))
            .fold(f64::NAN, f64::max)
    };
    let (batches, commit_s) = (
        sum("ingest_commit_seconds_count"),
        sum("ingest_commit_seconds_sum"),
    );
    let mean_batch = sum("ingest_batch_size_sum") / batches;
    let procs = args.processes;
    let commit_pct = 100.0 * commit_s / steady_s / f64::from(procs);
    let commit_mean = 1000.0 * commit_s / batches;
    let commit_p50 = 1000.0 * worst("ingest_commit_seconds", 0.5);
    let commit_p99 = 1000.0 * worst("ingest_commit_seconds", 0.99);
    let (rows, requests, dead) = r.checks;
    let correct = rows == n as i64 && requests == n as i64 && dead == 0;
    let ok = if correct { "yes" } else { "NO" };
    let fresh = Percentiles::new(r.fresh.latencies_ms.clone());
    let (p50, p99, max) = (fresh.at(0.5), fresh.at(0.99), fresh.at(1.0));
    let inserted = Percentiles::new(r.fresh.inserted_ms.clone());
    let (in50, in99) = (inserted.at(0.5), inserted.at(0.99));
    let broker = Percentiles::new(r.fresh.broker_ms.clone());
    let (br50, br99, br_n) = (broker.at(0.5), broker.at(0.99), broker.len());
    let (fresh_n, per_s) = (fresh.len(), args.rate);
    let own_cpu = 100.0 * r.fresh.cpu_s / r.fresh.secs;
    let cpu_split = cpu_split(r, steady_s, n as i64 - at_first);
    println!(
        r#"
   -- ingest, INGEST_WRITE_PATH={path:?}:                seconds    events/s
   process start -> all committed         {total_s:>9.2} {total_r:>11.0}
   first commit -> all committed          {steady_s:>9.2} {steady_r:>11.0}
   (the first commit came {first_s:.2} s after start, covering {at_first} events);
   first-commit rate / (a) {vs_read:.2}, / median (b) {vs_copy:.2}
   ingest RSS (largest process): max {rss:.1} MiB sampled while ingesting, VmHWM {hwm:.1} MiB at the end
   ingest CPU (all processes): {cpu:.2} s user+sys until all committed ({cpu_pct:.0}% of one core)
{cpu_split}
   postgres commits: {batches:.0} of {mean_batch:.0} messages on average, {commit_s:.2} s in
     total ({commit_pct:.0}% of the first-commit span per process); per batch mean
     {commit_mean:.1} ms, p50 <= {commit_p50:.1} ms, p99 <= {commit_p99:.1} ms (histogram bucket bounds, worst process)
   correct: {ok} (request_log {rows} rows, usage_hourly {requests} requests, {dead} dead
     letters; expected {n}, {n}, 0)
   freshness, {fresh_n} events at {per_s}/s (producer linger {FRESH_LINGER_MS} ms), produce ->
   visible in request_log: p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms
   (per event, from its send to the first ~10 ms poll that saw its batch committed;
    this load generator used {own_cpu:.0}% of one core meanwhile); of which send ->
   its row inserted (ingested_at; broker, consumer and the batch's linger): p50 {in50:.0} ms, p99 {in99:.0} ms;
   the broker alone, send -> a bare consumer beside ingest received it ({br_n} events):
   p50 {br50:.0} ms, p99 {br99:.0} ms"#
    );
    Ok(correct)
}

/// Where the CPU went per event in the `events` committed over the steady
/// `secs` (first commit -> all committed).
fn cpu_split(r: &PathRun, secs: f64, events: i64) -> String {
    let part = |p: Part| r.bulk.steady_cpu.get(&p).copied().unwrap_or(0.0);
    let us = |s: f64| s / events as f64 * 1e6;
    let (nisshi, nisshi_pg) = (part(Part::Broker), part(Part::BrokerPostgres));
    let (ingest_pg, other_pg, ingest) = (
        part(Part::IngestPostgres),
        part(Part::OtherPostgres),
        part(Part::Ingest),
    );
    let all = nisshi + nisshi_pg + ingest_pg + other_pg + ingest;
    let cores = std::thread::available_parallelism().map_or(0, |c| c.get());
    // A broker process seen on this machine has an entry, even at 0 s.
    let broker = if r.bulk.steady_cpu.contains_key(&Part::Broker) {
        format!(
            "broker {:.1} us (nisshi {:.1} + its Postgres {:.1}), ",
            us(nisshi + nisshi_pg),
            us(nisshi),
            us(nisshi_pg)
        )
    } else {
        "broker not on this machine, ".to_owned()
    };
    format!(
        "   CPU per event, first commit -> all committed: {broker}ingest's Postgres {:.1} us,\n     \
         ingest {:.1} us, rest of Postgres {:.1} us: {:.1} us in all, {:.2} of {cores} cores busy",
        us(ingest_pg),
        us(ingest),
        us(other_pg),
        us(all),
        all / secs
    )
}
