//! The OpenAPI 3 document, generated from the handlers' annotations and
//! served at `/openapi.json`. A test compares it with the committed
//! `billing-api/openapi.json`, so the published contract can't drift from
//! the code unnoticed (`UPDATE_OPENAPI=1 cargo test -p billing-api` rewrites it).

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// The error shape every 4xx and 5xx uses.
#[derive(utoipa::ToSchema)]
#[allow(
    dead_code,
    reason = "documents the shape; errors are built in error.rs"
)]
pub struct ErrorBody {
    error: ErrorDetail,
}

#[derive(utoipa::ToSchema)]
#[allow(
    dead_code,
    reason = "documents the shape; errors are built in error.rs"
)]
pub struct ErrorDetail {
    code: String,
    message: String,
}

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = doc.components.as_mut() {
            components.add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Meterline billing-api", description = "Usage, invoices, shadow bills, exports and request lookup, scoped by role."),
    paths(
        crate::usage::tenant_usage,
        crate::routes::get_invoice,
        crate::routes::finalize_invoice,
        crate::routes::void_invoice,
        crate::routes::shadow_bill,
        crate::routes::list_invoices,
        crate::routes::focus_export,
        crate::routes::lookup_request,
        crate::routes::put_price_book,
    ),
    components(schemas(ErrorBody, ErrorDetail)),
    modifiers(&Bearer)
)]
pub struct ApiDoc;

/// The document as served.
pub fn document() -> String {
    ApiDoc::openapi().to_pretty_json().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");

    #[test]
    fn openapi_document_matches_the_committed_one() {
        let generated = super::document();
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::write(COMMITTED, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
        assert!(
            committed == generated,
            "billing-api/openapi.json is out of date: run UPDATE_OPENAPI=1 cargo test -p billing-api and commit it"
        );
        for path in [
            "/v1/tenants/{tenant}/invoices/{period}",
            "/v1/requests/{request_id}",
            "/v1/exports/focus",
        ] {
            assert!(generated.contains(path), "{path} missing");
        }
    }
}
