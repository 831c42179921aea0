//! A service's `/metrics` (Prometheus text format), and values read from it.

use std::net::SocketAddr;

use anyhow::Result;

/// The text a service's metrics endpoint at `addr` answers on `/metrics`.
pub async fn scrape(addr: SocketAddr) -> Result<String> {
    let res = reqwest::get(format!("http://{addr}/metrics")).await?;
    Ok(res.error_for_status()?.text().await?)
}

/// A sample's value (`name` may include labels: `name{le="0.5"}`); NaN if
/// absent.
pub fn metric(text: &str, name: &str) -> f64 {
    let value = |l: &str| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok();
    text.lines().find_map(value).unwrap_or(f64::NAN)
}

/// The upper bound of the histogram bucket that holds quantile `q` of
/// `name` (`name_bucket{le="…"}` lines, cumulative; infinite if it is the
/// `+Inf` bucket); NaN without samples.
pub fn bucket_quantile(text: &str, name: &str, q: f64) -> f64 {
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let (le, count) = l.strip_prefix(&prefix)?.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    let total = buckets.last().map_or(0.0, |b| b.1);
    if total == 0.0 {
        return f64::NAN;
    }
    buckets
        .iter()
        .find(|(_, cumulative)| *cumulative >= q * total)
        .map_or(f64::NAN, |(le, _)| *le)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE commit_seconds histogram
commit_seconds_bucket{le=\"0.005\"} 0
commit_seconds_bucket{le=\"0.01\"} 90
commit_seconds_bucket{le=\"0.05\"} 99
commit_seconds_bucket{le=\"+Inf\"} 100
commit_seconds_sum 0.9
commit_seconds_count 100
";

    #[test]
    fn reads_a_sample_by_its_exact_name() {
        assert_eq!(metric(TEXT, "commit_seconds_count"), 100.0);
        assert_eq!(metric(TEXT, "commit_seconds_bucket{le=\"0.01\"}"), 90.0);
        assert!(metric(TEXT, "commit_seconds").is_nan());
    }

    #[test]
    fn a_quantile_reads_as_its_buckets_upper_bound() {
        assert_eq!(bucket_quantile(TEXT, "commit_seconds", 0.5), 0.01);
        assert_eq!(bucket_quantile(TEXT, "commit_seconds", 0.99), 0.05);
        assert_eq!(bucket_quantile(TEXT, "commit_seconds", 1.0), f64::INFINITY);
        assert!(bucket_quantile("", "commit_seconds", 0.5).is_nan());
    }
}
