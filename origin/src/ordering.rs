//! Ordered delivery (pure): a subscriber's `"ordering"` (`none`, `subscriber` or `key` with
//! `"ordering_key"`, a JSON Pointer into the event), the key each of its deliveries is given
//! at ingest, and the headers an ordered webhook carries.
//!
//! At most one delivery of a key is outstanding (pending with a due time, or in flight) at a
//! time: its *head*. Ingest gives a delivery whose key already has outstanding deliveries the
//! due time [`HELD_MS`] (it stays `pending`, but no claim reaches it); when the head is recorded
//! `sent` or `dead`, the same transaction makes the key's lowest-numbered held delivery due now
//! and the dispatcher is woken. A failing head is retried as usual and holds back its own key
//! only. A replayed delivery of an ordered key rejoins its key: it is held while the key has a
//! head and goes before the held ones (it keeps its number; the lowest number goes first).
//!
//! The key a delivery gets is fixed at ingest and stored with it (`deliveries.ordering_key`),
//! with the sequence of the key's previous delivery (`previous_sequence`, the header
//! `webhook-previous-sequence`, absent for a key's first). Stored key text ([`key_of`]):
//! - `subscriber` ordering: `""` (the whole subscriber is one key, no `webhook-ordering-key`);
//! - `key` ordering: the JSON text of the value at the pointer (`"v_1"` with its quotes, `42`,
//!   `{"a":1}`), so `42` and `"42"` are two keys; an event without a value there is the key
//!   `null` (such events are ordered together, never left unordered). The text is
//!   `serde_json`'s compact form of the parsed value (object members sorted by name), so
//!   `{"b":1,"a":2}` and `{"a":2, "b":1}` are one key. A text longer than
//!   [`MAX_STORED_KEY_BYTES`] is stored as `sha256:` and the hex SHA-256 of that text
//!   ([`bounded`]): every index that holds a key (`ordering_keys`, `deliveries_ordered`) stays
//!   within PostgreSQL's btree limit (about 2.7 KB a row), on both ledgers the same way.
//!
//! Changing a subscriber's ordering applies to deliveries ingested after the change; those
//! already stored keep their key (held ones are released one by one as before), so nothing is
//! ever sent out of the order promised when it was ingested.

use std::collections::BTreeMap;

use fanout_core::wire::MAX_ORDERING_KEY_BYTES;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The longest key text stored as it is; a longer one is stored as its digest ([`bounded`]).
/// Its header, percent-encoded at worst three bytes a byte, still fits
/// `MAX_ORDERING_KEY_BYTES`.
pub const MAX_STORED_KEY_BYTES: usize = 1024;

/// The due time of a held delivery: after every real time, so no claim takes it and no
/// "next due" reads it (every reader of the earliest due time skips it).
pub const HELD_MS: i64 = i64::MAX;

/// A subscriber's ordering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Ordering {
    /// Deliveries go as the limiter allows, several at once.
    #[default]
    None,
    /// One at a time for the whole subscriber.
    Subscriber,
    /// One at a time per value of `ordering_key` in the event.
    Key,
}

impl Ordering {
    pub fn as_str(self) -> &'static str {
        match self {
            Ordering::None => "none",
            Ordering::Subscriber => "subscriber",
            Ordering::Key => "key",
        }
    }

    pub fn parse(s: &str) -> Option<Ordering> {
        match s {
            "none" => Some(Ordering::None),
            "subscriber" => Some(Ordering::Subscriber),
            "key" => Some(Ordering::Key),
            _ => None,
        }
    }
}

/// Read by name, refused with a message naming the field (`serde`'s own names the variants
/// only).
impl<'de> Deserialize<'de> for Ordering {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ordering::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "ordering {s:?} is unknown: it is \"none\", \"subscriber\" or \"key\""
            ))
        })
    }
}

/// `ordering_key` is given exactly when `ordering` is `key`, and is a JSON Pointer (RFC 6901:
/// `/` then tokens, `~` only as `~0` or `~1`). The message names the field.
pub fn validate(ordering: Ordering, key: Option<&str>) -> Result<(), String> {
    match (ordering, key) {
        (Ordering::Key, None) => Err("ordering_key is required when ordering is \"key\"".into()),
        (Ordering::Key, Some(p)) => check_pointer(p),
        (o, Some(_)) => Err(format!(
            "ordering_key is only for ordering \"key\" (ordering is \"{}\")",
            o.as_str()
        )),
        (_, None) => Ok(()),
    }
}

fn check_pointer(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!(
            "ordering_key {p:?} is not a JSON Pointer: it must start with \"/\" (\"/video_id\")"
        ));
    }
    if p.len() > 256 {
        return Err("ordering_key is longer than 256 characters".into());
    }
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(format!(
                "ordering_key {p:?} is not a JSON Pointer: \"~\" must be followed by 0 or 1"
            ));
        }
    }
    Ok(())
}

/// The key stored with a delivery of an event whose body is `body` (parsed; `None` when it
/// does not parse, which ingest never lets in), for a subscriber with this ordering: `None`
/// for unordered (see the module for the text).
pub fn key_of(ordering: Ordering, pointer: Option<&str>, body: Option<&Value>) -> Option<String> {
    match ordering {
        Ordering::None => None,
        Ordering::Subscriber => Some(String::new()),
        Ordering::Key => Some(bounded(
            pointer
                .zip(body)
                .and_then(|(p, b)| b.pointer(p))
                .map_or_else(|| "null".to_string(), Value::to_string),
        )),
    }
}

/// A key's text as stored: itself up to [`MAX_STORED_KEY_BYTES`], beyond that `sha256:` and
/// the lowercase hex digest of the text (never JSON, so never another key's text).
pub fn bounded(text: String) -> String {
    if text.len() <= MAX_STORED_KEY_BYTES {
        return text;
    }
    let digest = Sha256::digest(text.as_bytes());
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// `webhook-ordering-key` for a stored key: `None` for subscriber ordering (`""`); a string's
/// contents, another value's JSON text. Bytes a header cannot carry (controls, non-ASCII) and
/// `%` are percent-encoded, so the value is always visible ASCII, cut at
/// `wire::MAX_ORDERING_KEY_BYTES` (a longer key is still one key; only its header is cut).
pub fn header_value(stored: &str) -> Option<String> {
    if stored.is_empty() {
        return None;
    }
    let text = match serde_json::from_str::<Value>(stored) {
        Ok(Value::String(s)) => s,
        _ => stored.to_string(),
    };
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
        if out.len() >= MAX_ORDERING_KEY_BYTES {
            out.truncate(MAX_ORDERING_KEY_BYTES);
            break;
        }
    }
    Some(out)
}

/// A key's stored state (its last sequence, whether it has deliveries outstanding), and a
/// delivery's place in its key (its previous sequence, whether it is held): one shape.
pub type Link = (Option<i64>, bool);

/// How one ingest chains its ordered deliveries, given in fan-out order as `(key, sequence)`
/// (the key naming subscriber and key), with each key's stored state: its last sequence and
/// whether it has outstanding deliveries. Returns each delivery's previous sequence and
/// whether it is held (its key already has a delivery outstanding, stored or earlier in this
/// ingest), and each key's new last sequence.
pub fn chain<K: Ord + Clone>(
    deliveries: &[(K, i64)],
    stored: &BTreeMap<K, Link>,
) -> (Vec<Link>, BTreeMap<K, i64>) {
    let mut state = stored.clone();
    let out = deliveries
        .iter()
        .map(|(k, seq)| {
            let (last, busy) = state.entry(k.clone()).or_insert((None, false));
            let link = (*last, *busy);
            *last = Some(*seq);
            *busy = true;
            link
        })
        .collect();
    let lasts = state
        .into_iter()
        .filter_map(|(k, (last, _))| Some((k, last?)))
        .filter(|(k, _)| deliveries.iter().any(|(d, _)| d == k))
        .collect();
    (out, lasts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_table() {
        use Ordering::*;
        let rows: &[(Ordering, Option<&str>, Option<&str>)] = &[
            (None, Option::None, Option::None),
            (Subscriber, Option::None, Option::None),
            (Key, Some("/video_id"), Option::None),
            (Key, Some("/a/0/b~1c~0"), Option::None),
            (Key, Option::None, Some("ordering_key is required")),
            (Key, Some("video_id"), Some("must start with")),
            (Key, Some(""), Some("must start with")),
            (Key, Some("/a~2"), Some("followed by 0 or 1")),
            (Key, Some("/a~"), Some("followed by 0 or 1")),
            (Subscriber, Some("/a"), Some("only for ordering \"key\"")),
            (None, Some("/a"), Some("only for ordering \"key\"")),
        ];
        for (o, k, err) in rows {
            let got = validate(*o, *k);
            match err {
                Option::None => assert_eq!(got, Ok(()), "{o:?} {k:?}"),
                Some(e) => {
                    let msg = got.unwrap_err();
                    assert!(msg.contains(e) && msg.contains("ordering"), "{msg}");
                }
            }
        }
        for o in [None, Subscriber, Key] {
            assert_eq!(Ordering::parse(o.as_str()), Some(o));
        }
    }

    #[test]
    fn chain_table() {
        let stored: BTreeMap<&str, (Option<i64>, bool)> =
            [("a", (Some(3), true)), ("b", (Some(7), false))].into();
        let (links, lasts) = chain(
            &[("a", 10), ("b", 11), ("c", 12), ("c", 13), ("b", 14)],
            &stored,
        );
        assert_eq!(
            links,
            [
                (Some(3), true),  // a has a head outstanding: held
                (Some(7), false), // b is idle: its head
                (None, false),    // c's first
                (Some(12), true), // behind c's first of this ingest
                (Some(11), true),
            ]
        );
        assert_eq!(lasts, [("a", 10), ("b", 14), ("c", 13)].into());
        let (links, lasts) = chain::<&str>(&[], &stored);
        assert!(links.is_empty() && lasts.is_empty());
    }

    #[test]
    fn keys_and_headers_table() {
        let body: Value =
            serde_json::json!({"video_id": "v_1", "n": 42, "s": "42", "o": {"a": 1}, "u": "é\n%"});
        type Row<'a> = (Ordering, Option<&'a str>, Option<&'a str>, Option<&'a str>);
        let rows: &[Row] = &[
            (Ordering::None, None, None, None),
            (Ordering::Subscriber, None, Some(""), None),
            (
                Ordering::Key,
                Some("/video_id"),
                Some("\"v_1\""),
                Some("v_1"),
            ),
            (Ordering::Key, Some("/n"), Some("42"), Some("42")),
            (Ordering::Key, Some("/s"), Some("\"42\""), Some("42")),
            (
                Ordering::Key,
                Some("/o"),
                Some("{\"a\":1}"),
                Some("{\"a\":1}"),
            ),
            (Ordering::Key, Some("/missing"), Some("null"), Some("null")),
            (
                Ordering::Key,
                Some("/u"),
                Some("\"é\\n%\""),
                Some("%C3%A9%0A%25"),
            ),
        ];
        for (o, p, stored, header) in rows {
            let k = key_of(*o, *p, Some(&body));
            assert_eq!(k.as_deref(), *stored, "{o:?} {p:?}");
            assert_eq!(k.as_deref().and_then(header_value).as_deref(), *header);
        }
        assert_eq!(
            key_of(Ordering::Key, Some("/a"), None).as_deref(),
            Some("null")
        );
    }

    #[test]
    fn long_keys_are_stored_as_their_digest() {
        let at_limit = format!("\"{}\"", "k".repeat(MAX_STORED_KEY_BYTES - 2));
        let over = format!("\"{}\"", "k".repeat(MAX_STORED_KEY_BYTES - 1));
        let cases: &[(&str, &str)] = &[
            ("\"v_1\"", "\"v_1\""),
            (&at_limit, &at_limit),
            // `printf '"%s"' $(printf 'k%.0s' $(seq 1 1023)) | sha256sum`
            (
                &over,
                "sha256:2b6bea15404695540764dd3a5c47b47e5e85b07cfc98260b13affdd2cac6ff70",
            ),
        ];
        for (text, stored) in cases {
            assert_eq!(&bounded(text.to_string()), stored);
        }
        // A 10 KB value: one bounded key, the same for the same value whatever its members'
        // order, another for another value; its header is the stored text.
        let big = |order: bool, v: &str| -> Value {
            let k = "x".repeat(10_000);
            if order {
                serde_json::from_str(&format!(r#"{{"k":{{"a":"{k}","b":"{v}"}}}}"#)).unwrap()
            } else {
                serde_json::from_str(&format!(r#"{{"k":{{"b":"{v}","a":"{k}"}}}}"#)).unwrap()
            }
        };
        let key = |b: &Value| key_of(Ordering::Key, Some("/k"), Some(b)).unwrap();
        let (one, same, other) = (
            key(&big(true, "1")),
            key(&big(false, "1")),
            key(&big(true, "2")),
        );
        assert!(one.starts_with("sha256:") && one.len() == 71, "{one}");
        assert_eq!(one, same);
        assert_ne!(one, other);
        assert_eq!(header_value(&one).as_deref(), Some(one.as_str()));
    }
}
