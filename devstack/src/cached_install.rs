//! Tools the stack builds once from crates.io into a cache outside the
//! checkout and never rebuilds: `cargo install --locked <crate> --version
//! <v> --root <cache>/<crate>-<v>`, under a file lock so two callers never
//! build the same tool twice, with the build's output kept in a log whose
//! tail a failure quotes. The broker ([`crate::nisshi`]) and the S3
//! server ([`crate::s3`]) are built this way.

use std::path::PathBuf;
use std::process::Command;

use crate::error::{DevstackError, Result};
use crate::process;

/// The cache tools are built into: `METERLINE_CACHE`, else
/// `~/.cache/meterline`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("METERLINE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/meterline")
        })
}

/// One tool built with `cargo install`.
#[derive(Debug, Clone, Copy)]
pub struct CachedCrate<'a> {
    /// The crate, which is also the binary's name.
    pub krate: &'a str,
    pub version: &'a str,
    /// `cargo install` arguments beyond `--locked <crate> --version <v>
    /// --root <dir>` (features, `--ignore-rust-version`).
    pub install_args: &'a [&'a str],
    /// What the tool is, for errors ("the broker").
    pub what: &'a str,
    /// How long a build takes, for the warning ("about 17 minutes").
    pub takes: &'a str,
}

/// The cached binary, building it first if it is not there.
pub fn ensure(tool: CachedCrate<'_>) -> Result<PathBuf> {
    let CachedCrate { krate, version, .. } = tool;
    let cache = cache_dir();
    let root = cache.join(format!("{krate}-{version}"));
    let bin = root.join("bin").join(krate);
    if bin.exists() {
        return Ok(bin);
    }
    std::fs::create_dir_all(&cache).map_err(DevstackError::io(cache.display().to_string()))?;
    let lock_path = cache.join(format!("{krate}-build.lock"));
    let lock = std::fs::File::create(&lock_path)
        .map_err(DevstackError::io(lock_path.display().to_string()))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| DevstackError::io(lock_path.display().to_string())(e.into()))?;
    if bin.exists() {
        return Ok(bin);
    }
    let log = cache.join(format!("{krate}-build.log"));
    tracing::warn!(
        "building {krate} {version} once into {} ({}; log: {})",
        cache.display(),
        tool.takes,
        log.display()
    );
    let out = std::fs::File::create(&log).map_err(DevstackError::io(log.display().to_string()))?;
    let err = out
        .try_clone()
        .map_err(DevstackError::io(log.display().to_string()))?;
    let status = Command::new("cargo")
        .args(["install", "--locked", krate, "--version", version])
        .args(tool.install_args)
        .arg("--root")
        .arg(&root)
        .stdout(out)
        .stderr(err)
        .status()
        .map_err(|source| DevstackError::Spawn {
            what: format!("{}'s build", tool.what),
            program: "cargo".into(),
            source,
        })?;
    if !status.success() || !bin.exists() {
        return Err(DevstackError::Command {
            command: format!("cargo install {krate} {version}"),
            detail: format!(
                "{status}; the last lines of {}:\n{}",
                log.display(),
                process::log_tail(&log, 30)
            ),
        });
    }
    Ok(bin)
}
