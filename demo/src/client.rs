//! billing-api as the demo reads it (as finance): usage totals, invoices
//! (typed by billing-api's own definition), finalizing, shadow bills,
//! billing tokens for the pages.

use std::time::Duration;

use anyhow::{bail, Context};
use billing_api::invoice::{Invoice, UsageTotals};
use serde_json::Value;

pub struct Billing {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Billing {
    pub fn new(base: &str, token: &str) -> anyhow::Result<Self> {
        Ok(Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()?,
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
        })
    }

    async fn get(&self, path: &str, query: &[(&str, &str)]) -> anyhow::Result<reqwest::Response> {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .query(query)
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("billing-api unreachable at {}", self.base))?;
        Ok(response)
    }

    /// A tenant's usage totals in [from, to) (RFC 3339).
    pub async fn usage(&self, tenant: &str, from: &str, to: &str) -> anyhow::Result<UsageTotals> {
        let v: Value = self
            .get(
                &format!("/v1/tenants/{tenant}/usage"),
                &[("from", from), ("to", to)],
            )
            .await?
            .error_for_status()?
            .json()
            .await?;
        serde_json::from_value(v["totals"].clone()).context("usage totals in billing-api's answer")
    }

    /// A tenant's invoice for `period` (`YYYY-MM`): finalized, or a draft.
    pub async fn invoice(&self, tenant: &str, period: &str) -> anyhow::Result<Invoice> {
        let r = self
            .get(&format!("/v1/tenants/{tenant}/invoices/{period}"), &[])
            .await?;
        answer(r).await
    }

    /// Finalizes a tenant's invoice for `period`.
    pub async fn finalize(&self, tenant: &str, period: &str) -> anyhow::Result<Invoice> {
        let r = self
            .http
            .post(format!(
                "{}/v1/tenants/{tenant}/invoices/{period}/finalize",
                self.base
            ))
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("billing-api unreachable at {}", self.base))?;
        answer(r).await
    }

    /// Issues a billing token for `role` (and `tenant`, for a team lead)
    /// through billing-api's token API, as finance; returns the token,
    /// which billing-api shows only this once.
    pub async fn issue_token(
        &self,
        role: &str,
        tenant: Option<&str>,
        label: &str,
    ) -> anyhow::Result<String> {
        let r = self
            .http
            .post(format!("{}/v1/tokens", self.base))
            .bearer_auth(&self.token)
            .json(&serde_json::json!({"role": role, "tenant_id": tenant, "label": label}))
            .send()
            .await
            .with_context(|| format!("billing-api unreachable at {}", self.base))?;
        let status = r.status();
        let text = r.text().await?;
        if !status.is_success() {
            bail!("billing-api refused a {role} token: {status}: {text}");
        }
        let v: Value = serde_json::from_str(&text).context("a token in billing-api's answer")?;
        v["token"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("no token in billing-api's answer: {text}"))
    }

    /// A tenant's shadow bill for the month so far.
    pub async fn shadow_bill(&self, tenant: &str) -> anyhow::Result<Value> {
        Ok(self
            .get(&format!("/v1/tenants/{tenant}/shadow-bill"), &[])
            .await?
            .error_for_status()?
            .json()
            .await?)
    }
}

/// The invoice in a 2xx answer, or billing-api's own error message.
async fn answer(r: reqwest::Response) -> anyhow::Result<Invoice> {
    let status = r.status();
    let text = r.text().await?;
    if !status.is_success() {
        bail!("billing-api answered {status}: {text}");
    }
    serde_json::from_str(&text).context("an invoice in billing-api's answer")
}
