//! The harness for end-to-end tests, on the dev stack (crate `devstack`):
//! a fresh database and topic per test, dropped when the test ends; private
//! Postgres and broker instances for the tests that crash them
//! ([`stack::Private`]); Meterline's binaries started as real processes
//! (and SIGKILLed when a test says so), the `engine` binary with a signed
//! identity ([`engine`]); helpers to produce and count; headless Chromium
//! over WebDriver for billing-api's pages ([`browser`]).
//!
//! Tests find the shared Postgres through `DATABASE_URL` and the broker
//! through `KAFKA_BROKERS` (`scripts/test.sh` brings the stack up and sets
//! them), and the binaries next to the test executable (`cargo build
//! --bins` first). No test stops, kills or restarts a shared service, so
//! test binaries run in parallel.

pub mod archive;
pub mod billing;
pub mod browser;
pub mod engine;
pub mod events;
pub mod process;
pub mod stack;

pub use process::Service;
pub use stack::TestStack;
pub mod gateway;
pub mod nginx;
