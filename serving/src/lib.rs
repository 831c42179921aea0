//! How every Meterline service serves HTTP and how every binary stops.
//!
//! `axum::serve` leaves three things to the caller that a metering edge
//! cannot do without, so every listener (gateway, engine, billing-api, the
//! ingest and archiver metrics ports) goes through [`serve`] instead:
//!
//! - **No-delay sockets.** A response written in several pieces (SSE
//!   chunks, or a body after its headers) otherwise waits for the client's
//!   delayed ACK: ~40 ms added to every streamed response on Linux.
//! - **Read timeouts.** A client that sends half its headers, or announces
//!   a body and sends part of it, would hold a connection forever. Headers
//!   must arrive within [`HttpSettings::header_read_timeout`] — hyper's
//!   timer for it also runs while a kept-alive connection waits for its next
//!   request, so the same bound closes idle keep-alive connections — and a
//!   request body within [`HttpSettings::body_read_timeout`] (408 otherwise).
//!   The response has no time limit: a 600 s stream is not cut.
//! - **One graceful shutdown.** [`shutdown_signal`] resolves on SIGTERM or
//!   Ctrl-C; [`serve`] then stops accepting, lets in-flight responses finish
//!   for up to [`HttpSettings::shutdown_grace`], and returns.
//!
//! Layout:
//! - [`settings`]: the typed, validated settings (`HTTP_*` variables).
//! - [`server`]: the accept loop and per-connection HTTP/1.1 setup.
//! - [`body`]: the request-body read timeout, as a middleware.
//! - [`shutdown`]: the signal every binary stops on.

pub mod body;
pub mod server;
pub mod settings;
pub mod shutdown;

pub use server::{serve, ServeError};
pub use settings::HttpSettings;
pub use shutdown::shutdown_signal;
