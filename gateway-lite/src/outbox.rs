//! The durable local outbox: every usage event is written here, and
//! flushed to disk, before the client gets its answer, so a gateway killed
//! at any instant loses no event a client was answered for.
//!
//! The outbox is a directory (`GATEWAY_OUTBOX`) holding an append-only
//! [`log`] of segment files and `answers.redb`, the idempotent answers.
//! One writer thread owns the log. Requests hand it their event and wait;
//! it takes everything queued, appends it in one write and flushes once
//! (group commit), so durability costs one `fdatasync` per batch, not per
//! request. The relay reads the log in order and reports what the broker
//! acknowledged; the writer records "published below N" in the log with
//! its next flush (or when the relay goes quiet), and a segment file is
//! deleted once all of its events are below that durable mark. A crash
//! before the mark reached the disk re-sends those events; ingest counts
//! the re-send as a duplicate: harmless, never lost.
//!
//! An idempotent answer is written in the same log record as its usage
//! event, then put in `answers.redb` (without a flush of its own). Answers
//! are made durable there before the segment holding them is deleted, and
//! a restart puts the answers of every remaining segment in again, so a
//! retry after a crash finds the answer if and only if the request was
//! billed.
//!
//! - [`log`]: the segment files and their record format
//! - `handle`: [`Outbox`], what requests and the relay hold
//! - `writer`: the one thread that appends and flushes (group commit)
//! - `shared`: the state the writer and the handles share
//! - `recovery`: reading back what a previous run left
//! - `error`: [`OutboxError`]

mod error;
mod handle;
pub mod log;
mod recovery;
mod shared;
mod writer;

pub use error::OutboxError;
#[cfg(test)]
pub(crate) use handle::reopen;
pub use handle::{Entry, Outbox};
pub use shared::DEPTH_GAUGE;
