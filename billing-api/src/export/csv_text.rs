//! Writing a CSV document to a string, with csv's errors as billing-api's.

use crate::error::BillingError;

pub(super) fn csv_error(e: impl std::fmt::Display) -> BillingError {
    BillingError::Config(format!("csv: {e}"))
}

pub(super) fn finish(w: csv::Writer<Vec<u8>>) -> Result<String, BillingError> {
    let bytes = w.into_inner().map_err(csv_error)?;
    String::from_utf8(bytes).map_err(csv_error)
}
