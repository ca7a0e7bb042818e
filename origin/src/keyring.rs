//! A subscriber's signing keys (pure): each generation of its secrets is an HMAC `whsec_`
//! secret (`v1`) and, from the Ed25519 scheme on, an Ed25519 `whsk_` signing key (`v1a`),
//! made together, rotated together and retired together
//! ([`StoredSecret`](crate::model::StoredSecret)). Its [`Keyring`] is that list parsed once,
//! when the dispatcher loads the subscriber, so no send parses a key again (parsing an Ed25519
//! key costs about what a signature does). No clock, no randomness: `now` and the random bytes
//! of a new key are arguments.

use fanout_core::sign::{Keys, Scheme, Secret, SigningKey};

use crate::model::{StoredSecret, MAX_ACTIVE_SECRETS};

/// The keys of a new generation (a subscriber's creation or a rotation): its HMAC secret and
/// its Ed25519 signing key, `None` only where a ledger test makes a bare secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSecret {
    pub secret: String,
    pub signing_key: Option<String>,
}

impl From<&str> for NewSecret {
    fn from(secret: &str) -> NewSecret {
        NewSecret {
            secret: secret.to_string(),
            signing_key: None,
        }
    }
}

impl From<&String> for NewSecret {
    fn from(secret: &String) -> NewSecret {
        NewSecret::from(secret.as_str())
    }
}

/// A new Ed25519 signing key's text from 32 random bytes the caller drew.
pub fn new_signing_key(random: &[u8; 32]) -> String {
    match SigningKey::from_seed(random) {
        Ok(k) => k.encode(),
        Err(_) => unreachable!("any 32 bytes are an Ed25519 seed"),
    }
}

/// Give the current generation a signing key if it has none (a switch to `ed25519` or
/// `both`): `random` becomes its key. Returns whether it did.
pub fn ensure_signing_key(secrets: &mut [StoredSecret], random: &[u8; 32]) -> bool {
    let current = secrets
        .iter_mut()
        .filter(|s| s.expires_ms.is_none())
        .max_by_key(|s| s.created_ms);
    match current {
        Some(s) if s.signing_key.is_none() => {
            s.signing_key = Some(new_signing_key(random));
            true
        }
        _ => false,
    }
}

/// One generation, parsed.
#[derive(Debug, Clone, PartialEq)]
struct Parsed {
    stored: StoredSecret,
    secret: Option<Secret>,
    signing_key: Option<SigningKey>,
}

/// A subscriber's stored generations parsed once, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Keyring(Vec<Parsed>);

impl Keyring {
    pub fn of(secrets: &[StoredSecret]) -> Keyring {
        let mut parsed: Vec<Parsed> = secrets
            .iter()
            .map(|s| Parsed {
                stored: s.clone(),
                secret: Secret::parse(&s.secret).ok(),
                signing_key: s
                    .signing_key
                    .as_deref()
                    .and_then(|k| SigningKey::parse(k).ok()),
            })
            .collect();
        parsed.sort_by_key(|p| std::cmp::Reverse(p.stored.created_ms));
        Keyring(parsed)
    }

    /// The generations that sign at `now_ms`, newest first: the rule of
    /// [`active_secrets`](crate::model::active_secrets) (unexpired, the newest
    /// [`MAX_ACTIVE_SECRETS`]).
    fn live(&self, now_ms: i64) -> impl Iterator<Item = &Parsed> {
        self.0
            .iter()
            .filter(move |p| p.stored.expires_ms.is_none_or(|e| e > now_ms))
            .take(MAX_ACTIVE_SECRETS)
    }

    /// What signs a webhook at `now_ms` under `scheme` (empty when nothing can).
    pub fn keys(&self, scheme: Scheme, legacy: bool, now_ms: i64) -> Keys {
        Keys::for_scheme(
            scheme,
            self.live(now_ms).filter_map(|p| p.secret.clone()).collect(),
            self.live(now_ms)
                .filter_map(|p| p.signing_key.clone())
                .collect(),
            legacy,
        )
    }

    /// What the edge is handed at `now_ms` under `scheme`: the active secrets' and (when the
    /// scheme signs `v1a`) signing keys' text, newest first, only those that parse.
    pub fn wire(&self, scheme: Scheme, now_ms: i64) -> (Vec<String>, Vec<String>) {
        let secrets = self
            .live(now_ms)
            .filter(|p| p.secret.is_some())
            .map(|p| p.stored.secret.clone())
            .collect();
        let signing_keys = if scheme.ed25519() {
            self.live(now_ms)
                .filter(|p| p.signing_key.is_some())
                .filter_map(|p| p.stored.signing_key.clone())
                .collect()
        } else {
            Vec::new()
        };
        (secrets, signing_keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_core::sign::PublicKey;

    fn generation(n: u8, created_ms: i64, expires_ms: Option<i64>, key: bool) -> StoredSecret {
        StoredSecret {
            secret: Secret::from_bytes(&[n; 32]).unwrap().encode(),
            created_ms,
            expires_ms,
            signing_key: key.then(|| new_signing_key(&[n; 32])),
        }
    }

    /// During a rotation's overlap both generations sign, each scheme with its own keys; after
    /// it only the new one; a generation without a key adds no `v1a`.
    #[test]
    fn keyring_by_time_and_scheme_table() {
        let ring = Keyring::of(&[
            generation(1, 10, Some(100), true),
            generation(2, 50, None, true),
            generation(3, 5, Some(40), false),
        ]);
        // (now, scheme, v1 count, v1a count)
        let rows: &[(i64, Scheme, usize, usize)] = &[
            (60, Scheme::Hmac, 2, 0),
            (60, Scheme::Ed25519, 0, 2),
            (60, Scheme::Both, 2, 2),
            (100, Scheme::Both, 1, 1),
            (100, Scheme::Ed25519, 0, 1),
        ];
        for &(now, scheme, v1, v1a) in rows {
            let k = ring.keys(scheme, false, now);
            assert_eq!((k.v1.len(), k.v1a.len()), (v1, v1a), "{now} {scheme:?}");
            let (secrets, keys) = ring.wire(scheme, now);
            assert_eq!(
                secrets.len(),
                if now < 100 { 2 } else { 1 },
                "every live secret"
            );
            assert_eq!(keys.len(), v1a, "{now} {scheme:?}");
        }
        // Newest first: the new generation's key signs first.
        let k = ring.keys(Scheme::Ed25519, false, 60);
        assert_eq!(k.v1a[0], SigningKey::from_seed(&[2; 32]).unwrap());
        // A generation without a key, alone: nothing signs under ed25519.
        let bare = Keyring::of(&[generation(3, 5, None, false)]);
        assert!(bare.keys(Scheme::Ed25519, false, 60).is_empty());
        assert!(!bare.keys(Scheme::Both, false, 60).is_empty());
    }

    #[test]
    fn public_key_and_switch() {
        let mut gens = vec![
            generation(1, 10, Some(100), false),
            generation(2, 50, None, false),
        ];
        assert_eq!(crate::model::current_public_key(&gens), None);
        assert!(ensure_signing_key(&mut gens, &[9; 32]));
        assert!(!ensure_signing_key(&mut gens, &[8; 32]), "a key is kept");
        assert!(
            gens[0].signing_key.is_none(),
            "the retiring one is left alone"
        );
        let shown = crate::model::current_public_key(&gens).unwrap();
        let expected = SigningKey::from_seed(&[9; 32]).unwrap().public_key();
        assert_eq!(PublicKey::parse(&shown).unwrap(), expected);
        assert!(shown.starts_with("whpk_"));
        assert_eq!(NewSecret::from("whsec_x").signing_key, None);
    }
}
