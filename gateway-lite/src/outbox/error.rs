//! The outbox's one error type: its storage failed (the disk, or
//! `answers.redb`), or its writer thread is gone. Every other outbox
//! module returns it, so it lives apart from all of them.

#[derive(Debug, Clone, thiserror::Error)]
pub enum OutboxError {
    #[error("outbox storage: {0}")]
    Storage(String),
    #[error("outbox writer has stopped")]
    Closed,
}

macro_rules! storage_err {
    ($($t:ty),*) => {$(
        impl From<$t> for OutboxError {
            fn from(e: $t) -> Self { Self::Storage(e.to_string()) }
        }
    )*};
}
storage_err!(
    std::io::Error,
    redb::SetDurabilityError,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);
