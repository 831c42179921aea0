//! The settings reference, generated. Every Meterline binary declares its
//! settings once, as a clap argument with an environment variable, a
//! default and a doc comment; this crate renders those declarations into
//! `docs/settings.md`, so the manual cannot document a setting no code
//! reads, or a default the code does not have.
//!
//! - [`binaries`]: each binary's command, from its own crate.
//! - [`direct`]: the few variables read without clap (the dev stack, the
//!   test harness, the scripts), each listed once by hand — the drift test
//!   finds every such read in the sources and fails on one missing here.
//! - [`render`]: the Markdown.
//!
//! `cargo run -p settings-doc` writes the file; `-- --check` exits 1 when
//! it differs from what the code generates (the test suite checks the
//! same, in `tests/drift.rs`).

pub mod binaries;
pub mod direct;
pub mod render;

/// Where the reference lives, relative to the workspace root.
pub const PATH: &str = "docs/settings.md";

/// The reference as the code declares it today.
pub fn generate() -> String {
    render::document(&binaries::all(), direct::ALL)
}

/// The workspace root (this crate's parent directory).
pub fn workspace_root() -> std::path::PathBuf {
    // The crate sits one level below the workspace root.
    std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}
