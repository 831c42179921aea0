//! Prometheus metrics for cost tools (OpenCost, Kubecost): GPU-seconds and
//! preemption waste per tenant since the beginning, and the month-to-date
//! cost per tenant and priority (usage and discount lines of the current
//! draft; it restarts at each tenant's month boundary like any counter
//! reset). Rendered from Postgres at most every 30 s, so scrapes stay cheap.
//!
//! Every tenant's spend is on this page, so it is not public: a scrape
//! sends `Authorization: Bearer <BILLING_METRICS_TOKEN>` (Prometheus'
//! `authorization:` in a scrape config); without the setting `/metrics`
//! answers 401 to everyone, and a scrape with two `Authorization` headers
//! gets 400 like any request ([`crate::auth::authorization`]).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::IntoResponse;
use chrono::Utc;
use rust_decimal::Decimal;
use sqlx::PgConnection;

use crate::auth::{authorization, hash_token};
use crate::drafts;
use crate::error::BillingError;
use crate::period::Month;
use crate::rating::LineKind;
use crate::state::AppState;
use crate::store;

const MAX_AGE: Duration = Duration::from_secs(30);

pub async fn metrics(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, BillingError> {
    let given = authorization(&headers)?
        .and_then(serving::headers::bearer)
        .map(hash_token);
    // Hashes compared, so the comparison's time says nothing about the token.
    if state.metrics_token_hash.is_none() || given != state.metrics_token_hash {
        return Err(BillingError::Unauthenticated);
    }
    let mut cached = state.cost_metrics.0.lock().await;
    if let Some((at, text)) = cached.as_ref() {
        if at.elapsed() < MAX_AGE {
            return Ok((
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                text.clone(),
            ));
        }
    }
    let text = render(&mut *state.pool.acquire().await?).await?;
    *cached = Some((Instant::now(), text.clone()));
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text))
}

async fn render(conn: &mut PgConnection) -> Result<String, BillingError> {
    let usage = store::usage::lifetime_by_tenant(conn).await?;
    let mut cost: BTreeMap<(String, i16), Decimal> = BTreeMap::new();
    let mut by_month: BTreeMap<Month, Vec<String>> = BTreeMap::new();
    let now = Utc::now();
    for t in store::tenants::list(conn, None).await? {
        by_month
            .entry(Month::containing(now, t.time_zone))
            .or_default()
            .push(t.tenant_id);
    }
    for (month, ids) in by_month {
        for body in drafts::drafts(conn, month, Some(&ids)).await? {
            for l in body
                .lines
                .iter()
                .filter(|l| matches!(l.kind, LineKind::Usage | LineKind::Discount))
            {
                if let Some(p) = l.priority {
                    *cost.entry((body.head.tenant_id.clone(), p)).or_default() += l.amount;
                }
            }
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP gpu_seconds_total GPU-seconds attributed to the tenant's requests"
    );
    let _ = writeln!(out, "# TYPE gpu_seconds_total counter");
    for (t, gpu, _) in &usage {
        let _ = writeln!(out, "gpu_seconds_total{{tenant=\"{t}\"}} {gpu}");
    }
    let _ = writeln!(
        out,
        "# HELP preemption_waste_seconds_total GPU-seconds lost to preemption"
    );
    let _ = writeln!(out, "# TYPE preemption_waste_seconds_total counter");
    for (t, _, waste) in &usage {
        let _ = writeln!(
            out,
            "preemption_waste_seconds_total{{tenant=\"{t}\"}} {waste}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP request_cost_dollars_total Month-to-date cost of the tenant's usage, by priority"
    );
    let _ = writeln!(out, "# TYPE request_cost_dollars_total counter");
    for ((t, p), amount) in &cost {
        let _ = writeln!(
            out,
            "request_cost_dollars_total{{tenant=\"{t}\",priority=\"{p}\"}} {amount}"
        );
    }
    Ok(out)
}
