//! The local stack, in one place, for the tests, the benchmarks and the
//! demo: the shared services they run against, fresh databases and topics
//! that are dropped when a run ends, private instances for the tests that
//! crash a dependency, and Meterline's binaries as processes by handle.
//!
//! Layout:
//! - [`stack`]: the shared stack `devstack up|down|status|env` manages
//!   (Postgres, the Nisshi broker and its topic, Redis) and `.stack/env`;
//! - [`postgres`]: the shared server's URL, clusters of our own from
//!   `initdb` (the project-local one, and those of private instances);
//! - [`private_postgres`]: a [`PrivatePostgres`] for a test that crashes it;
//! - [`database`]: a fresh, migrated database per run ([`Database`]);
//! - [`topic`]: creating and deleting topics, a fresh one per run ([`Topic`]);
//! - [`cached_install`]: tools built once from crates.io into a cache
//!   outside the checkout (the broker, the S3 server), under a lock;
//! - [`nisshi`]: the broker's binary, built once into a cache, and a
//!   [`PrivateBroker`];
//! - [`redis`]: the shared Redis and a [`PrivateRedis`];
//! - [`s3`]: an S3-compatible server (s3s-fs, built once into the cache)
//!   per test, a [`PrivateS3`];
//! - [`process`]: [`Service`], a child process by handle (start, SIGTERM,
//!   SIGKILL with its process group, restart), the workspace's binaries;
//! - [`detached`]: processes that outlive their starter, found by pid file;
//! - [`health`]: waiting for a service, with an error naming what did not
//!   come up; free ports.
//!
//! Invariants: nothing here finds or kills a process by name; a test never
//! stops, kills or restarts the shared services (it gets a private
//! instance); every database and topic made for a run is dropped with its
//! handle, even when the test panics.

pub mod cached_install;
pub mod cli;
pub mod database;
pub mod detached;
pub mod error;
pub mod health;
pub mod nisshi;
pub mod postgres;
pub mod private_postgres;
pub mod process;
pub mod redis;
pub mod s3;
pub mod stack;
pub mod topic;

pub use database::Database;
pub use error::{DevstackError, Result};
pub use nisshi::PrivateBroker;
pub use private_postgres::PrivatePostgres;
pub use process::Service;
pub use redis::PrivateRedis;
pub use s3::PrivateS3;
pub use topic::Topic;
