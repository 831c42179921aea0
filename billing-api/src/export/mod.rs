//! Exports for finance: the invoice lines as CSV ([`invoices_csv`]) and the
//! FOCUS 1.2 cost-and-usage dataset as CSV or Parquet ([`focus`]).

mod csv_text;
pub mod focus;
mod invoices_csv;

pub use focus::{focus_csv, focus_parquet};
pub use invoices_csv::invoices_csv;
