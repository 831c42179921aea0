//! Rating: price books, usage → lines, dedicated pools' reservations, and
//! the overhead split. Pure code,
//! no I/O, so every money rule is unit- and property-tested.

pub mod lines;
pub mod overhead;
pub mod price_book;
pub mod price_book_schema;
pub mod reserved;

pub use lines::{cents, rate, BillingMode, Line, LineKind, RatingError, UsageGroup};
pub use overhead::allocate;
pub use price_book::{Overhead, PriceBook};
pub use reserved::{reserved_lines, Reservation};
