//! Invoices: what one tenant owes (or, in shadow mode, would owe) for one
//! month. An [`InvoiceBody`] is pure content — the same inputs give the
//! same bytes and the same content hash — and an [`Invoice`] adds its
//! lifecycle: draft (recomputed on request) → finalized (stored, numbered,
//! immutable) → voided with a reason.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::rating::{BillingMode, Line, LineKind};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageTotals {
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    #[serde(with = "rust_decimal::serde::str")]
    pub gpu_seconds: Decimal,
}

/// The content of an invoice: every figure on it, nothing about its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InvoiceBody {
    #[serde(flatten)]
    pub head: InvoiceHead,
    pub usage: UsageTotals,
    pub lines: Vec<Line>,
    /// Usage and discount lines.
    #[serde(with = "rust_decimal::serde::str")]
    pub subtotal: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub overhead: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub adjustments: Decimal,
    /// Reserved-capacity lines net of their credits (absent when the
    /// tenant owns no dedicated replicas).
    #[serde(
        default,
        with = "rust_decimal::serde::str",
        skip_serializing_if = "Decimal::is_zero"
    )]
    pub reserved: Decimal,
    /// The grace-period waiver (negative; absent outside a grace period or
    /// under budget).
    #[serde(
        default,
        with = "rust_decimal::serde::str",
        skip_serializing_if = "Decimal::is_zero"
    )]
    pub waived: Decimal,
    /// Exactly the sum of every line.
    #[serde(with = "rust_decimal::serde::str")]
    pub total: Decimal,
}

impl InvoiceBody {
    /// Sums the lines into subtotal, overhead, adjustments and total.
    pub fn new(head: InvoiceHead, usage: UsageTotals, lines: Vec<Line>) -> Self {
        let sum = |kinds: &[LineKind]| -> Decimal {
            lines
                .iter()
                .filter(|l| kinds.contains(&l.kind))
                .map(|l| l.amount)
                .sum()
        };
        let subtotal = sum(&[LineKind::Usage, LineKind::Discount]);
        let overhead = sum(&[LineKind::Overhead]);
        let adjustments = sum(&[LineKind::Adjustment]);
        let reserved = sum(&[LineKind::Reserved, LineKind::Credit]);
        let waived = sum(&[LineKind::GraceWaiver]);
        Self {
            head,
            usage,
            total: lines.iter().map(|l| l.amount).sum(),
            lines,
            subtotal,
            overhead,
            adjustments,
            reserved,
            waived,
        }
    }

    /// Canonical bytes: serde_json of the struct (fixed field order, decimals as strings).
    pub fn canonical_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// SHA-256 of the canonical bytes, hex.
    pub fn content_hash(&self) -> String {
        hex::encode(Sha256::digest(self.canonical_json()))
    }
}

/// Who and when an invoice is for, before any figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InvoiceHead {
    pub tenant_id: String,
    pub period: String,
    pub period_start: DateTime<Utc>,
    pub period_end: DateTime<Utc>,
    pub time_zone: String,
    pub currency: String,
    pub price_book: String,
    pub billing_mode: BillingMode,
    /// Shadow invoices are computed and shown, never payable.
    pub shadow: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Draft,
    Finalized,
    Voided,
}

/// An invoice as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Invoice {
    pub status: Status,
    pub number: Option<i64>,
    pub payable: bool,
    pub content_hash: String,
    pub finalized_at: Option<DateTime<Utc>>,
    pub voided_at: Option<DateTime<Utc>>,
    pub void_reason: Option<String>,
    #[serde(flatten)]
    pub body: InvoiceBody,
}

impl Invoice {
    pub fn draft(body: InvoiceBody) -> Self {
        Self {
            status: Status::Draft,
            number: None,
            payable: false,
            content_hash: body.content_hash(),
            finalized_at: None,
            voided_at: None,
            void_reason: None,
            body,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rating::{rate, PriceBook, UsageGroup};
    use proptest::prelude::*;

    fn head() -> InvoiceHead {
        InvoiceHead {
            tenant_id: "acme-corp".into(),
            period: "2026-11".into(),
            period_start: DateTime::UNIX_EPOCH,
            period_end: DateTime::UNIX_EPOCH,
            time_zone: "UTC".into(),
            currency: "USD".into(),
            price_book: "ref".into(),
            billing_mode: BillingMode::PerToken,
            shadow: false,
        }
    }

    proptest! {
        /// Total is the sum of the lines, and the same inputs give the same bytes.
        #[test]
        fn total_is_the_sum_of_lines_and_content_is_deterministic(
            groups in proptest::collection::vec(
                (0usize..3, 1i16..=5, any::<bool>(), 0i64..50_000_000, 0i64..1000, 0i64..20_000_000, 0i64..10_000_000_000),
                0..30),
            per_token in any::<bool>(),
        ) {
            let book = PriceBook::from_yaml(include_str!("../../config/price-book.yaml")).unwrap();
            let models = ["llama-3.1-8b", "llama-3.1-70b", "frontier-405b"];
            let groups: Vec<UsageGroup> = groups
                .into_iter()
                .map(|(m, p, off, prompt, cached_pct, out, micros)| UsageGroup {
                    model: models[m].into(),
                    priority: p,
                    off_peak: off,
                    requests: 1,
                    prompt_tokens: prompt,
                    cached_tokens: prompt * (cached_pct % 101) / 100,
                    completion_tokens: out,
                    gpu_seconds: Decimal::new(micros, 6),
                })
                .collect();
            let mode = if per_token { BillingMode::PerToken } else { BillingMode::PerGpuSecond };
            let lines = rate(&groups, &book, mode).unwrap();
            let a = InvoiceBody::new(head(), UsageTotals::default(), lines.clone());
            let b = InvoiceBody::new(head(), UsageTotals::default(), lines);
            prop_assert_eq!(a.total, a.lines.iter().map(|l| l.amount).sum::<Decimal>());
            prop_assert_eq!(a.total, a.subtotal + a.overhead + a.adjustments);
            prop_assert_eq!(a.canonical_json(), b.canonical_json());
            for l in &a.lines {
                prop_assert!(l.amount.scale() <= 2, "line {:?} is not in cents", l);
            }
        }
    }
}
