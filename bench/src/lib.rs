//! Shared pieces of the benchmark binaries.
