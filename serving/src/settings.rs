//! The HTTP settings every service shares, each a flag and an `HTTP_*`
//! environment variable, with the defaults in one place.

use std::time::Duration;

use clap::Args;

/// How a service's listener treats slow clients and shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Args)]
pub struct HttpSettings {
    /// Seconds a connection may take to send a complete request head; also
    /// how long a kept-alive connection may wait idle for its next request
    /// (1 to 3600). Keep a client's idle-pool timeout below it (reqwest's
    /// default is 90 s), or a request may go out on a connection being
    /// closed: hyper's `IncompleteMessage`.
    #[arg(
        long = "http-header-read-timeout-secs",
        env = "HTTP_HEADER_READ_TIMEOUT_SECS",
        value_name = "HTTP_HEADER_READ_TIMEOUT_SECS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub header_read_timeout_secs: u64,
    /// Seconds a client may take to send a request's whole body (408 after;
    /// 1 to 3600); responses have no limit.
    #[arg(
        long = "http-body-read-timeout-secs",
        env = "HTTP_BODY_READ_TIMEOUT_SECS",
        value_name = "HTTP_BODY_READ_TIMEOUT_SECS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub body_read_timeout_secs: u64,
    /// On SIGTERM or Ctrl-C, seconds in-flight responses may go on after the
    /// listener stopped accepting (0 to 3600).
    #[arg(
        long = "http-shutdown-grace-secs",
        env = "HTTP_SHUTDOWN_GRACE_SECS",
        value_name = "HTTP_SHUTDOWN_GRACE_SECS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(0..=3600)
    )]
    pub shutdown_grace_secs: u64,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            header_read_timeout_secs: 30,
            body_read_timeout_secs: 30,
            shutdown_grace_secs: 30,
        }
    }
}

impl HttpSettings {
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_secs(self.header_read_timeout_secs)
    }

    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_secs(self.body_read_timeout_secs)
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        http: HttpSettings,
    }

    #[test]
    fn defaults_match_the_default_impl() {
        let cli = Cli::try_parse_from(["x"]).map(|c| c.http);
        assert_eq!(cli.ok(), Some(HttpSettings::default()));
    }

    #[test]
    fn zero_header_timeout_is_refused_naming_the_setting() {
        let err = Cli::try_parse_from(["x", "--http-header-read-timeout-secs", "0"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("HTTP_HEADER_READ_TIMEOUT_SECS"), "{err}");
    }
}
