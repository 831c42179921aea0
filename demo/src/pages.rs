//! The pages' addresses the demo prints at the end, with a sign-in token
//! for each demo role: finance (the finance token billing-api was started
//! with), a team lead of acme-corp and support, both issued through
//! billing-api's token API as finance. billing-api shows a token only when
//! it issues it, so every run issues a new pair (labelled `demo`; finance
//! revokes old ones on the Tokens page).

use crate::client::Billing;

/// The tenant whose team lead the demo signs in as.
pub const LEAD_TENANT: &str = "acme-corp";

/// A role's sign-in token and the pages worth opening as it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    /// How the role is named for people ("team lead of acme-corp").
    pub who: String,
    pub token: String,
    /// (path, what it shows).
    pub pages: Vec<(String, &'static str)>,
}

/// The three demo roles, with tokens for the team lead and support issued
/// now; `period` is the backfilled (finalized) month.
pub async fn roles(
    billing: &Billing,
    finance_token: &str,
    period: &str,
) -> anyhow::Result<Vec<Role>> {
    let lead = billing
        .issue_token("team_lead", Some(LEAD_TENANT), "demo")
        .await?;
    let support = billing.issue_token("support", None, "demo").await?;
    Ok(layout(finance_token, &lead, &support, period))
}

/// The roles and their pages, given the tokens.
pub fn layout(finance: &str, lead: &str, support: &str, period: &str) -> Vec<Role> {
    vec![
        Role {
            who: "finance".into(),
            token: finance.into(),
            pages: vec![
                (
                    format!("/pages/invoices?period={period}"),
                    "the month's invoices, close the month, exports",
                ),
                (
                    format!("/pages/tenants/{LEAD_TENANT}/invoices/{period}/print"),
                    "a payable invoice, printable",
                ),
                ("/pages/tokens".into(), "issue and revoke billing tokens"),
            ],
        },
        Role {
            who: format!("team lead of {LEAD_TENANT}"),
            token: lead.into(),
            pages: vec![
                (
                    format!("/pages/tenants/{LEAD_TENANT}/shadow-bill"),
                    "this month's shadow bill",
                ),
                (
                    format!("/pages/tenants/{LEAD_TENANT}/shadow-bill?period={period}"),
                    "the backfilled month's shadow bill",
                ),
            ],
        },
        Role {
            who: "support".into(),
            token: support.into(),
            pages: vec![("/pages/lookup".into(), "look up an X-Request-Id")],
        },
    ]
}

/// The block the demo prints: where to sign in, then each role's token
/// and pages as full URLs under `base` (`http://127.0.0.1:8082`).
pub fn render(base: &str, roles: &[Role]) -> String {
    let base = base.trim_end_matches('/');
    let mut out = format!(
        "pages: open {base}/sign-in and paste the role's token (a session cookie keeps you signed in)\n"
    );
    for role in roles {
        out.push_str(&format!("  {}: token {}\n", role.who, role.token));
        for (path, what) in &role.pages {
            out.push_str(&format!("    {base}{path}  ({what})\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_role_gets_its_token_and_full_urls() {
        let roles = layout("fin-0001", "mlb_lead", "mlb_support", "2026-11");
        let text = render("http://127.0.0.1:8082/", &roles);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "pages: open http://127.0.0.1:8082/sign-in and paste the role's token (a session cookie keeps you signed in)"
        );
        assert_eq!(lines[1], "  finance: token fin-0001");
        assert_eq!(
            lines[2],
            "    http://127.0.0.1:8082/pages/invoices?period=2026-11  (the month's invoices, close the month, exports)"
        );
        assert!(text.contains("  team lead of acme-corp: token mlb_lead\n"));
        assert!(text.contains(
            "    http://127.0.0.1:8082/pages/tenants/acme-corp/shadow-bill?period=2026-11  (the backfilled month's shadow bill)\n"
        ));
        assert!(text.contains("  support: token mlb_support\n"));
        assert!(
            text.contains("    http://127.0.0.1:8082/pages/lookup  (look up an X-Request-Id)\n")
        );
        assert!(text.contains("/pages/tenants/acme-corp/invoices/2026-11/print"));
        // Every page line is a full URL under the base.
        for line in lines.iter().filter(|l| l.starts_with("    ")) {
            assert!(
                line.trim_start()
                    .starts_with("http://127.0.0.1:8082/pages/"),
                "{line}"
            );
        }
    }
}
