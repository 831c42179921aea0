//! The one error type of the dev stack: every variant names what did not
//! work (the service, the binary, the setting, the URL) and what to do.

use std::path::PathBuf;
use std::time::Duration;

/// Why the dev stack could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum DevstackError {
    /// A service did not become healthy in time.
    #[error("{what} did not come up within {within:?} ({check}){log}")]
    NotUp {
        what: String,
        check: String,
        within: Duration,
        /// The last lines of its log, prefixed with a newline, or empty.
        log: String,
    },
    /// A service exited while it was being waited for.
    #[error("{what} exited ({status}) before it was ready{log}")]
    Exited {
        what: String,
        status: String,
        log: String,
    },
    /// A program could not be started at all.
    #[error("cannot start {what} ({}): {source}", program.display())]
    Spawn {
        what: String,
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A tool the stack needs is not installed and could not be installed.
    #[error("{tool} not found; {fix}")]
    Missing { tool: String, fix: String },
    /// A setting (an environment variable) has a value that cannot work.
    #[error("{setting}: {problem}")]
    Setting { setting: String, problem: String },
    /// Talking to a Postgres server failed.
    #[error("postgres at {at}: {source}")]
    Postgres {
        at: String,
        #[source]
        source: sqlx::Error,
    },
    /// Applying Meterline's migrations to a fresh database failed.
    #[error("migrating {database}: {source}")]
    Migrate {
        database: String,
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    /// Talking to a Kafka broker failed.
    #[error("kafka broker at {brokers}: {source}")]
    Kafka {
        brokers: String,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// The broker refused a topic operation.
    #[error("the broker refused to {operation} topic {topic}: {code}")]
    TopicRefused {
        operation: &'static str,
        topic: String,
        code: rdkafka::types::RDKafkaErrorCode,
    },
    /// A command the stack runs (initdb, cargo install, apt-get) failed.
    #[error("{command} failed: {detail}")]
    Command { command: String, detail: String },
    /// A file or directory of the stack could not be read or written.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Another port or process is in the way.
    #[error("{0}")]
    Conflict(String),
}

/// The dev stack's result.
pub type Result<T, E = DevstackError> = std::result::Result<T, E>;

impl DevstackError {
    /// An I/O error on `what` (a path, a file's purpose).
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }

    /// A Postgres error at `at` (a redacted URL or host:port).
    pub(crate) fn pg(at: impl Into<String>) -> impl FnOnce(sqlx::Error) -> Self {
        let at = at.into();
        move |source| Self::Postgres { at, source }
    }
}
