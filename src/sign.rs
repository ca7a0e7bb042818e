//! Standard Webhooks signing and verification (<https://www.standardwebhooks.com/>), plus the
//! legacy `X-Fanout-Signature` header. The same code signs subscriber deliveries and the origin's
//! calls to the edge.
//!
//! Two schemes sign the same message, `"{id}.{timestamp}.{body}"`: `v1` is HMAC-SHA256 with a
//! shared `whsec_` secret, `v1a` is Ed25519 (RFC 8032) with a `whsk_` signing key whose public
//! half (`whpk_` + base64 of its 32 bytes) is all a receiver needs. [`Keys`] is what signs one
//! request: the subscriber's [`Scheme`] decides which of its keys take part.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ed25519_dalek::Signer as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
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
const SIGNING_KEY_PREFIX: &str = "whsk_";
const PUBLIC_KEY_PREFIX: &str = "whpk_";

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

/// Which signatures a subscriber's webhooks carry (its `"signature"`): `v1` (HMAC-SHA256 with
/// its `whsec_` secrets, the default), `v1a` (Ed25519 with its signing keys), or both in one
/// header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    #[default]
    Hmac,
    Ed25519,
    Both,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Hmac => "hmac",
            Scheme::Ed25519 => "ed25519",
            Scheme::Both => "both",
        }
    }

    pub fn parse(s: &str) -> Option<Scheme> {
        match s {
            "hmac" => Some(Scheme::Hmac),
            "ed25519" => Some(Scheme::Ed25519),
            "both" => Some(Scheme::Both),
            _ => None,
        }
    }

    /// Whether `v1` (HMAC) signatures are sent.
    pub fn hmac(self) -> bool {
        matches!(self, Scheme::Hmac | Scheme::Both)
    }

    /// Whether `v1a` (Ed25519) signatures are sent.
    pub fn ed25519(self) -> bool {
        matches!(self, Scheme::Ed25519 | Scheme::Both)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("a signing key must be whsk_ followed by the base64 of 32 bytes")]
    SigningKey,
    #[error("a public key must be whpk_ followed by the base64 of 32 bytes")]
    PublicKey,
}

/// An Ed25519 signing key (`whsk_` + base64 of its 32-byte RFC 8032 seed). Parsed once and
/// kept: parsing derives the public key (a scalar multiplication, about as costly as a
/// signature), signing does not repeat it.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey(ed25519_dalek::SigningKey);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({})", self.public_key().encode())
    }
}

impl SigningKey {
    pub fn parse(s: &str) -> Result<SigningKey, KeyError> {
        let b64 = s
            .strip_prefix(SIGNING_KEY_PREFIX)
            .ok_or(KeyError::SigningKey)?;
        let seed = B64.decode(b64).map_err(|_| KeyError::SigningKey)?;
        SigningKey::from_seed(&seed)
    }

    /// The key of a 32-byte seed the caller drew (the core has no RNG).
    pub fn from_seed(random: &[u8]) -> Result<SigningKey, KeyError> {
        let seed: [u8; 32] = random.try_into().map_err(|_| KeyError::SigningKey)?;
        Ok(SigningKey(ed25519_dalek::SigningKey::from_bytes(&seed)))
    }

    /// The `whsk_…` text form (private: it never leaves the daemon but to sign).
    pub fn encode(&self) -> String {
        format!("{SIGNING_KEY_PREFIX}{}", B64.encode(self.0.as_bytes()))
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    /// `v1a,<base64 Ed25519(key, "{id}.{timestamp}.{body}")>`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        self.sign_message(&message(id, timestamp, body))
    }

    fn sign_message(&self, message: &[u8]) -> String {
        format!("v1a,{}", B64.encode(self.0.sign(message).to_bytes()))
    }
}

/// An Ed25519 public key, `whpk_` + base64 of its 32 raw bytes: what a receiver verifies `v1a`
/// signatures with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(ed25519_dalek::VerifyingKey);

impl PublicKey {
    pub fn parse(s: &str) -> Result<PublicKey, KeyError> {
        let b64 = s
            .strip_prefix(PUBLIC_KEY_PREFIX)
            .ok_or(KeyError::PublicKey)?;
        let raw: [u8; 32] = B64
            .decode(b64)
            .map_err(|_| KeyError::PublicKey)?
            .try_into()
            .map_err(|_| KeyError::PublicKey)?;
        ed25519_dalek::VerifyingKey::from_bytes(&raw)
            .map(PublicKey)
            .map_err(|_| KeyError::PublicKey)
    }

    pub fn encode(&self) -> String {
        format!("{PUBLIC_KEY_PREFIX}{}", B64.encode(self.0.as_bytes()))
    }

    /// Whether one `v1a,<base64>` signature is this key's over `"{id}.{timestamp}.{body}"`.
    pub fn verifies(&self, id: &str, timestamp: i64, body: &[u8], signature: &str) -> bool {
        let Some(b64) = signature.strip_prefix("v1a,") else {
            return false;
        };
        let Ok(raw) = B64.decode(b64) else {
            return false;
        };
        let Ok(sig) = ed25519_dalek::Signature::from_slice(&raw) else {
            return false;
        };
        self.0
            .verify_strict(&message(id, timestamp, body), &sig)
            .is_ok()
    }
}

/// The signed message of both schemes: `"{id}.{timestamp}.{body}"`.
fn message(id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
    let ts = timestamp.to_string();
    let mut m = Vec::with_capacity(id.len() + ts.len() + body.len() + 2);
    m.extend_from_slice(id.as_bytes());
    m.push(b'.');
    m.extend_from_slice(ts.as_bytes());
    m.push(b'.');
    m.extend_from_slice(body);
    m
}

/// What signs one request: each `v1` secret adds a `v1,` signature and each Ed25519 key a
/// `v1a,` one to `webhook-signature` (newest first within each scheme; two of each during a
/// rotation's overlap); `legacy`, when set, signs `X-Fanout-Signature`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Keys {
    pub v1: Vec<Secret>,
    pub v1a: Vec<SigningKey>,
    pub legacy: Option<Secret>,
}

impl Keys {
    /// HMAC secrets alone (the origin's calls to the edge, alerts).
    pub fn hmac(secrets: Vec<Secret>) -> Keys {
        Keys {
            v1: secrets,
            ..Keys::default()
        }
    }

    /// A subscriber's keys as its `scheme` uses them: its active secrets (newest first) sign
    /// `v1` unless the scheme is `ed25519`, its signing keys sign `v1a` unless it is `hmac`;
    /// the legacy header, when asked for, is signed with the newest secret whatever the scheme.
    pub fn for_scheme(
        scheme: Scheme,
        secrets: Vec<Secret>,
        signing_keys: Vec<SigningKey>,
        legacy: bool,
    ) -> Keys {
        let legacy = if legacy {
            secrets.first().cloned()
        } else {
            None
        };
        Keys {
            v1: if scheme.hmac() { secrets } else { Vec::new() },
            v1a: if scheme.ed25519() {
                signing_keys
            } else {
                Vec::new()
            },
            legacy,
        }
    }

    /// Whether nothing would sign (`webhook-signature` would be empty).
    pub fn is_empty(&self) -> bool {
        self.v1.is_empty() && self.v1a.is_empty()
    }

    /// The `webhook-signature` value: the `v1,` signatures, then the `v1a,` ones,
    /// space-separated.
    pub fn signature_header(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut out: Vec<String> = self
            .v1
            .iter()
            .map(|s| s.sign(id, timestamp, body))
            .collect();
        if !self.v1a.is_empty() {
            let m = message(id, timestamp, body);
            out.extend(self.v1a.iter().map(|k| k.sign_message(&m)));
        }
        out.join(" ")
    }

    /// The legacy `X-Fanout-Signature` value, when asked for.
    pub fn legacy_header(&self, body: &[u8]) -> Option<String> {
        self.legacy.as_ref().map(|s| s.sign_legacy(body))
    }
}

/// The three Standard Webhooks headers of one signed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedHeaders {
    pub id: String,
    pub timestamp: String,
    pub signature: String,
}

pub fn sign_headers(keys: &Keys, id: &str, now_secs: i64, body: &[u8]) -> SignedHeaders {
    SignedHeaders {
        id: id.to_string(),
        timestamp: now_secs.to_string(),
        signature: keys.signature_header(id, now_secs, body),
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
        let both = Keys::hmac(vec![new.clone(), old.clone()]).signature_header("evt_1", 1000, body);
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
        let good = Keys::hmac(vec![key.clone()]).signature_header("evt_1", 1000, body);
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
        let h = sign_headers(&Keys::hmac(vec![key.clone()]), "call_1", 1_000, &signed);
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

    // RFC 8032, section 7.1, test 1: the key, its public half, and its signature of the
    // empty message.
    const RFC_SEED: &str = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=";
    const RFC_PUBLIC: &str = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
    const RFC_EMPTY_SIG: &str = "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b";
    // The same key signing the Standard Webhooks specification's message (computed apart with
    // Node's crypto.sign).
    const SPEC_V1A: &str = "v1a,fldxM4gAKugP6nnt1hdz3sgGfZ6d99nzrMFnZOELIxbzEHoVmAb2ADpkJK7zgPePmPsle0zV9jSeGlHFG2NVAw==";

    #[test]
    fn ed25519_known_answers() {
        let key = SigningKey::parse(RFC_SEED).unwrap();
        assert_eq!(key.public_key().encode(), RFC_PUBLIC);
        assert_eq!(key.encode(), RFC_SEED);
        let empty = key.sign_message(b"");
        let raw = B64.decode(empty.strip_prefix("v1a,").unwrap()).unwrap();
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, RFC_EMPTY_SIG);
        assert_eq!(key.sign(SPEC_ID, SPEC_TS, SPEC_BODY.as_bytes()), SPEC_V1A);
        let public = PublicKey::parse(RFC_PUBLIC).unwrap();
        assert!(public.verifies(SPEC_ID, SPEC_TS, SPEC_BODY.as_bytes(), SPEC_V1A));
        // A forged body, another id or time, or another key's signature does not verify.
        assert!(!public.verifies(SPEC_ID, SPEC_TS, br#"{"test": 2432232315}"#, SPEC_V1A));
        assert!(!public.verifies("msg_other", SPEC_TS, SPEC_BODY.as_bytes(), SPEC_V1A));
        assert!(!public.verifies(SPEC_ID, SPEC_TS + 1, SPEC_BODY.as_bytes(), SPEC_V1A));
        let other = SigningKey::from_seed(&[5u8; 32]).unwrap();
        let forged = other.sign(SPEC_ID, SPEC_TS, SPEC_BODY.as_bytes());
        assert!(!public.verifies(SPEC_ID, SPEC_TS, SPEC_BODY.as_bytes(), &forged));
        assert!(!public.verifies(SPEC_ID, SPEC_TS, SPEC_BODY.as_bytes(), "v1,AAAA"));
    }

    #[test]
    fn key_parsing_table() {
        let thirty_one = format!("whsk_{}", B64.encode([1u8; 31]));
        let rows: &[(&str, bool)] = &[
            (RFC_SEED, true),
            (&RFC_SEED[5..], false),
            ("whsk_!!!", false),
            (&thirty_one, false),
            (RFC_PUBLIC, false),
        ];
        for (text, ok) in rows {
            assert_eq!(SigningKey::parse(text).is_ok(), *ok, "{text}");
        }
        assert_eq!(PublicKey::parse(RFC_PUBLIC).unwrap().encode(), RFC_PUBLIC);
        assert_eq!(PublicKey::parse(RFC_SEED), Err(KeyError::PublicKey));
        assert_eq!(SigningKey::from_seed(&[1u8; 33]), Err(KeyError::SigningKey));
        // The debug form names the public key only.
        let shown = format!("{:?}", SigningKey::parse(RFC_SEED).unwrap());
        assert_eq!(shown, format!("SigningKey({RFC_PUBLIC})"));
    }

    #[test]
    fn scheme_names_round_trip() {
        for s in [Scheme::Hmac, Scheme::Ed25519, Scheme::Both] {
            assert_eq!(Scheme::parse(s.as_str()), Some(s));
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
        }
        assert_eq!(Scheme::parse("rsa"), None);
        assert_eq!(Scheme::default(), Scheme::Hmac);
    }

    /// Which signatures each scheme puts in `webhook-signature`, with one key of each kind and
    /// with a rotation's two: `v1` first, then `v1a`, each newest first; the legacy header is
    /// the newest secret's whatever the scheme.
    #[test]
    fn keys_by_scheme_table() {
        let (new_s, old_s) = (
            Secret::from_bytes(&[2u8; 32]).unwrap(),
            Secret::from_bytes(&[1u8; 32]).unwrap(),
        );
        let (new_k, old_k) = (
            SigningKey::from_seed(&[4u8; 32]).unwrap(),
            SigningKey::from_seed(&[3u8; 32]).unwrap(),
        );
        let body = b"{\"a\":1}";
        let rows: &[(Scheme, bool, &[&str])] = &[
            (Scheme::Hmac, false, &["v1"]),
            (Scheme::Ed25519, false, &["v1a"]),
            (Scheme::Both, false, &["v1", "v1a"]),
            (Scheme::Hmac, true, &["v1", "v1"]),
            (Scheme::Ed25519, true, &["v1a", "v1a"]),
            (Scheme::Both, true, &["v1", "v1", "v1a", "v1a"]),
        ];
        for &(scheme, rotating, expected) in rows {
            let (secrets, signing) = if rotating {
                (
                    vec![new_s.clone(), old_s.clone()],
                    vec![new_k.clone(), old_k.clone()],
                )
            } else {
                (vec![new_s.clone()], vec![new_k.clone()])
            };
            let keys = Keys::for_scheme(scheme, secrets, signing, true);
            let header = keys.signature_header("evt_1", 1000, body);
            let parts: Vec<&str> = header.split(' ').collect();
            let kinds: Vec<&str> = parts.iter().map(|p| p.split(',').next().unwrap()).collect();
            assert_eq!(kinds, expected, "{scheme:?} rotating {rotating}");
            // Each v1 verifies with the shared core's verifier, each v1a with its key.
            if scheme.hmac() {
                assert_eq!(
                    verify(
                        std::slice::from_ref(&old_s),
                        Some("evt_1"),
                        Some("1000"),
                        Some(&header),
                        body,
                        1000
                    )
                    .is_ok(),
                    rotating
                );
            }
            let v1a: Vec<&&str> = parts.iter().filter(|p| p.starts_with("v1a,")).collect();
            for (sig, key) in v1a.iter().zip([&new_k, &old_k]) {
                assert!(
                    key.public_key().verifies("evt_1", 1000, body, sig),
                    "{scheme:?}"
                );
            }
            assert_eq!(keys.legacy_header(body), Some(new_s.sign_legacy(body)));
        }
        let quiet = Keys::for_scheme(Scheme::Both, vec![new_s], vec![], false);
        assert_eq!(quiet.legacy_header(body), None);
        assert!(Keys::for_scheme(Scheme::Ed25519, vec![], vec![], false).is_empty());
    }

    /// The manual's Rust verifier (docs/src/signatures.md), word for word: it compiles and
    /// accepts what Fanout sends (the fixed vector, and a `both` header during a rotation), and
    /// refuses a forged body.
    #[test]
    fn readme_rust_verifier() {
        use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
        use ed25519_dalek::{Signature, VerifyingKey};

        fn verify_v1a(
            public_key: &str,
            id: &str,
            timestamp: &str,
            signatures: &str,
            body: &[u8],
        ) -> bool {
            let Some(raw) = public_key
                .strip_prefix("whpk_")
                .and_then(|k| B64.decode(k).ok())
            else {
                return false;
            };
            let Ok(key) = VerifyingKey::try_from(raw.as_slice()) else {
                return false;
            };
            let msg = [id.as_bytes(), b".", timestamp.as_bytes(), b".", body].concat();
            signatures
                .split(' ')
                .filter_map(|s| s.strip_prefix("v1a,"))
                .filter_map(|s| B64.decode(s).ok())
                .filter_map(|s| Signature::from_slice(&s).ok())
                .any(|sig| key.verify_strict(&msg, &sig).is_ok())
        }

        let body = SPEC_BODY.as_bytes();
        assert!(verify_v1a(
            RFC_PUBLIC,
            SPEC_ID,
            "1614265330",
            SPEC_V1A,
            body
        ));
        assert!(!verify_v1a(
            RFC_PUBLIC,
            SPEC_ID,
            "1614265330",
            SPEC_V1A,
            b"{}"
        ));
        let (old, new) = (
            SigningKey::from_seed(&[1u8; 32]).unwrap(),
            SigningKey::from_seed(&[2u8; 32]).unwrap(),
        );
        let keys = Keys::for_scheme(
            Scheme::Both,
            vec![Secret::from_bytes(&[3u8; 32]).unwrap()],
            vec![new, old.clone()],
            false,
        );
        let header = keys.signature_header("evt_1", 1000, body);
        let old_public = old.public_key().encode();
        assert!(verify_v1a(&old_public, "evt_1", "1000", &header, body));
        assert!(!verify_v1a(&old_public, "evt_1", "1001", &header, body));
        assert!(!verify_v1a(RFC_PUBLIC, "evt_1", "1000", &header, body));
    }
}
