//! The harness for end-to-end tests: a fresh database and topic per test,
//! Meterline's binaries started as real processes (and killed with
//! SIGKILL when a test says so), and helpers to produce and count.
//!
//! Tests find Postgres through `DATABASE_URL` and the broker through
//! `KAFKA_BROKERS` (`scripts/test.sh` brings both up and sets them), and
//! the binaries next to the test executable (`cargo build --bins` first).

pub mod billing;
pub mod events;
pub mod process;
pub mod stack;

pub use process::Service;
pub use stack::TestStack;
pub mod gateway;
