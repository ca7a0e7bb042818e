//! Standard Webhooks signing and verification (<https://www.standardwebhooks.com/>), plus the
//! legacy `X-Fanout-Signature` header. The same code signs subscriber deliveries and the origin's
//! calls to the edge.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq as _;

type HmacSha256 = Hmac<Sha256>;

pub const HEADER_ID: &str = "webhook-id";
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
pub const HEADER_SIGNATURE: &str = "webhook-signature";
pub const HEADER_LEGACY: &str = "x-fanout-signature";
/// The subscriber's count of deliveries in fan-out order (from 1, gap-free): not signed, like
/// the id and timestamp it travels beside.
pub const HEADER_SEQUENCE: &str = "webhook-sequence";
/// An ordered delivery's key (ordering by key) and the sequence of its key's previous delivery.
pub const HEADER_ORDERING_KEY: &str = "webhook-ordering-key";
pub const HEADER_PREVIOUS_SEQUENCE: &str = "webhook-previous-sequence";
/// How far a signed timestamp may be from now, either way.
pub const TOLERANCE_SECS: i64 = 300;
/// Most signatures [`verify`] looks at in one `webhook-signature` header; more is refused
/// unread (a sender has one per active secret, two during a rotation).
pub const MAX_SIGNATURES: usize = 10;

const PREFIX: &str = "whsec_";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a secret must start with whsec_")]
    Prefix,
    #[error("a secret must be whsec_ followed by base64")]
    Base64,
    #[error("a secret must hold 24 to 64 bytes, this one holds {0}")]
    Length(usize),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("missing {0} header")]
    MissingHeader(&'static str),
    #[error("webhook-timestamp is not a unix timestamp")]
    BadTimestamp,
    #[error("webhook-timestamp is more than {TOLERANCE_SECS} s away from now")]
    StaleTimestamp,
    #[error("no signature matches")]
    NoMatch,
    #[error("webhook-signature holds more than {MAX_SIGNATURES} signatures")]
    TooManySignatures,
}

/// A parsed `whsec_` secret: the raw key bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl Secret {
    pub fn parse(s: &str) -> Result<Secret, SecretError> {
        let b64 = s.strip_prefix(PREFIX).ok_or(SecretError::Prefix)?;
        let key = B64.decode(b64).map_err(|_| SecretError::Base64)?;
        if !(24..=64).contains(&key.len()) {
            return Err(SecretError::Length(key.len()));
        }
        Ok(Secret(key))
    }

    /// Build a secret from random bytes the caller drew (the core has no RNG).
    pub fn from_bytes(random: &[u8]) -> Result<Secret, SecretError> {
        if !(24..=64).contains(&random.len()) {
            return Err(SecretError::Length(random.len()));
        }
        Ok(Secret(random.to_vec()))
    }

    /// The `whsec_…` text form.
    pub fn encode(&self) -> String {
        format!("{PREFIX}{}", B64.encode(&self.0))
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length, so this cannot fail.
        match HmacSha256::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC-SHA256 takes keys of any length"),
        }
    }

    /// `v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = self.mac();
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
    }

    /// `sha256=<hex HMAC-SHA256(key, body)>`, the legacy header's value.
    pub fn sign_legacy(&self, body: &[u8]) -> String {
        let mut mac = self.mac();
        mac.update(body);
        let digest = mac.finalize().into_bytes();
        let mut out = String::with_capacity(7 + 64);
        out.push_str("sha256=");
        for b in digest {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }
}

/// The `webhook-signature` value: one `v1,` signature per secret, space-separated.
pub fn signature_header(secrets: &[Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|s| s.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The three Standard Webhooks headers of one signed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedHeaders {
    pub id: String,
    pub timestamp: String,
    pub signature: String,
}

pub fn sign_headers(secrets: &[Secret], id: &str, now_secs: i64, body: &[u8]) -> SignedHeaders {
    SignedHeaders {
        id: id.to_string(),
        timestamp: now_secs.to_string(),
        signature: signature_header(secrets, id, now_secs, body),
    }
}

/// What a call without a body signs in the body's place: its method and path,
/// `"{METHOD} {path}"` (the path as sent, percent-encoded). The origin's signed read of the
/// edge, `GET /v1/subscribers/{id}`, signs this, so a signature made for one subscriber's path
/// is worthless on another's.
pub fn bodiless_message(method: &str, path: &str) -> Vec<u8> {
    format!("{method} {path}").into_bytes()
}

/// Verify a Standard Webhooks request: the timestamp must be within [`TOLERANCE_SECS`] of
/// `now_secs` and one `v1` signature must match one of `secrets`. The cost does not depend on
/// what the header holds: one HMAC per secret, computed once, then each candidate (at most
/// [`MAX_SIGNATURES`]) compared with it in constant time.
pub fn verify(
    secrets: &[Secret],
    id: Option<&str>,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now_secs: i64,
) -> Result<(), VerifyError> {
    let id = id.ok_or(VerifyError::MissingHeader(HEADER_ID))?;
    let ts_text = timestamp.ok_or(VerifyError::MissingHeader(HEADER_TIMESTAMP))?;
    let sig = signature.ok_or(VerifyError::MissingHeader(HEADER_SIGNATURE))?;
    let ts: i64 = ts_text
        .trim()
        .parse()
        .map_err(|_| VerifyError::BadTimestamp)?;
    if (now_secs - ts).abs() > TOLERANCE_SECS {
        return Err(VerifyError::StaleTimestamp);
    }
    let candidates = || sig.split(' ').filter(|c| !c.is_empty());
    if candidates().nth(MAX_SIGNATURES).is_some() {
        return Err(VerifyError::TooManySignatures);
    }
    let expected: Vec<_> = secrets
        .iter()
        .map(|secret| {
            let mut mac = secret.mac();
            mac.update(id.as_bytes());
            mac.update(b".");
            mac.update(ts_text.trim().as_bytes());
            mac.update(b".");
            mac.update(body);
            mac.finalize().into_bytes()
        })
        .collect();
    let mut matched = subtle::Choice::from(0);
    for candidate in candidates() {
        let Some(b64) = candidate.strip_prefix("v1,") else {
            continue;
        };
        let Ok(given) = B64.decode(b64) else {
            continue;
        };
        for digest in &expected {
            // Unequal lengths compare false at once: a digest's length is no secret.
            matched |= digest.as_slice().ct_eq(&given);
        }
    }
    if bool::from(matched) {
        Ok(())
    } else {
        Err(VerifyError::NoMatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The Standard Webhooks specification's own test vector.
    const SPEC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const SPEC_TS: i64 = 1614265330;
    const SPEC_BODY: &str = r#"{"test": 2432232314}"#;
    const SPEC_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn spec_vector_signs_and_verifies() {
        // The spec's example key is 24 bytes.
        let s = Secret::parse(SPEC_SECRET).unwrap();
        assert_eq!(s.sign(SPEC_ID, SPEC_TS, SPEC_BODY.as_bytes()), SPEC_SIG);
        verify(
            &[s],
            Some(SPEC_ID),
            Some("1614265330"),
            Some(SPEC_SIG),
            SPEC_BODY.as_bytes(),
            SPEC_TS + 10,
        )
        .unwrap();
    }

    fn check_parse(input: &str, expected: Result<usize, SecretError>) {
        let got = Secret::parse(input).map(|s| s.0.len());
        assert_eq!(got, expected, "input {input:?}");
    }

    #[test]
    fn secret_parsing() {
        check_parse(SPEC_SECRET, Ok(24));
        check_parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", Err(SecretError::Prefix));
        check_parse("whsec_!!!", Err(SecretError::Base64));
        check_parse("whsec_AAAA", Err(SecretError::Length(3)));
        let long = format!("whsec_{}", B64.encode([7u8; 65]));
        check_parse(&long, Err(SecretError::Length(65)));
        let max = format!("whsec_{}", B64.encode([7u8; 64]));
        check_parse(&max, Ok(64));
    }

    #[test]
    fn encode_round_trips() {
        let s = Secret::from_bytes(&[9u8; 32]).unwrap();
        assert_eq!(Secret::parse(&s.encode()).unwrap(), s);
        assert_eq!(Secret::from_bytes(&[1u8; 8]), Err(SecretError::Length(8)));
    }

    #[test]
    fn verify_table() {
        let old = Secret::from_bytes(&[1u8; 32]).unwrap();
        let new = Secret::from_bytes(&[2u8; 32]).unwrap();
        let other = Secret::from_bytes(&[3u8; 32]).unwrap();
        let body = b"{\"a\":1}";
        let both = signature_header(&[new.clone(), old.clone()], "evt_1", 1000, body);
        assert_eq!(both.split(' ').count(), 2);
        type Case<'a> = (
            &'a str,
            Vec<Secret>,
            Option<&'a str>,
            Option<&'a str>,
            &'a [u8],
            i64,
            Result<(), VerifyError>,
        );
        let cases: Vec<Case> = vec![
            (
                "rotation: old key verifies",
                vec![old.clone()],
                Some("1000"),
                Some(&both),
                body,
                1000,
                Ok(()),
            ),
            (
                "rotation: new key verifies",
                vec![new.clone()],
                Some("1000"),
                Some(&both),
                body,
                1000,
                Ok(()),
            ),
            (
                "unknown key",
                vec![other.clone()],
                Some("1000"),
                Some(&both),
                body,
                1000,
                Err(VerifyError::NoMatch),
            ),
            (
                "tampered body",
                vec![old.clone()],
                Some("1000"),
                Some(&both),
                b"{\"a\":2}",
                1000,
                Err(VerifyError::NoMatch),
            ),
            (
                "stale",
                vec![old.clone()],
                Some("1000"),
                Some(&both),
                body,
                1301,
                Err(VerifyError::StaleTimestamp),
            ),
            (
                "future",
                vec![old.clone()],
                Some("1000"),
                Some(&both),
                body,
                699,
                Err(VerifyError::StaleTimestamp),
            ),
            (
                "edge of tolerance",
                vec![old.clone()],
                Some("1000"),
                Some(&both),
                body,
                1300,
                Ok(()),
            ),
            (
                "no timestamp",
                vec![old.clone()],
                None,
                Some(&both),
                body,
                1000,
                Err(VerifyError::MissingHeader(HEADER_TIMESTAMP)),
            ),
            (
                "no signature",
                vec![old.clone()],
                Some("1000"),
                None,
                body,
                1000,
                Err(VerifyError::MissingHeader(HEADER_SIGNATURE)),
            ),
            (
                "bad timestamp",
                vec![old.clone()],
                Some("soon"),
                Some(&both),
                body,
                1000,
                Err(VerifyError::BadTimestamp),
            ),
        ];
        for (name, secrets, ts, sig, body, now, expected) in cases {
            assert_eq!(
                verify(&secrets, Some("evt_1"), ts, sig, body, now),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn verify_refuses_garbage_and_a_missing_id() {
        let key = Secret::from_bytes(&[1u8; 32]).unwrap();
        let body = b"{\"a\":1}";
        let good = signature_header(std::slice::from_ref(&key), "evt_1", 1000, body);
        let verify_key = |id, sig| {
            verify(
                std::slice::from_ref(&key),
                id,
                Some("1000"),
                Some(sig),
                body,
                1000,
            )
        };
        assert_eq!(verify_key(Some("evt_1"), good.as_str()), Ok(()));
        assert_eq!(
            verify_key(Some("evt_1"), "v1,!!! v2,abc"),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            verify_key(None, good.as_str()),
            Err(VerifyError::MissingHeader(HEADER_ID))
        );
    }

    #[test]
    fn signature_count_is_capped() {
        let key = Secret::from_bytes(&[1u8; 32]).unwrap();
        let body = b"{}";
        let good = key.sign("call_1", 1000, body);
        let junk = "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        let header = |n_junk: usize| {
            let mut parts = vec![junk; n_junk];
            parts.push(&good);
            parts.join(" ")
        };
        let check = |sig: &str| {
            verify(
                std::slice::from_ref(&key),
                Some("call_1"),
                Some("1000"),
                Some(sig),
                body,
                1000,
            )
        };
        // The valid one is found in last place among the most allowed ...
        assert_eq!(check(&header(MAX_SIGNATURES - 1)), Ok(()));
        // ... extra spaces are no signatures ...
        assert_eq!(
            check(&format!("  {}  ", header(MAX_SIGNATURES - 1))),
            Ok(())
        );
        // ... and one more is refused before any HMAC, valid one included.
        assert_eq!(
            check(&header(MAX_SIGNATURES)),
            Err(VerifyError::TooManySignatures)
        );
        assert_eq!(
            check(&vec!["x"; 100_000].join(" ")),
            Err(VerifyError::TooManySignatures)
        );
    }

    #[test]
    fn legacy_header_is_hex_hmac_of_body() {
        // HMAC-SHA256("key", "The quick brown fox jumps over the lazy dog"), RFC 4231-style known answer.
        let s = Secret(b"key".to_vec());
        assert_eq!(
            s.sign_legacy(b"The quick brown fox jumps over the lazy dog"),
            "sha256=f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
        );
    }

    #[test]
    fn a_bodiless_call_signs_its_method_and_path() {
        let key = Secret::from_bytes(&[7u8; 32]).unwrap();
        let signed = bodiless_message("GET", "/v1/subscribers/sub_a");
        assert_eq!(signed, b"GET /v1/subscribers/sub_a");
        let h = sign_headers(std::slice::from_ref(&key), "call_1", 1_000, &signed);
        let check = |message: &[u8]| {
            verify(
                std::slice::from_ref(&key),
                Some(&h.id),
                Some(&h.timestamp),
                Some(&h.signature),
                message,
                1_000,
            )
        };
        assert!(check(&signed).is_ok());
        for other in [
            bodiless_message("GET", "/v1/subscribers/sub_b"),
            bodiless_message("POST", "/v1/subscribers/sub_a"),
            Vec::new(),
        ] {
            assert!(
                check(&other).is_err(),
                "{}",
                String::from_utf8_lossy(&other)
            );
        }
    }
}
