//! Price books in Postgres: the whole validated book as JSON, by version
//! and effective date.

use chrono::NaiveDate;
use sqlx::PgConnection;

use crate::error::BillingError;
use crate::rating::PriceBook;

/// The book in effect on `day`: the latest whose effective date is not after it.
pub async fn in_effect(conn: &mut PgConnection, day: NaiveDate) -> Result<PriceBook, BillingError> {
    let row: Option<(sqlx::types::Json<PriceBook>,)> = sqlx::query_as(
        "SELECT body FROM price_books WHERE effective_from <= $1 ORDER BY effective_from DESC LIMIT 1",
    )
    .bind(day)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|(b,)| b.0).ok_or_else(|| {
        BillingError::Conflict(format!(
            "no price book is in effect on {day}; load one first"
        ))
    })
}

/// Stores a book after validating it (replacing one of the same version).
pub async fn put(conn: &mut PgConnection, book: &PriceBook) -> Result<(), BillingError> {
    book.validate()?;
    sqlx::query(
        "INSERT INTO price_books (version, effective_from, body) VALUES ($1, $2, $3)
         ON CONFLICT (version) DO UPDATE SET effective_from = EXCLUDED.effective_from,
             body = EXCLUDED.body, loaded_at = now()",
    )
    .bind(&book.version)
    .bind(book.effective_from)
    .bind(sqlx::types::Json(book))
    .execute(&mut *conn)
    .await
    .map_err(|e| match &e {
        sqlx::Error::Database(d) if d.constraint() == Some("price_books_effective_from_key") => {
            BillingError::Conflict(format!(
                "price book {}: another version already takes effect on {}; load that version again with a new effectiveFrom, or give this one another day",
                book.version, book.effective_from
            ))
        }
        _ => e.into(),
    })?;
    Ok(())
}
