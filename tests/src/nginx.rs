//! nginx in front of several gateways, as a child process of the test
//! ([`Nginx::start`]): foreground (`daemon off;`), its pid file, logs and
//! temporary files all in the test's directory, listening on a free port of
//! 127.0.0.1, so it needs no root paths and no port 80, and it dies with
//! the test ([`Service`] kills its process group when dropped).
//!
//! What the generated configuration retries, and why billing stays exact:
//!
//! ```nginx
//! upstream gateways {
//!     server 127.0.0.1:PORT max_fails=1 fail_timeout=2s;   # one per gateway
//! }
//! proxy_next_upstream error timeout;
//! proxy_next_upstream_timeout 10s;
//! ```
//!
//! - `non_idempotent` is **off** (nginx's default), so a
//!   `POST /v1/chat/completions` goes to the next gateway only when nginx
//!   has not sent a byte of it: connection refused (a gateway that stopped
//!   accepting at the end of its `GATEWAY_DRAIN_DELAY_MS`, or is not up
//!   yet), a reset or error while connecting, or no connection within
//!   `proxy_connect_timeout`. That gateway never read the request, so it
//!   cannot have admitted or billed it.
//! - Once the request was sent, a POST is never retried: a reset, a read
//!   error or a read timeout then leaves the client with nginx's 502/504,
//!   because the gateway may already have admitted the request and written
//!   its usage event (a crash right after the outbox append), and a second
//!   gateway would bill it again. Nor is anything retried once the response
//!   head has gone to the client (nginx cannot).
//! - `non_idempotent` is all or nothing: it would extend every listed
//!   condition, `error` and `timeout` included, to POSTs already sent, so it
//!   is not used even though some 503s would be safe to retry. None of the
//!   gateway's 502/503/504 answers is retried: its 503s (`draining`,
//!   `no_capacity`, `usage_not_recorded`, `retry_budget_exhausted`) and its
//!   502 (engine upstream failed) come with no usage event, but its 504
//!   (request timeout) is billed; a listed `http_503` also counts as a
//!   failure (with `max_fails=1` a gateway at capacity would be taken out
//!   for 2 s) and would carry a shed retry past the retry budget to the next
//!   gateway; and the gateway answers `draining` only on `/readyz`, never on
//!   a chat request, so `http_503` would buy the drain nothing. Idempotent
//!   methods (`GET /v1/models`) are retried on `error` and `timeout` also
//!   after they were sent; they bill nothing.
//! - `max_fails=1 fail_timeout=2s`: one refused connection takes a gateway
//!   out for 2 s (then nginx tries it again with one request). Open-source
//!   nginx has no active health checks and never reads `/readyz`: the drain
//!   works because a draining gateway still accepts and answers for
//!   `GATEWAY_DRAIN_DELAY_MS`, and from the moment it stops accepting every
//!   connection nginx tries is refused, so retried on the next gateway.
//! - No `keepalive` in the upstream block: every request opens a connection
//!   of its own. A kept-alive connection that the gateway closes (idle for
//!   `HTTP_HEADER_READ_TIMEOUT_SECS`, or at shutdown) while nginx reuses it
//!   fails a POST that was already sent, which is not retried (above).
//!
//! Streams pass through unbuffered (`proxy_buffering off`, HTTP/1.1 with an
//! empty `Connection` header), and `proxy_read_timeout` is one hour, above
//! the gateway's `GATEWAY_REQUEST_TIMEOUT_SECS` (600 s by default), so
//! the gateway, not nginx, ends a long request (billed, 504 or an error
//! chunk). Request bodies are buffered (the default): a retry can send the
//! body again.

use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use devstack::process::Spec;

use crate::process::{free_port, wait_healthy};
use crate::Service;

/// Where the nginx binary usually is (Debian's `nginx-light` / `nginx`).
const NGINX: &str = "/usr/sbin/nginx";

/// A running nginx in front of gateways.
#[derive(Debug)]
pub struct Nginx {
    service: Service,
    url: String,
    dir: PathBuf,
}

impl Nginx {
    /// Writes `dir/nginx.conf` for `upstreams` (each `host:port`), starts
    /// nginx on a free port of 127.0.0.1 and waits until it answers. Panics
    /// when nginx is not installed, naming `scripts/ensure-tools.sh`.
    pub async fn start(dir: &Path, upstreams: &[String]) -> Self {
        assert!(!upstreams.is_empty(), "nginx needs at least one upstream");
        let program = binary();
        let dir = dir.join("nginx");
        for sub in ["", "temp"] {
            std::fs::create_dir_all(dir.join(sub))
                .unwrap_or_else(|e| panic!("create {}: {e}", dir.join(sub).display()));
        }
        let port = free_port();
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config(&dir, port, upstreams))
            .unwrap_or_else(|e| panic!("write {}: {e}", conf.display()));
        let spec = Spec::new("nginx", program, dir.join("nginx.log")).args([
            "-p".into(),
            dir.clone().into_os_string(),
            "-c".into(),
            conf.into_os_string(),
            // Before the configuration is read, nginx logs to its compiled-in
            // path (/var/log/nginx) unless told otherwise.
            "-e".into(),
            dir.join("error.log").into_os_string(),
        ]);
        let mut service = Service::spawn(spec).unwrap_or_else(|e| panic!("{e}"));
        let url = format!("http://127.0.0.1:{port}");
        wait_healthy(
            &format!("{url}/nginx-alive"),
            &mut service,
            Duration::from_secs(20),
        )
        .await;
        Self { service, url, dir }
    }

    /// The base URL clients use (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The access log's lines: `status upstream_addr upstream_status
    /// request_time method uri`; a retried request lists each gateway tried
    /// (`127.0.0.1:A, 127.0.0.1:B`).
    pub fn access_log(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("access.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The last lines of nginx's error log (upstream failures and retries
    /// are logged there, at `warn` and `error`).
    pub fn error_log_tail(&self) -> String {
        devstack::process::log_tail(&self.dir.join("error.log"), 40)
    }

    /// The nginx process.
    pub fn service(&mut self) -> &mut Service {
        &mut self.service
    }
}

/// `/usr/sbin/nginx`, else `nginx` on `PATH`; panics naming the fix.
fn binary() -> PathBuf {
    if Path::new(NGINX).exists() {
        return PathBuf::from(NGINX);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("nginx"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "nginx is not installed (neither {NGINX} nor nginx on PATH); \
                 run scripts/ensure-tools.sh (Debian: apt-get install -y nginx-light)"
            )
        })
}

/// The configuration: nginx in the foreground with every path under
/// `dir`, listening on 127.0.0.1:`port`, proxying to `upstreams`.
pub fn config(dir: &Path, port: u16, upstreams: &[String]) -> String {
    let d = dir.display();
    // Workers of a master started as root run as `nobody` unless told
    // otherwise, and could not write the temporary files under `dir`.
    let owned_by_root = std::fs::metadata(dir).is_ok_and(|m| m.uid() == 0);
    let user = if owned_by_root { "user root;\n" } else { "" };
    let mut servers = String::new();
    for upstream in upstreams {
        let _ = writeln!(
            servers,
            "        server {upstream} max_fails=1 fail_timeout=2s;"
        );
    }
    format!(
        r#"# Generated by tests/src/nginx.rs; see its docs for what is retried and why.
daemon off;
master_process on;
worker_processes 1;
{user}pid {d}/nginx.pid;
error_log {d}/error.log info;

events {{
    worker_connections 1024;
}}

http {{
    log_format upstreams '$status $upstream_addr $upstream_status $request_time $request_method $uri';
    access_log {d}/access.log upstreams;
    client_body_temp_path {d}/temp/client_body;
    proxy_temp_path {d}/temp/proxy;
    fastcgi_temp_path {d}/temp/fastcgi;
    uwsgi_temp_path {d}/temp/uwsgi;
    scgi_temp_path {d}/temp/scgi;

    upstream gateways {{
{servers}    }}

    server {{
        listen 127.0.0.1:{port};
        # Above the gateway's own body limit, so it answers in OpenAI's shape.
        client_max_body_size 8m;

        location = /nginx-alive {{
            access_log off;
            return 200 "ok\n";
        }}

        location / {{
            proxy_pass http://gateways;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            # Streams reach the client frame by frame.
            proxy_buffering off;
            proxy_connect_timeout 2s;
            proxy_send_timeout 60s;
            proxy_read_timeout 3600s;
            # Only what was never sent to a gateway: non_idempotent stays off.
            proxy_next_upstream error timeout;
            proxy_next_upstream_timeout 10s;
        }}
    }}
}}
"#
    )
}
