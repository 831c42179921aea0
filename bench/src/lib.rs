//! Shared pieces of the benchmark binaries in `src/bin/`. Each benchmark
//! prints its figures next to a baseline measured in the same run (never a
//! test: the machines are shared and noisy); what more than one of them
//! needs is written once here.
//!
//! Layout:
//! - [`database`]: a fresh database on the stack's Postgres, with the schema,
//!   dropped at the end (or kept with `--keep`);
//! - [`service`]: a Meterline service binary, found next to the benchmark's
//!   own executable in `target/<profile>/`, as a child process: started
//!   with its log in a file, watched, stopped with SIGTERM or killed;
//! - [`produce`]: producing usage events to a topic, one delivery future per
//!   message, waiting while librdkafka's queue is full;
//! - [`percentiles`]: latency samples read at quantiles (nearest rank);
//! - [`prometheus`]: values and histogram quantiles from `/metrics` text;
//! - [`procfs`]: a process's CPU time and memory from `/proc`.
//!
//! The benchmarks need Postgres (`DATABASE_URL`) and most need the broker
//! (`KAFKA_BROKERS`): `scripts/stack.sh up` and `. .stack/env`. Those that
//! start a service binary need it built in the same profile
//! (`cargo build --release -p bench -p ingest -p gateway-lite`).

pub mod database;
pub mod percentiles;
pub mod procfs;
pub mod produce;
pub mod prometheus;
pub mod service;
