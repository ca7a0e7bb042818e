//! Portal tokens (pure): `fpt_<payload>.<mac>`, both base64url without padding. The payload is
//! `{"c": customer, "n": that customer's portal nonce, "e": expiry in unix ms}`; the MAC is
//! HMAC-SHA256 over the payload's text with the daemon's portal key (generated on a ledger's
//! first start and kept in it: `crate::ledger::portal_key`). Checking a token here proves the
//! daemon issued it and that it has not expired; the caller then checks the nonce against the
//! customer in the ledger, so a removed customer's tokens stop working.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

pub const PREFIX: &str = "fpt_";
pub const DEFAULT_TTL_SECS: u64 = 3600;
/// A link lives at most a week; the operator's product asks for a fresh one when it shows it.
pub const MAX_TTL_SECS: u64 = 7 * 24 * 3600;
pub const MIN_TTL_SECS: u64 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    #[serde(rename = "c")]
    pub customer: String,
    #[serde(rename = "n")]
    pub nonce: String,
    #[serde(rename = "e")]
    pub expires_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("not a portal token")]
    Malformed,
    #[error("the portal token's signature does not match")]
    BadSignature,
    #[error("the portal link has expired")]
    Expired,
}

fn mac(key: &[u8], payload: &str) -> Hmac<Sha256> {
    // HMAC takes a key of any length: new_from_slice cannot fail.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    m.update(payload.as_bytes());
    m
}

pub fn sign(key: &[u8], claims: &Claims) -> String {
    let json = serde_json::to_vec(claims).unwrap_or_default();
    let payload = URL_SAFE_NO_PAD.encode(json);
    let tag = URL_SAFE_NO_PAD.encode(mac(key, &payload).finalize().into_bytes());
    format!("{PREFIX}{payload}.{tag}")
}

/// Is this token one the daemon signed with `key`, still valid at `now_ms`? Its claims if so.
pub fn verify(key: &[u8], token: &str, now_ms: i64) -> Result<Claims, TokenError> {
    let body = token.strip_prefix(PREFIX).ok_or(TokenError::Malformed)?;
    let (payload, tag) = body.split_once('.').ok_or(TokenError::Malformed)?;
    // Strict decoding: a changed character never decodes to the same bytes.
    let tag = URL_SAFE_NO_PAD
        .decode(tag)
        .map_err(|_| TokenError::BadSignature)?;
    mac(key, payload)
        .verify_slice(&tag)
        .map_err(|_| TokenError::BadSignature)?;
    let json = URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| TokenError::Malformed)?;
    let claims: Claims = serde_json::from_slice(&json).map_err(|_| TokenError::Malformed)?;
    if now_ms >= claims.expires_ms {
        return Err(TokenError::Expired);
    }
    Ok(claims)
}

/// The TTL a link request asks for, bounded (pure).
pub fn ttl_secs(asked: Option<u64>) -> Result<u64, String> {
    match asked {
        None => Ok(DEFAULT_TTL_SECS),
        Some(t) if (MIN_TTL_SECS..=MAX_TTL_SECS).contains(&t) => Ok(t),
        Some(t) => Err(format!(
            "ttl_secs must be {MIN_TTL_SECS} to {MAX_TTL_SECS}, not {t}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (name, token, key, now, expected)
    type Case<'a> = (
        &'static str,
        String,
        &'a [u8],
        i64,
        Result<Claims, TokenError>,
    );

    fn claims() -> Claims {
        Claims {
            customer: "acme".into(),
            nonce: "n1".into(),
            expires_ms: 10_000,
        }
    }

    /// Change the character at `i` to another base64url character.
    fn flip(token: &str, i: usize) -> String {
        let mut b = token.as_bytes().to_vec();
        b[i] = if b[i] == b'A' { b'B' } else { b'A' };
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn token_table() {
        let key = b"portal-key-portal-key-portal-key";
        let t = sign(key, &claims());
        assert!(t.starts_with(PREFIX));
        let cases: Vec<Case> = vec![
            ("valid", t.clone(), key, 9_999, Ok(claims())),
            (
                "at expiry",
                t.clone(),
                key,
                10_000,
                Err(TokenError::Expired),
            ),
            (
                "other key",
                t.clone(),
                b"another-key",
                1,
                Err(TokenError::BadSignature),
            ),
            (
                "no prefix",
                t[PREFIX.len()..].to_string(),
                key,
                1,
                Err(TokenError::Malformed),
            ),
            (
                "no mac",
                t.split('.').next().unwrap().to_string(),
                key,
                1,
                Err(TokenError::Malformed),
            ),
            (
                "admin-like",
                "secret-token".into(),
                key,
                1,
                Err(TokenError::Malformed),
            ),
            ("empty", String::new(), key, 1, Err(TokenError::Malformed)),
        ];
        for (name, token, k, now, expected) in cases {
            assert_eq!(verify(k, &token, now), expected, "{name}");
        }
        // Every single-character change anywhere after the prefix is refused: in the payload
        // the MAC no longer matches, in the MAC it no longer decodes or matches.
        for i in PREFIX.len()..t.len() {
            if t.as_bytes()[i] == b'.' {
                continue;
            }
            assert!(verify(key, &flip(&t, i), 1).is_err(), "changed at {i}");
        }
        // A payload re-signed by someone without the key (say, another customer) is refused.
        let forged = {
            let other = Claims {
                customer: "globex".into(),
                ..claims()
            };
            let mine = sign(b"attacker", &other);
            let (p, _) = mine[PREFIX.len()..].split_once('.').unwrap();
            let (_, tag) = t[PREFIX.len()..].split_once('.').unwrap();
            format!("{PREFIX}{p}.{tag}")
        };
        assert_eq!(verify(key, &forged, 1), Err(TokenError::BadSignature));
    }

    #[test]
    fn ttl_table() {
        assert_eq!(ttl_secs(None), Ok(3600));
        assert_eq!(ttl_secs(Some(60)), Ok(60));
        assert!(ttl_secs(Some(0)).is_err());
        assert!(ttl_secs(Some(MAX_TTL_SECS + 1)).is_err());
    }
}
