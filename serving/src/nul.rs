//! NUL characters (U+0000): no identifier, parameter or prompt of any
//! Meterline service can hold one, and Postgres refuses them in `text`, so
//! one that got through would be a 500 further in. [`reject_in_query`] is
//! the one query check, layered by each service inside its router; path
//! parameters and JSON fields are checked where each service reads them,
//! with [`nul_message`].

use axum::extract::{Query, Request};
use axum::http::{StatusCode, Uri};
use axum::middleware::Next;
use axum::response::Response;

/// The message for a field or parameter `name` that holds a NUL.
pub fn nul_message(name: &str) -> String {
    format!("`{name}` contains a NUL character (U+0000), which is never valid here")
}

/// The first query parameter (by name) whose decoded name or value holds a
/// NUL; a query that does not decode is `Err` with axum's message.
pub fn nul_query_param(uri: &Uri) -> Result<Option<String>, String> {
    let Query(pairs) =
        Query::<Vec<(String, String)>>::try_from_uri(uri).map_err(|e| e.body_text())?;
    Ok(pairs
        .into_iter()
        .find(|(k, v)| k.contains('\0') || v.contains('\0'))
        .map(|(k, _)| k))
}

/// Middleware for every router: a query holding a NUL (or not decoding)
/// is a 400 in the shared error shape, `param` naming the parameter.
pub async fn reject_in_query(req: Request, next: Next) -> Response {
    match nul_query_param(req.uri()) {
        Ok(None) => next.run(req).await,
        Ok(Some(name)) => {
            let message = nul_message(&name);
            crate::error::response(StatusCode::BAD_REQUEST, "bad_request", Some(&name), message)
        }
        Err(message) => {
            crate::error::response(StatusCode::BAD_REQUEST, "bad_request", None, message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_in_the_query_is_named() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        assert_eq!(
            nul_query_param(&uri("/v1/models?a=1&b=x%00")),
            Ok(Some("b".into()))
        );
        assert_eq!(nul_query_param(&uri("/v1/models?a=1")), Ok(None));
        assert_eq!(nul_query_param(&uri("/v1/models")), Ok(None));
    }
}
