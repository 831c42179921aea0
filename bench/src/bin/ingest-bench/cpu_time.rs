//! Who used the machine's CPU while ingest ran: ingest itself, the broker
//! (the nisshi process and the Postgres backends serving its database), the
//! Postgres backends of ingest's database, and the rest of Postgres (WAL
//! writer, checkpointer, other databases). Read from `/proc`, so
//! a broker on another machine shows as absent, and a backend that exited
//! between two samples is not counted.

use std::collections::HashMap;

use bench::procfs::cpu_seconds;

/// CPU seconds per process, by the part of the pipeline it belongs to.
#[derive(Debug, Default, Clone)]
pub(crate) struct Sample {
    by_pid: HashMap<u32, (Part, f64)>,
}

/// A part of the pipeline on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Part {
    Ingest,
    Broker,
    BrokerPostgres,
    IngestPostgres,
    OtherPostgres,
}

impl Sample {
    /// Reads the ingest processes and every process of the broker and
    /// Postgres. `ingest_db` is the database ingest writes to.
    pub(crate) fn take(ingest_db: &str, ingest_pids: &[u32]) -> Self {
        let mut by_pid = HashMap::new();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Self::default();
        };
        let procs: Vec<(u32, String)> = dir
            .filter_map(|e| {
                let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                Some((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")))
            })
            .collect();
        let broker_db = procs.iter().find_map(|(_, cmd)| broker_database(cmd));
        for (pid, cmd) in &procs {
            let part = if ingest_pids.contains(pid) {
                Part::Ingest
            } else if let Some(part) = classify(cmd, broker_db.as_deref(), ingest_db) {
                part
            } else {
                continue;
            };
            if let Some(cpu) = cpu_seconds(*pid) {
                by_pid.insert(*pid, (part, cpu));
            }
        }
        Self { by_pid }
    }

    /// CPU seconds each part used since `before` (a process started since
    /// counts all of its CPU time).
    pub(crate) fn since(&self, before: &Sample) -> HashMap<Part, f64> {
        let mut used = HashMap::new();
        for (pid, (part, cpu)) in &self.by_pid {
            let earlier = before.by_pid.get(pid).map_or(0.0, |(_, c)| *c);
            *used.entry(*part).or_insert(0.0) += cpu - earlier;
        }
        used
    }
}

fn is_broker(cmd: &str) -> bool {
    cmd.contains("nisshi") && cmd.contains(" broker ")
}

/// The database a nisshi broker keeps its log in: it is started with
/// `--storage-engine postgres://…/<db>?…`.
fn broker_database(cmd: &str) -> Option<String> {
    if !is_broker(cmd) {
        return None;
    }
    let url = cmd
        .split_whitespace()
        .find(|w| w.starts_with("postgres://"))?;
    let path = url.rsplit_once('/')?.1;
    Some(path.split('?').next()?.to_owned())
}

/// Which part a process with this command line belongs to, if any.
fn classify(cmd: &str, broker_db: Option<&str>, ingest_db: &str) -> Option<Part> {
    if is_broker(cmd) {
        return Some(Part::Broker);
    }
    // A backend's title: `postgres: <cluster>: <user> <database> <client> <state>`;
    // background processes have no database there.
    let title = cmd.strip_prefix("postgres: ")?;
    Some(match title.split_whitespace().nth(2) {
        Some(db) if Some(db) == broker_db => Part::BrokerPostgres,
        Some(db) if db == ingest_db => Part::IngestPostgres,
        _ => Part::OtherPostgres,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NISSHI: &str = "/root/.cache/meterline/nisshi-0.8.1/bin/nisshi broker --storage-engine \
        postgres://postgres:postgres@127.0.0.1:5432/nisshi?sslmode=disable --listener-url \
        tcp://127.0.0.1:9092 ";

    #[test]
    fn finds_the_brokers_database_in_its_command_line() {
        assert_eq!(broker_database(NISSHI).as_deref(), Some("nisshi"));
        assert_eq!(broker_database("/usr/bin/postgres -D /var/lib/x "), None);
    }

    #[test]
    fn tells_backends_apart_by_database() {
        fn part(cmd: &str) -> Option<Part> {
            classify(cmd, Some("nisshi"), "mt_ingest_bench_0a1b2c3d4e")
        }
        assert_eq!(part(NISSHI), Some(Part::Broker));
        let backend = |db: &str| format!("postgres: 15/main: postgres {db} 127.0.0.1(54406) idle");
        assert_eq!(part(&backend("nisshi")), Some(Part::BrokerPostgres));
        assert_eq!(
            part(&backend("mt_ingest_bench_0a1b2c3d4e")),
            Some(Part::IngestPostgres)
        );
        assert_eq!(part(&backend("meterline")), Some(Part::OtherPostgres));
        assert_eq!(
            part("postgres: 15/main: walwriter "),
            Some(Part::OtherPostgres)
        );
        assert_eq!(part("target/release/ingest-bench --processes 2 "), None);
    }
}
