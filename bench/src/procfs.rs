//! A process's CPU time and memory, read from `/proc` (Linux).

/// A `/proc/<pid>/status` field in KiB; `field` with its colon (`VmRSS:`,
/// `VmHWM:`).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix(field))?;
    line.trim().trim_end_matches("kB").trim().parse().ok()
}

/// User + system CPU seconds of a process (Linux clock ticks are 1/100 s).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(status_kib(me, "VmRSS:").is_some_and(|kib| kib > 0));
        assert!(cpu_seconds(me).is_some_and(|s| s >= 0.0));
        assert_eq!(status_kib(me, "NoSuchField:"), None);
    }
}
