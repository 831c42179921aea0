//! The request headers that decide who pays and who sees what, read the
//! same way by every service: `Authorization: Bearer <token>` with the
//! scheme in any case (RFC 9110 §11.1), and such a header present at most
//! once — a proxy that appends a second one, or reads the last one, must
//! not decide which credential counts. Each service answers
//! [`Repeated`] in its own error shape.

use axum::http::{HeaderMap, HeaderValue};

/// A header that must appear at most once appeared more than once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repeated(pub &'static str);

/// The one value of header `name` (`None` without one); more than one is
/// [`Repeated`], naming the header as given.
pub fn single<'h>(
    headers: &'h HeaderMap,
    name: &'static str,
) -> Result<Option<&'h HeaderValue>, Repeated> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(Repeated(name));
    }
    Ok(first)
}

/// The token of an `Authorization: Bearer <token>` value; the scheme is
/// case-insensitive.
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_value_is_repeated_whatever_the_name_case() {
        let mut h = HeaderMap::new();
        assert_eq!(single(&h, "Authorization"), Ok(None));
        h.append("authorization", HeaderValue::from_static("Bearer a"));
        assert!(single(&h, "Authorization").is_ok_and(|v| v.is_some()));
        h.append("authorization", HeaderValue::from_static("Bearer b"));
        assert_eq!(single(&h, "Authorization"), Err(Repeated("Authorization")));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_needs_a_token() {
        assert_eq!(bearer("bEaReR  tok "), Some("tok"));
        assert_eq!(bearer("Basic dXNlcjpwYXNz"), None);
        assert_eq!(bearer("Bearer "), None);
    }
}
