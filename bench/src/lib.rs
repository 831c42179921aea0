//! Shared pieces of the benchmark binaries in `src/bin/`. Each benchmark
//! prints its figures next to a baseline measured in the same run (never a
//! test: the machines are shared and noisy); what more than one of them
//! needs is written once here, and what the tests and the demo need too
//! comes from elsewhere:
//! - fresh databases (migrated, dropped with their handle, kept with a
//!   bench's `--keep`), fresh topics, service binaries as child processes,
//!   free ports and health waits are the `devstack` crate's;
//! - usage events of the five reference tenants come from the `workload`
//!   crate's generator.
//!
//! Layout:
//! - [`produce`]: producing usage events to a topic, one delivery future per
//!   message, waiting while librdkafka's queue is full;
//! - [`percentiles`]: latency samples read at quantiles (nearest rank);
//! - [`prometheus`]: values and histogram quantiles from `/metrics` text;
//! - [`procfs`]: a process's CPU time and memory from `/proc`;
//! - [`check_running`]: fail, with the end of its log, if a service a
//!   benchmark is measuring has exited.
//!
//! The benchmarks need Postgres (`DATABASE_URL`) and most need the broker
//! (`KAFKA_BROKERS`): `scripts/stack.sh up` and `. .stack/env`. Those that
//! start a service binary need it built in the same profile, next to the
//! benchmark in `target/<profile>/`
//! (`cargo build --release -p bench -p ingest -p gateway-lite`).

pub mod percentiles;
pub mod procfs;
pub mod produce;
pub mod prometheus;
