//! The page frame: head, inline stylesheet (screen and print), navigation
//! for the signed-in role, the sign-in page and error pages.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{html, Markup, PreEscaped, DOCTYPE};

use crate::access::{Principal, Role};
use crate::error::BillingError;

const CSS: &str = r#"
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2733;background:#f6f7f9}
header{background:#1d2733;color:#fff;padding:.6rem 1rem;display:flex;flex-wrap:wrap;gap:1rem;align-items:center}
header a{color:#cfe0f5;text-decoration:none} header form{margin-left:auto}
main{max-width:960px;margin:0 auto;padding:1rem}
h1{font-size:1.4rem} h2{font-size:1.1rem;margin-top:1.6rem}
table{border-collapse:collapse;width:100%;background:#fff} th,td{padding:.35rem .5rem;border-bottom:1px solid #e3e6ea;text-align:left}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;flex-wrap:wrap;gap:.8rem} .card{background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:.7rem 1rem;min-width:10rem}
.card .big{font-size:1.5rem;font-weight:600}
.warn{background:#fff4d6;border:1px solid #e0b84a;padding:.5rem .8rem;border-radius:4px}
.over{background:#fde2e1;border:1px solid #d9534f;padding:.5rem .8rem;border-radius:4px}
.note{color:#5b6675;font-size:.9rem}
.chart{width:100%;height:auto;background:#fff;border:1px solid #e3e6ea}
.swatch{display:inline-block;width:.8rem;height:.8rem;border-radius:2px;vertical-align:middle}
form.inline{display:inline} button{cursor:pointer}
.error{background:#fde2e1;border:1px solid #d9534f;padding:.8rem;border-radius:4px}
@media (max-width:600px){main{padding:.5rem} .card{min-width:8rem}}
@media print{header,nav,form,.noprint{display:none!important} body{background:#fff} main{max-width:none}
 table{font-size:10pt} .card{border:none}}
"#;

/// Who a page is for, as its header shows them: their role and tenant,
/// and the CSRF token of the sign-out form (from their session,
/// `session::PageUser::signed`).
#[derive(Debug, Clone, Copy)]
pub struct Signed<'a> {
    pub who: &'a Principal,
    pub csrf: &'a str,
}

/// A full page for a signed-in user.
pub fn page(user: Option<Signed<'_>>, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Meterline" }
                style { (PreEscaped(CSS)) }
            }
            body {
                header {
                    strong { "Meterline billing" }
                    @if let Some(u) = user {
                        nav {
                            @match (u.who.role, u.who.tenant_id.as_deref()) {
                                (Role::TeamLead, Some(t)) => {
                                    a href=(format!("/pages/tenants/{t}/shadow-bill")) { "Shadow bill" } " "
                                    a href="/pages/lookup" { "Request lookup" }
                                }
                                (Role::Finance, _) => {
                                    a href="/pages/invoices" { "Invoices" } " "
                                    a href="/pages/lookup" { "Request lookup" } " "
                                    a href="/pages/tokens" { "Tokens" }
                                }
                                _ => { a href="/pages/lookup" { "Request lookup" } }
                            }
                        }
                        form method="post" action="/sign-out" {
                            input type="hidden" name="csrf" value=(u.csrf);
                            span.note { (u.who.role.as_str()) @if let Some(t) = &u.who.tenant_id { " · " (t) } " " }
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

pub fn html(status: StatusCode, markup: Markup) -> Response {
    (status, Html(markup.into_string())).into_response()
}

/// The sign-in page, with an error when a token was refused.
pub fn sign_in(error: Option<&str>, status: StatusCode) -> Response {
    html(
        status,
        page(
            None,
            "Sign in",
            html! {
                h1 { "Sign in" }
                @if let Some(e) = error { p.error { (e) } }
                form method="post" action="/sign-in" {
                    p { label { "Billing token " input type="password" name="token" autocomplete="off" size="40"; } }
                    p { button type="submit" { "Sign in" } }
                }
                p.note { "Finance issues tokens on the Tokens page or with " code { "billing-api token issue" } "." }
            },
        ),
    )
}

/// An error as a page, with its status (5xx bodies generic; the detail is logged).
pub fn error_page(e: BillingError) -> Response {
    let status = e.status_code();
    let message = if status.is_server_error() {
        tracing::error!(error = %e, "page failed");
        "internal error".to_owned()
    } else {
        e.to_string()
    };
    html(
        status,
        page(
            None,
            "Error",
            html! {
                h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
                p.error { (message) }
                p { a href="/" { "Back" } }
            },
        ),
    )
}
