//! The OpenAPI 3 document, generated from the handlers' annotations and
//! served at `/openapi.json`. A test compares it with the committed
//! `billing-api/openapi.json`, so the published contract can't drift from
//! the code unnoticed (`UPDATE_OPENAPI=1 cargo test -p billing-api` rewrites it).
//!
//! Each handler lists the answers particular to it (200, 403, 404, 409);
//! [`CommonErrors`] adds those every operation can give: 400 (a parameter
//! or body that is malformed, out of its format or holds a NUL), 401 and
//! 500, plus 408 (from the serving layer's body-read timeout) and 413 for
//! operations with a body and 415 for a JSON body. The
//! conformance test runs schemathesis against the served document.

use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use crate::error::{ErrorBody, ErrorCode, ErrorDetail};
use crate::rating::PriceBook;

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

fn error_response(description: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
        .into()
}

/// Adds the answers every operation can give (see the module docs).
struct CommonErrors;

impl CommonErrors {
    fn add(op: &mut Operation) {
        let mut common = vec![
            ("400", "a parameter or the body is malformed, outside its format, or holds a NUL character"),
            ("401", "no token, an unknown or revoked one, or not `Bearer`"),
            ("500", "the server failed; the detail is in its log"),
        ];
        if let Some(body) = &op.request_body {
            common.push(("413", "the body is larger than 2 MiB"));
            common.push((
                "408",
                "the body did not arrive within HTTP_BODY_READ_TIMEOUT_SECS; the connection is closed",
            ));
            if body.content.contains_key("application/json") {
                common.push(("415", "the body is not sent as application/json"));
            }
        }
        for (status, description) in common {
            op.responses
                .responses
                .entry(status.to_owned())
                .or_insert_with(|| error_response(description));
        }
    }
}

/// The reference price book (as the object the YAML holds) as the example
/// of `POST /v1/price-books`.
struct PriceBookExample;

impl Modify for PriceBookExample {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let body = doc
            .paths
            .paths
            .get_mut("/v1/price-books")
            .and_then(|item| item.post.as_mut())
            .and_then(|op| op.request_body.as_mut())
            .and_then(|body| body.content.get_mut("application/yaml"));
        let reference = PriceBook::from_yaml(include_str!("../../config/price-book.yaml"))
            .ok()
            .and_then(|book| serde_json::to_value(book).ok());
        if let Some(content) = body {
            content.example = reference;
        }
    }
}

impl Modify for CommonErrors {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        for item in doc.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.options,
                &mut item.head,
                &mut item.patch,
                &mut item.trace,
            ]
            .into_iter()
            .flatten()
            {
                Self::add(op);
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Meterline billing-api", description = "Usage, invoices, shadow bills, exports and request lookup, scoped by role. Every error is `{\"error\": {\"code\", \"message\"}}`; an unknown path is 404 and a method a path does not take is 405 with `Allow`, in the same shape."),
    paths(
        crate::usage::tenant_usage,
        crate::routes::get_invoice,
        crate::routes::finalize_invoice,
        crate::routes::void_invoice,
        crate::routes::shadow_bill,
        crate::routes::put_budget,
        crate::routes::list_invoices,
        crate::routes::focus_export,
        crate::routes::lookup_request,
        crate::routes::put_price_book,
        crate::admin::close_month,
        crate::admin::list_tokens,
        crate::admin::issue_token,
        crate::admin::revoke_token,
    ),
    components(schemas(
        ErrorBody,
        ErrorDetail,
        ErrorCode,
        crate::params::TenantId,
        crate::params::RequestId,
        crate::params::Share,
        crate::params::InvoiceFormat,
        crate::params::FocusFormat,
        crate::period::Month,
    )),
    modifiers(&Bearer, &CommonErrors, &PriceBookExample)
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

    #[test]
    fn text_parameters_refuse_nul_as_the_server_does() {
        let doc: serde_json::Value = serde_json::from_str(&super::document()).unwrap();
        let param = &doc["paths"]["/v1/tokens/{token_id}/revoke"]["post"]["parameters"][0];
        assert_eq!(param["required"], true);
        assert_eq!(param["schema"]["pattern"], crate::params::TEXT_PATTERN);
    }

    #[test]
    fn every_operation_documents_400_401_and_500_and_bodies_413() {
        let doc: serde_json::Value = serde_json::from_str(&super::document()).unwrap();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let text = doc.to_string();
        for name in text.split("#/components/schemas/").skip(1) {
            let name = name.split('"').next().unwrap();
            assert!(
                schemas.contains_key(name),
                "{name} is referenced, not defined"
            );
        }
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let responses = op["responses"].as_object().unwrap();
                for status in ["200", "400", "401", "500"] {
                    assert!(responses.contains_key(status), "{method} {path}: {status}");
                }
                if op.get("requestBody").is_some() {
                    assert!(responses.contains_key("413"), "{method} {path}: 413");
                    assert!(responses.contains_key("408"), "{method} {path}: 408");
                }
            }
        }
    }
}
