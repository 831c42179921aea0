//! Which statements write a batch's request rows and rollups: its own
//! module because both the batch's transaction ([`crate::store`]) and the
//! request rows ([`crate::request_rows`]) choose by it.

/// How a batch's request rows and rollups are written. Both write the same
/// rows and sums; only the statements differ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WritePath {
    /// The request rows as one array of composite rows, and one pass and one
    /// statement for the three hourly rollups and the late hours.
    #[default]
    Rows,
    /// The earlier statements ([`crate::unnest_path`]), kept so that
    /// `ingest-bench` measures before and after in one run.
    Unnest,
}
