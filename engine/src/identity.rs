//! The tenant identity a gateway forwards to an engine, signed, so an engine
//! reachable by more than the gateway cannot be told another tenant's name
//! (and so read that tenant's prefix cache, or bill to it).
//!
//! One header, `x-meterline-identity`, whose value is
//!
//! ```text
//! v1.<hex of the tenant id>.<service class>.<expiry, unix seconds>.<hex HMAC-SHA256>
//! ```
//!
//! The MAC covers everything before its own dot (`v1.<tenant>.<class>.<expiry>`)
//! under a secret the gateway and the engine share. The tenant is hex so
//! that a tenant id with dots cannot shift the fields. A token lives
//! [`LIFETIME_SECS`] from signing; [`SKEW_SECS`] of clock difference between
//! the two hosts is tolerated either way. The MAC is compared in constant
//! time (`hmac`'s `verify_slice`) before any field is trusted.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::scheduler::ServiceClass;

/// The header that carries the token.
pub const HEADER: &str = "x-meterline-identity";
/// How long a token is valid after it is signed.
pub const LIFETIME_SECS: u64 = 60;
/// Clock difference tolerated between signer and verifier, both ways.
pub const SKEW_SECS: u64 = 30;
/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 32;

const VERSION: &str = "v1";
/// Domain of the unkeyed per-tenant cache salt.
const SALT_DOMAIN: &[u8] = b"meterline cache_salt v1\0";

type HmacSha256 = Hmac<Sha256>;

/// A shared secret of at least [`MIN_SECRET_BYTES`]; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

/// A secret below [`MIN_SECRET_BYTES`]; the caller names the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("is {len} bytes long; at least {MIN_SECRET_BYTES} are required")]
pub struct SecretTooShort {
    pub len: usize,
}

impl Secret {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, SecretTooShort> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(SecretTooShort { len: bytes.len() });
        }
        Ok(Self(bytes))
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes a key of any length; this cannot fail.
        <HmacSha256 as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub tenant: String,
    pub class: ServiceClass,
    /// Unix seconds.
    pub expires: u64,
}

/// Why a token was refused; the message names the header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("x-meterline-identity is missing")]
    Missing,
    #[error("x-meterline-identity is malformed: {0}")]
    Malformed(&'static str),
    #[error("x-meterline-identity has a bad signature")]
    BadSignature,
    #[error("x-meterline-identity has expired")]
    Expired,
    /// Valid for longer than a token is issued for: a clock far ahead, or forged.
    #[error("x-meterline-identity expires too far in the future")]
    FromTheFuture,
}

/// Signs identities for one upstream.
#[derive(Debug, Clone)]
pub struct Signer {
    secret: Secret,
}

impl Signer {
    pub fn new(secret: Secret) -> Self {
        Self { secret }
    }

    /// The header value for `tenant` and `class`, valid [`LIFETIME_SECS`]
    /// from `now` (unix seconds).
    pub fn sign(&self, tenant: &str, class: ServiceClass, now: u64) -> String {
        self.sign_until(tenant, class, now.saturating_add(LIFETIME_SECS))
    }

    /// The header value with an explicit expiry (tests use it for tokens
    /// already expired).
    pub fn sign_until(&self, tenant: &str, class: ServiceClass, expires: u64) -> String {
        let payload = format!(
            "{VERSION}.{}.{}.{expires}",
            hex::encode(tenant),
            class.as_str()
        );
        let mut mac = self.secret.mac();
        mac.update(payload.as_bytes());
        format!("{payload}.{}", hex::encode(mac.finalize().into_bytes()))
    }

    /// A value only `tenant` gets, keyed by this secret (vLLM's `cache_salt`).
    pub fn cache_salt(&self, tenant: &str) -> String {
        let mut mac = self.secret.mac();
        mac.update(SALT_DOMAIN);
        mac.update(tenant.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

/// A per-tenant `cache_salt` without a secret: SHA-256 over a fixed
/// domain and the tenant id.
pub fn unkeyed_cache_salt(tenant: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(SALT_DOMAIN);
    hash.update(tenant.as_bytes());
    hex::encode(hash.finalize())
}

/// Now in unix seconds, the clock tokens are signed and checked against.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Checks a header value (`None`: the header was absent) at `now` (unix
/// seconds) and returns the identity it carries.
pub fn verify(header: Option<&str>, secret: &Secret, now: u64) -> Result<Identity, IdentityError> {
    let token = header.ok_or(IdentityError::Missing)?;
    let (payload, mac_hex) = token.rsplit_once('.').ok_or(IdentityError::Malformed(
        "expected five dot-separated fields",
    ))?;
    let fields: Vec<&str> = payload.split('.').collect();
    let &[version, tenant_hex, class, expires] = fields.as_slice() else {
        return Err(IdentityError::Malformed(
            "expected five dot-separated fields",
        ));
    };
    if version != VERSION {
        return Err(IdentityError::Malformed("unknown version"));
    }
    let tag = hex::decode(mac_hex).map_err(|_| IdentityError::Malformed("signature is not hex"))?;
    let mut mac = secret.mac();
    mac.update(payload.as_bytes());
    mac.verify_slice(&tag)
        .map_err(|_| IdentityError::BadSignature)?;
    // Signed by a holder of the secret from here on.
    let tenant = hex::decode(tenant_hex)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or(IdentityError::Malformed("tenant is not hex of UTF-8"))?;
    let class =
        ServiceClass::parse(class).ok_or(IdentityError::Malformed("unknown service class"))?;
    let expires: u64 = expires
        .parse()
        .map_err(|_| IdentityError::Malformed("expiry is not unix seconds"))?;
    if expires.saturating_add(SKEW_SECS) < now {
        return Err(IdentityError::Expired);
    }
    if expires > now.saturating_add(LIFETIME_SECS + SKEW_SECS) {
        return Err(IdentityError::FromTheFuture);
    }
    Ok(Identity {
        tenant,
        class,
        expires,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn secret(fill: u8) -> Secret {
        Secret::new(vec![fill; MIN_SECRET_BYTES]).unwrap()
    }

    /// Replaces field `i` (0-based, of five) of a token, keeping its MAC.
    fn with_field(token: &str, i: usize, value: &str) -> String {
        let mut fields: Vec<&str> = token.split('.').collect();
        fields[i] = value;
        fields.join(".")
    }

    #[test]
    fn a_signed_identity_verifies_to_what_was_signed() {
        let token = Signer::new(secret(7)).sign("acme", ServiceClass::Reserved, NOW);
        let id = verify(Some(&token), &secret(7), NOW).unwrap();
        assert_eq!(
            id,
            Identity {
                tenant: "acme".into(),
                class: ServiceClass::Reserved,
                expires: NOW + LIFETIME_SECS,
            }
        );
    }

    #[test]
    fn a_tenant_with_dots_round_trips() {
        let token = Signer::new(secret(7)).sign("eu.acme.team-1", ServiceClass::BestEffort, NOW);
        assert_eq!(token.split('.').count(), 5);
        let id = verify(Some(&token), &secret(7), NOW).unwrap();
        assert_eq!(id.tenant, "eu.acme.team-1");
        assert_eq!(id.class, ServiceClass::BestEffort);
    }

    #[test]
    fn a_tampered_tenant_class_or_expiry_has_a_bad_signature() {
        let token = Signer::new(secret(7)).sign("acme", ServiceClass::BestEffort, NOW);
        for tampered in [
            with_field(&token, 1, &hex::encode("globex")),
            with_field(&token, 2, "reserved"),
            with_field(&token, 3, &(NOW + 50).to_string()),
        ] {
            assert_eq!(
                verify(Some(&tampered), &secret(7), NOW),
                Err(IdentityError::BadSignature),
                "{tampered}"
            );
        }
    }

    #[test]
    fn a_token_signed_with_another_secret_has_a_bad_signature() {
        let token = Signer::new(secret(1)).sign("acme", ServiceClass::Standard, NOW);
        assert_eq!(
            verify(Some(&token), &secret(2), NOW),
            Err(IdentityError::BadSignature)
        );
    }

    #[test]
    fn a_token_expires_after_its_lifetime_plus_the_skew() {
        let signer = Signer::new(secret(7));
        let token = signer.sign("acme", ServiceClass::Standard, NOW);
        let edge = NOW + LIFETIME_SECS + SKEW_SECS;
        assert!(verify(Some(&token), &secret(7), edge).is_ok());
        assert_eq!(
            verify(Some(&token), &secret(7), edge + 1),
            Err(IdentityError::Expired)
        );
        let old = signer.sign_until("acme", ServiceClass::Standard, NOW - 3600);
        assert_eq!(
            verify(Some(&old), &secret(7), NOW),
            Err(IdentityError::Expired)
        );
    }

    #[test]
    fn a_signer_clock_ahead_within_the_skew_is_accepted_beyond_it_refused() {
        let signer = Signer::new(secret(7));
        let ahead = signer.sign("acme", ServiceClass::Standard, NOW + SKEW_SECS);
        assert!(verify(Some(&ahead), &secret(7), NOW).is_ok());
        let far = signer.sign("acme", ServiceClass::Standard, NOW + SKEW_SECS + 1);
        assert_eq!(
            verify(Some(&far), &secret(7), NOW),
            Err(IdentityError::FromTheFuture)
        );
    }

    #[test]
    fn missing_and_malformed_tokens_are_named() {
        assert_eq!(verify(None, &secret(7), NOW), Err(IdentityError::Missing));
        let token = Signer::new(secret(7)).sign("acme", ServiceClass::Standard, NOW);
        for bad in [
            String::new(),
            "acme".to_owned(),
            with_field(&token, 0, "v2"),
            with_field(&token, 4, "not-hex"),
            format!("{token}.extra"),
        ] {
            assert!(
                matches!(
                    verify(Some(&bad), &secret(7), NOW),
                    Err(IdentityError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
        assert_eq!(
            IdentityError::Expired.to_string(),
            "x-meterline-identity has expired"
        );
    }

    #[test]
    fn a_secret_below_32_bytes_is_refused() {
        assert_eq!(
            Secret::new(vec![0; 31]).unwrap_err(),
            SecretTooShort { len: 31 }
        );
        assert!(!format!("{:?}", secret(b'x')).contains("xxxx"));
    }

    #[test]
    fn cache_salts_differ_by_tenant_and_by_key() {
        let a = Signer::new(secret(1));
        let b = Signer::new(secret(2));
        assert_ne!(a.cache_salt("acme"), a.cache_salt("globex"));
        assert_ne!(a.cache_salt("acme"), b.cache_salt("acme"));
        assert_eq!(a.cache_salt("acme"), a.cache_salt("acme"));
        assert_ne!(unkeyed_cache_salt("acme"), unkeyed_cache_salt("globex"));
        assert_eq!(unkeyed_cache_salt("acme").len(), 64);
    }
}
