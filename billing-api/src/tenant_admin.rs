//! Tenant and key administration: billing-api owns what tenants are
//! (billing mode, shadow, time zone, plan, and the limits the gateway reads)
//! and their API keys. The seed file (`BILLING_TENANTS_FILE`, shaped like
//! `config/tenants.yaml`) is validated as a whole before anything is
//! written: a bad time zone, billing mode, plan, priority or SLO is refused
//! naming the tenant and the field, so no stored tenant can turn a
//! finance-wide read into an error. The gateway only reads these tables.

use chrono::NaiveDate;
use serde::Deserialize;
use sqlx::PgPool;

use crate::error::BillingError;
use crate::params::TenantId;
use crate::period::parse_zone;
use crate::rating::BillingMode;
use crate::store::{self, tenants::TenantRow};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedFile {
    pub tenants: Vec<TenantSeed>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TenantSeed {
    pub name: String,
    pub display_name: Option<String>,
    pub plan: String,
    pub priority: i16,
    pub weight: i32,
    pub rate_limit: RateLimit,
    pub max_concurrency: i32,
    /// Cap on KV·seconds in flight (GiB·s), all gateways together.
    #[serde(default)]
    pub max_kv_gib_seconds: Option<i64>,
    pub billing_mode: String,
    #[serde(default = "yes")]
    pub shadow: bool,
    #[serde(default = "utc")]
    pub time_zone: String,
    #[serde(default)]
    pub slo: SloSeed,
    /// Share of each model pool's KV cache kept free for this tenant until
    /// it uses it, as a decimal text (`"0.30"`); enterprise tenants only.
    #[serde(default)]
    pub reserved_floor: Option<String>,
    /// The first day of real chargeback (`YYYY-MM-DD`, the tenant's zone),
    /// after at least one shadow month; only with `shadow: false`. Its
    /// first 30 days are the grace period.
    #[serde(default)]
    pub chargeback_since: Option<String>,
    #[serde(default)]
    pub keys: Vec<KeySeed>,
    #[serde(default)]
    pub limits: Vec<LimitSeed>,
}

/// A tenant's `slo:` (see `fleet::slo::Slo`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SloSeed {
    pub ttft_p95_ms: Option<u32>,
    pub e2e_p95_ms: Option<u32>,
    /// A percentage as text, e.g. `"99.9"`.
    pub availability: Option<String>,
    #[serde(default)]
    pub best_effort: bool,
}

fn yes() -> bool {
    true
}

fn utc() -> String {
    "UTC".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RateLimit {
    pub requests_per_second: i32,
    pub burst: i32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySeed {
    pub id: String,
    /// The key itself: fine in a demo file, hashed before it is stored.
    pub key: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LimitSeed {
    pub model: String,
    pub rpm: Option<i32>,
    pub tpm: Option<i64>,
    pub max_context: Option<i32>,
    pub max_output: Option<i32>,
}

/// Why a tenant is refused: the tenant and the field at fault.
fn refuse(tenant: &str, field: &str, why: impl std::fmt::Display) -> BillingError {
    BillingError::BadRequest(format!("tenant {tenant:?}: {field}: {why}"))
}

/// What validation derives from a tenant's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// The SLO's availability, basis points.
    pub availability_bp: Option<u32>,
    /// The reserved floor, basis points.
    pub reserved_floor_bp: Option<u32>,
    /// The first day of real chargeback.
    pub chargeback_since: Option<NaiveDate>,
}

impl TenantSeed {
    /// Checks every field billing or the gateway will read back, and gives
    /// what is derived from them (basis points).
    pub fn validate(&self) -> Result<Checked, BillingError> {
        let name = self.name.as_str();
        TenantId::parse(name).map_err(|e| refuse(name, "name", e))?;
        parse_zone(&self.time_zone).map_err(|_| {
            refuse(
                name,
                "timeZone",
                format!(
                    "{:?} is not an IANA time zone (e.g. Europe/Berlin)",
                    self.time_zone
                ),
            )
        })?;
        if BillingMode::parse(&self.billing_mode).is_none() {
            return Err(refuse(
                name,
                "billingMode",
                format!(
                    "{:?} must be per_token or per_gpu_second",
                    self.billing_mode
                ),
            ));
        }
        if !["free", "standard", "enterprise"].contains(&self.plan.as_str()) {
            return Err(refuse(
                name,
                "plan",
                format!("{:?} must be free, standard or enterprise", self.plan),
            ));
        }
        if !(1..=5).contains(&self.priority) {
            return Err(refuse(
                name,
                "priority",
                format!("{} must be 1 to 5", self.priority),
            ));
        }
        for (field, v) in [
            ("weight", i64::from(self.weight)),
            (
                "rateLimit.requestsPerSecond",
                i64::from(self.rate_limit.requests_per_second),
            ),
            ("rateLimit.burst", i64::from(self.rate_limit.burst)),
            ("maxConcurrency", i64::from(self.max_concurrency)),
            ("maxKvGibSeconds", self.max_kv_gib_seconds.unwrap_or(1)),
        ] {
            if v <= 0 {
                return Err(refuse(name, field, format!("{v} must be above 0")));
            }
        }
        for k in &self.keys {
            if k.key.len() < 16 {
                return Err(refuse(
                    name,
                    "keys.key",
                    format!("key {:?} is shorter than 16 characters", k.id),
                ));
            }
        }
        let slo = fleet::slo::Slo::new(
            self.slo.ttft_p95_ms,
            self.slo.e2e_p95_ms,
            self.slo.availability.as_deref(),
            self.slo.best_effort,
        )
        .map_err(|e| refuse(name, "slo", e))?;
        let reserved_floor_bp = match &self.reserved_floor {
            None => None,
            Some(_) if self.plan != "enterprise" => {
                return Err(refuse(
                    name,
                    "reservedFloor",
                    format!(
                        "only enterprise tenants have a reserved floor (plan is {:?})",
                        self.plan
                    ),
                ))
            }
            Some(text) => {
                Some(fleet::pool::share_bp(text).map_err(|e| refuse(name, "reservedFloor", e))?)
            }
        };
        let chargeback_since = match &self.chargeback_since {
            None => None,
            Some(_) if self.shadow => {
                return Err(refuse(
                    name,
                    "chargebackSince",
                    "a tenant in shadow mode has not begun real chargeback (set shadow: false)",
                ))
            }
            Some(text) => Some(NaiveDate::parse_from_str(text, "%Y-%m-%d").map_err(|_| {
                refuse(
                    name,
                    "chargebackSince",
                    format!("{text:?} must be a date such as 2026-11-01"),
                )
            })?),
        };
        Ok(Checked {
            availability_bp: slo.availability_bp,
            reserved_floor_bp,
            chargeback_since,
        })
    }
}

/// Reads and validates the seed file at `path` (the setting or argument
/// that named it, e.g. `BILLING_TENANTS_FILE`, in `setting`), naming the
/// file and the problem on error.
pub fn load(setting: &str, path: &std::path::Path) -> Result<SeedFile, BillingError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| BillingError::Config(format!("{setting} {}: {e}", path.display())))?;
    parse(&text).map_err(|e| BillingError::Config(format!("{setting} {}: {e}", path.display())))
}

/// Parses a seed file's text, validating every tenant.
pub fn parse(text: &str) -> Result<SeedFile, BillingError> {
    let file: SeedFile =
        serde_norway::from_str(text).map_err(|e| BillingError::BadRequest(e.to_string()))?;
    for t in &file.tenants {
        t.validate()?;
    }
    Ok(file)
}

/// Upserts every tenant, key and limit in one transaction (validated first).
pub async fn apply(pool: &PgPool, seed: &SeedFile) -> Result<(), BillingError> {
    let mut tx = pool.begin().await?;
    for t in &seed.tenants {
        let checked = t.validate()?;
        store::tenants::put(
            &mut tx,
            &TenantRow {
                tenant_id: &t.name,
                display_name: t.display_name.as_deref().unwrap_or(&t.name),
                plan: &t.plan,
                priority: t.priority,
                wfq_weight: t.weight,
                billing_mode: &t.billing_mode,
                shadow: t.shadow,
                time_zone: &t.time_zone,
                requests_per_second: t.rate_limit.requests_per_second,
                burst: t.rate_limit.burst,
                max_concurrency: t.max_concurrency,
                max_kv_gib_seconds: t.max_kv_gib_seconds,
                slo_ttft_p95_ms: t.slo.ttft_p95_ms.and_then(|v| i32::try_from(v).ok()),
                slo_e2e_p95_ms: t.slo.e2e_p95_ms.and_then(|v| i32::try_from(v).ok()),
                slo_availability_bp: checked.availability_bp.and_then(|v| i32::try_from(v).ok()),
                slo_best_effort: t.slo.best_effort,
                reserved_floor_bp: checked
                    .reserved_floor_bp
                    .and_then(|v| i32::try_from(v).ok()),
                chargeback_since: checked.chargeback_since,
            },
        )
        .await?;
        for k in &t.keys {
            let prefix: String = k.key.chars().take(8).collect();
            store::tenants::put_key(
                &mut tx,
                &k.id,
                &t.name,
                &crate::auth::hash_token(&k.key),
                &prefix,
            )
            .await?;
        }
        for l in &t.limits {
            store::tenants::put_limit(
                &mut tx,
                &t.name,
                &l.model,
                l.rpm,
                l.tpm,
                l.max_context,
                l.max_output,
            )
            .await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_tenants_are_valid() {
        let file = parse(include_str!("../../config/tenants.yaml")).unwrap();
        assert_eq!(file.tenants.len(), 5);
    }

    #[test]
    fn a_bad_time_zone_is_refused_naming_the_field() {
        let text = include_str!("../../config/tenants.yaml").replacen(
            "America/New_York",
            "Mars/Olympus_Mons",
            1,
        );
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("timeZone"), "{err}");
        assert!(err.contains("acme-corp"), "{err}");
        assert!(err.contains("Mars/Olympus_Mons"), "{err}");
    }

    #[test]
    fn reserved_floors_are_shares_of_the_pool_for_enterprise_tenants() {
        let file = parse(include_str!("../../config/tenants.yaml")).unwrap();
        let acme = file.tenants.iter().find(|t| t.name == "acme-corp").unwrap();
        assert_eq!(acme.validate().unwrap().reserved_floor_bp, Some(3_000));
        let text = include_str!("../../config/tenants.yaml").replacen(
            "plan: standard",
            "plan: standard\n    reservedFloor: \"0.1\"",
            1,
        );
        let err = parse(&text).unwrap_err().to_string();
        assert!(
            err.contains("reservedFloor") && err.contains("only enterprise"),
            "{err}"
        );
    }

    #[test]
    fn chargeback_since_is_a_date_on_a_tenant_out_of_shadow_mode() {
        let base = include_str!("../../config/tenants.yaml");
        let acme = |extra: &str| {
            base.replacen(
                "    shadow: false",
                &format!("    shadow: false\n    {extra}"),
                1,
            )
        };
        let file = parse(&acme("chargebackSince: \"2026-11-01\"")).unwrap();
        assert_eq!(
            file.tenants[0].validate().unwrap().chargeback_since,
            Some("2026-11-01".parse().unwrap())
        );
        let err = parse(&acme("chargebackSince: \"November\""))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("chargebackSince") && err.contains("acme-corp"),
            "{err}"
        );
        // finserv-team is in shadow mode.
        let text = base.replacen(
            "shadow: true",
            "shadow: true\n    chargebackSince: \"2026-11-01\"",
            1,
        );
        let err = parse(&text).unwrap_err().to_string();
        assert!(
            err.contains("chargebackSince") && err.contains("shadow mode"),
            "{err}"
        );
    }

    #[test]
    fn a_key_under_16_characters_is_refused_naming_its_id_not_the_key() {
        let base = include_str!("../../config/tenants.yaml");
        let at = |key: &str| base.replacen("sk-demo-acme-corp-0001", key, 1);
        assert!(parse(&at("sk-0123456789abc")).is_ok(), "16 characters pass");
        let err = parse(&at("sk-0123456789ab")).unwrap_err().to_string();
        assert!(
            err.contains("acme-corp") && err.contains("key_acme_demo"),
            "{err}"
        );
        assert!(err.contains("shorter than 16 characters"), "{err}");
        assert!(!err.contains("sk-0123456789ab"), "the key itself: {err}");
    }

    #[test]
    fn a_bad_billing_mode_is_refused_naming_the_field() {
        let text = include_str!("../../config/tenants.yaml").replacen(
            "billingMode: per_token",
            "billingMode: per_vibe",
            1,
        );
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("billingMode"), "{err}");
    }
}
