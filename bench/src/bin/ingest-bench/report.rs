//! The printed table, and the check that ingest's result is right.

use std::time::Duration;

use anyhow::{ensure, Result};
use bench::percentiles::Percentiles;
use bench::prometheus::{bucket_quantile, metric};

use crate::cpu_time::Part;
use crate::freshness::Fresh;
use crate::processes::Bulk;
use crate::{Args, FRESH_LINGER_MS, PARTITIONS};

/// Everything the report is made of.
pub(crate) struct Measured {
    pub(crate) load: String,
    pub(crate) produce: Duration,
    pub(crate) read: Duration,
    pub(crate) copy: Duration,
    pub(crate) transactions: Duration,
    pub(crate) bulk: Bulk,
    /// `/metrics` of each ingest process.
    pub(crate) metrics: Vec<String>,
    /// request_log rows, usage_hourly requests, dead letters.
    pub(crate) checks: (i64, i64, i64),
    pub(crate) hwm_kib: u64,
    pub(crate) fresh: Fresh,
}

/// Prints the table; fails if ingest's result is wrong.
pub(crate) fn report(args: &Args, r: &Measured) -> Result<()> {
    let n = args.events;
    let secs = |d: Duration| d.as_secs_f64();
    let (read_s, copy_s, total_s) = (secs(r.read), secs(r.copy), secs(r.bulk.total));
    let tx_s = secs(r.transactions);
    let rate = |s: f64| n as f64 / s;
    let (read_r, copy_r, total_r) = (rate(read_s), rate(copy_s), rate(total_s));
    let tx_r = rate(tx_s);
    let steady_s = secs(r.bulk.total - r.bulk.first);
    let steady_r = (n as i64 - r.bulk.at_first) as f64 / steady_s;
    let (vs_read, vs_copy, vs_tx) = (steady_r / read_r, steady_r / copy_r, steady_r / tx_r);
    let tx_vs_copy = tx_r / copy_r;
    let (produce_r, first_s, at_first) =
        (rate(secs(r.produce)), secs(r.bulk.first), r.bulk.at_first);
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
    let (fresh_n, per_s) = (fresh.len(), args.rate);
    let own_cpu = 100.0 * r.fresh.cpu_s / r.fresh.secs;
    let cpu_split = cpu_split(r, steady_s, n as i64 - at_first);
    let cores = std::thread::available_parallelism().map_or(0, |c| c.get());
    let (max_batch, linger_ms) = (args.max_batch, args.linger_ms);
    let sync = args.synchronous_commit;
    let load = r.load.split_whitespace().next().unwrap_or("?");
    let order = args.order;
    println!(
        r#"
== ingest benchmark: {n} events, {PARTITIONS} partitions, {cores} cores (nproc), load {load} at start
   request ids in {order:?} order (--order)
   ingest: {procs} process(es) in one group (--processes), INGEST_MAX_BATCH={max_batch}, INGEST_LINGER_MS={linger_ms}, INGEST_SYNCHRONOUS_COMMIT={sync:?}
   produce (idempotent, acks=all, lz4, linger 5 ms): {produce_r:.0} events/s (informational)

                                            seconds    events/s   ingest/ceiling
   (a) broker read ceiling                {read_s:>9.2} {read_r:>11.0} {vs_read:>16.2}
   (b) raw COPY ceiling, no indexes       {copy_s:>9.2} {copy_r:>11.0} {vs_copy:>16.2}
   (c) ingest's transactions alone        {tx_s:>9.2} {tx_r:>11.0} {vs_tx:>16.2}
   ingest, process start -> all committed {total_s:>9.2} {total_r:>11.0}
   ingest, first commit -> all committed  {steady_s:>9.2} {steady_r:>11.0}
   (the first commit came {first_s:.2} s after start, covering {at_first} events;
    ingest/ceiling uses the first-commit rate)
   (a), (b), (c): {procs} reader(s) / connection(s), each on its share of the partitions;
   (c) is (b) x {tx_vs_copy:.2}: ingest's own transactions for these events, batches of
    {max_batch} decoded beforehand, on {procs} connection(s), with no broker

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
    this load generator used {own_cpu:.0}% of one core meanwhile)"#
    );
    ensure!(correct, "ingest's result is wrong (see above)");
    Ok(())
}

/// Where the CPU went per event in the `events` committed over the steady
/// `secs` (first commit -> all committed).
fn cpu_split(r: &Measured, secs: f64, events: i64) -> String {
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
