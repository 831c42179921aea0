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
//! - **No NUL in the query.** [`nul::reject_in_query`] answers a decoded
//!   query parameter holding U+0000 with a 400 naming it; each service
//!   layers it inside its own router (so the gateway's `X-Request-Id`
//!   still wraps the answer).
//! - **One graceful shutdown.** [`shutdown_signal`] resolves on SIGTERM or
//!   Ctrl-C; [`serve`] then stops accepting, lets in-flight responses finish
//!   for up to [`HttpSettings::shutdown_grace`], and returns.
//!
//! Layout:
//! - [`settings`]: the typed, validated settings (`HTTP_*` variables).
//! - [`server`]: the accept loop and per-connection HTTP/1.1 setup.
//! - [`body`]: the request-body read timeout, as a middleware.
//! - [`headers`]: `Authorization` and other credentials headers, at most once.
//! - [`nul`]: the NUL check of the query, and the one NUL message.
//! - [`retired`]: settings no longer read, refused at start naming them.
//! - `error`: the error body this layer answers with itself.
//! - [`shutdown`]: the signal every binary stops on.

pub mod body;
mod error;
pub mod headers;
pub mod nul;
pub mod retired;
pub mod server;
pub mod settings;
pub mod shutdown;

pub use nul::nul_message;
pub use server::{serve, ServeError};
pub use settings::HttpSettings;
pub use shutdown::shutdown_signal;
