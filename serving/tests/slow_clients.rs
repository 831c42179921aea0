//! Slow and idle clients against a real socket: each must lose its
//! connection (or get 408) within the configured bound, while a slow
//! *response* — a long stream — is never cut.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::time::Duration;

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use serving::HttpSettings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// Far longer than any bound under test: reaching it means the server
/// held the connection.
const HUNG: Duration = Duration::from_secs(20);

fn settings() -> HttpSettings {
    HttpSettings {
        header_read_timeout_secs: 1,
        body_read_timeout_secs: 1,
        shutdown_grace_secs: 5,
    }
}

fn router() -> Router {
    Router::new()
        .route("/echo", post(|body: String| async move { body }))
        .route("/hello", get(|| async { "hello" }))
        .route(
            "/slow-stream",
            get(|| async {
                // Five chunks over ~2.5 s: longer than both read timeouts.
                let chunks = futures_util::stream::unfold(0u32, |i| async move {
                    if i == 5 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Some((Ok::<_, std::io::Error>(format!("chunk{i}\n")), i + 1))
                });
                Body::from_stream(chunks)
            }),
        )
}

async fn start() -> (
    std::net::SocketAddr,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        serving::serve(listener, router(), settings(), async {
            let _ = stopped.await;
        })
        .await
        .expect("serve");
    });
    (addr, stop, task)
}

/// Reads until the server closes the connection; what it sent.
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    tokio::time::timeout(HUNG, stream.read_to_end(&mut buf))
        .await
        .expect("the server held the connection open")
        .expect("read");
    String::from_utf8_lossy(&buf).into_owned()
}

/// Sends `request` on a new connection and reads until the server closes it.
async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request).await.expect("write");
    read_to_close(&mut s).await
}

#[tokio::test]
async fn half_sent_headers_lose_the_connection() {
    let (addr, _stop, _task) = start().await;
    let answer = exchange(addr, b"GET /hello HTTP/1.1\r\nHost: x\r\n").await;
    assert!(!answer.contains("hello"), "{answer}");
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed() {
    let (addr, _stop, _task) = start().await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    assert_eq!(read_to_close(&mut s).await, "");
}

#[tokio::test]
async fn a_partial_body_gets_408_in_the_error_shape() {
    let (addr, _stop, _task) = start().await;
    let answer = exchange(
        addr,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly ten b",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""code":"request_timeout""#), "{answer}");
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_after_its_request() {
    let (addr, _stop, _task) = start().await;
    // The answer arrives, then the connection stays idle until the bound.
    let answer = exchange(addr, b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("hello"), "{answer}");
}

#[tokio::test]
async fn a_complete_body_is_handed_to_the_handler() {
    let (addr, _stop, _task) = start().await;
    let answer = exchange(
        addr,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("hello"), "{answer}");
}

#[tokio::test]
async fn a_stream_longer_than_every_timeout_is_not_cut() {
    let (addr, _stop, _task) = start().await;
    let answer = exchange(
        addr,
        b"GET /slow-stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    for i in 0..5 {
        assert!(answer.contains(&format!("chunk{i}")), "{answer}");
    }
}

#[tokio::test]
async fn shutdown_lets_an_in_flight_stream_finish_and_refuses_new_connections() {
    let (addr, stop, task) = start().await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /slow-stream HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    // The stream has started when its headers arrive.
    let mut first = [0u8; 12];
    s.read_exact(&mut first).await.expect("headers");
    let _ = stop.send(());
    let answer = read_to_close(&mut s).await;
    assert!(answer.contains("chunk4"), "{answer}");
    tokio::time::timeout(HUNG, task)
        .await
        .expect("serve returned")
        .expect("serve task");
    assert!(TcpStream::connect(addr).await.is_err());
}
