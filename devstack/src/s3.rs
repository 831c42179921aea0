//! An S3-compatible server for the archive's tests: `s3s-fs` (crates.io,
//! the s3s project's file-system backend), built once into the cache
//! (`cargo install --locked s3s-fs --features binary`, about 3 minutes on
//! 2 cores) and never rebuilt, run privately per test on a free port of
//! 127.0.0.1 with its own directory and keys.
//!
//! What it was checked to serve of what object_store's S3 client sends for
//! the archive (s3s-fs 0.14.1): PutObject (with `If-None-Match: *` refused
//! with 412 when the key exists), GetObject with ranges (the Parquet
//! reader's footer and row-group reads), HeadObject, ListObjectsV2,
//! DeleteObject, and multipart uploads (CreateMultipartUpload, UploadPart,
//! CompleteMultipartUpload, AbortMultipartUpload). Buckets are directories
//! of its root; [`PrivateS3::start`] creates the one it hands out.

use std::path::PathBuf;
use std::time::Duration;

use crate::cached_install::{self, CachedCrate};
use crate::error::{DevstackError, Result};
use crate::health::{free_port, wait_tcp};
use crate::process::{Service, Spec};

/// The s3s-fs version the tests run (`S3S_FS_VERSION` overrides it); the
/// newest that builds with this workspace's Rust.
pub const DEFAULT_VERSION: &str = "0.14.1";

/// The bucket a private server is started with.
pub const BUCKET: &str = "meterline";

/// The cached server binary, building it first if it is not there.
pub fn ensure_binary() -> Result<PathBuf> {
    let version = std::env::var("S3S_FS_VERSION").unwrap_or_else(|_| DEFAULT_VERSION.into());
    cached_install::ensure(CachedCrate {
        krate: "s3s-fs",
        version: &version,
        install_args: &["--features", "binary"],
        what: "the S3 server",
        takes: "a few minutes",
    })
}

/// An S3-compatible server of one test's own; killed, and its files
/// removed, when the handle is dropped.
pub struct PrivateS3 {
    service: Service,
    port: u16,
    _dir: tempfile::TempDir,
}

/// The keys a private server accepts.
const ACCESS_KEY: &str = "meterline-test";
const SECRET_KEY: &str = "meterline-test-secret";

impl PrivateS3 {
    /// Starts a server with bucket [`BUCKET`] and waits until it accepts connections.
    pub async fn start() -> Result<Self> {
        let bin = ensure_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("meterline-s3-")
            .tempdir()
            .map_err(DevstackError::io("a temporary directory for an S3 server"))?;
        let data = dir.path().join("data");
        let bucket = data.join(BUCKET);
        std::fs::create_dir_all(&bucket)
            .map_err(DevstackError::io(bucket.display().to_string()))?;
        let port = free_port()?;
        let spec = Spec::new("private s3", bin, dir.path().join("s3s-fs.log"))
            .args(["--host", "127.0.0.1", "--port"])
            .args([port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .args([data.display().to_string()])
            .envs([
                ("RUST_LOG", "warn".to_owned()),
                ("NO_COLOR", "1".to_owned()),
            ])
            .cwd(dir.path());
        let mut s3 = Self {
            service: Service::spawn(spec)?,
            port,
            _dir: dir,
        };
        let addr = format!("127.0.0.1:{port}");
        wait_tcp(
            "private s3",
            &addr,
            Some(&mut s3.service),
            Duration::from_secs(30),
        )
        .await?;
        Ok(s3)
    }

    /// The endpoint, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// An `ARCHIVE_URL` under `prefix` in the bucket.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    /// The `AWS_*` variables a client of this server needs.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".to_owned()),
            ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// Its log so far.
    pub fn log_tail(&self) -> String {
        self.service.log_tail()
    }
}
