//! One event as a producer hands it in, checked the one way both ingest paths use: the body of
//! `POST /v1/events` (`api/events.rs`) and a row of a producer's outbox (`outbox/plan.rs`).
//! An event is a JSON object with a string `id` (visible ASCII: it is sent as `webhook-id`) and
//! a string `type` without `*`, at most the configured size, kept byte for byte (pure).
//!
//! # One parser decides
//!
//! Whatever reads an event after ingest (content filters at fan-out, ordering keys,
//! `POST /v1/filters/test`) reads it with `serde_json` into values. So ingest walks the whole
//! event with that same parser ([`readable`]) and refuses, naming why, what it could not read
//! into values: a lone surrogate escape (`"\ud800"`), a number beyond `f64` (`1e400`), an
//! object that names a key twice (parsers disagree on which one counts: the filter would read
//! one value, a receiver maybe the other), and nesting deeper than [`MAX_DEPTH`] levels (well
//! inside `serde_json`'s own limit of 127, so that an event inside a batch's array or the test
//! route's request still reads). An event that passes is read the same by every later reader:
//! none of them falls back to "no body" (a filter letting it through, the key `null`).

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::event_filter::Key;
use crate::ledger::NewEvent;
use crate::model::{validate_event_id, validate_visible};

/// Most levels of nested arrays and objects in an event (the event object is level 1).
pub const MAX_DEPTH: usize = 64;

/// Why a text is not an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    TooLarge(String),
}

/// Check that a JSON text (already known to be JSON: a raw value) reads into values the way
/// every later reader reads it: no lone surrogate, no number beyond `f64`, no key twice in an
/// object, at most [`MAX_DEPTH`] levels. The message names why and where.
pub fn readable(text: &str) -> Result<(), String> {
    walk(text, false).map(|_| ())
}

/// Walk `text` whole with `serde_json`; for an object at the top, its `id` and `type` when they
/// are strings (`Field::Other` when present and not a string).
fn walk(text: &str, head: bool) -> Result<Head, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let seed = Walk { depth: 1, head };
    let got = seed
        .deserialize(&mut de)
        .and_then(|h| de.end().map(|_| h))
        .map_err(|e| format!("cannot be read as JSON values: {e}"))?;
    Ok(got.unwrap_or_default())
}

/// The top-level `id` and `type`, as far as the walk saw them.
#[derive(Debug, Default)]
struct Head {
    id: Field,
    event_type: Field,
}

#[derive(Debug, Default)]
enum Field {
    #[default]
    Missing,
    Text(String),
    Other,
}

/// A walk over one value at `depth` (1: the top). `head`: keep the `id` and `type` of this
/// object. Yields `Some(Head)` for an object walked with `head`, `None` otherwise.
#[derive(Clone, Copy)]
struct Walk {
    depth: usize,
    head: bool,
}

impl<'de> DeserializeSeed<'de> for Walk {
    type Value = Option<Head>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl Walk {
    /// The walk of this array's or object's items; refused when it is itself too deep.
    fn deeper<E: serde::de::Error>(self) -> Result<Walk, E> {
        if self.depth > MAX_DEPTH {
            return Err(E::custom(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        Ok(Walk {
            depth: self.depth + 1,
            head: false,
        })
    }
}

/// The value of a top-level `id` or `type`: kept when it is a string, walked like any other
/// value (by the walk one level down) when it is not.
struct Text(Walk);

impl<'de> DeserializeSeed<'de> for Text {
    type Value = Field;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Field, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Text {
    type Value = Field;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E>(self, v: &str) -> Result<Field, E> {
        Ok(Field::Text(v.to_string()))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Field, E> {
        Ok(Field::Other)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Field, E> {
        Ok(Field::Other)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Field, E> {
        Ok(Field::Other)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Field, E> {
        Ok(Field::Other)
    }
    fn visit_unit<E>(self) -> Result<Field, E> {
        Ok(Field::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Field, A::Error> {
        self.0.visit_seq(seq).map(|_| Field::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Field, A::Error> {
        self.0.visit_map(map).map(|_| Field::Other)
    }
}

impl<'de> Visitor<'de> for Walk {
    type Value = Option<Head>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let inner = self.deeper()?;
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(None)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let inner = self.deeper()?;
        let mut keys: HashSet<Cow<'de, str>> = HashSet::new();
        let mut head = Head::default();
        while let Some(k) = map.next_key_seed(Key)? {
            let wanted = self.head && matches!(k.as_ref(), "id" | "type");
            if wanted {
                let v = map.next_value_seed(Text(inner))?;
                if k == "id" {
                    head.id = v;
                } else {
                    head.event_type = v;
                }
            } else {
                map.next_value_seed(inner)?;
            }
            if let Some(k) = keys.replace(k) {
                return Err(A::Error::custom(format!("the key {k:?} appears twice")));
            }
        }
        Ok(self.head.then_some(head))
    }
}

/// Parse one event from `text` (surrounding whitespace is not part of it). `index` is its
/// place in an array, named in the message.
pub fn parse_event(
    text: &str,
    index: Option<usize>,
    max_bytes: usize,
) -> Result<NewEvent, EventError> {
    let at = index.map_or(String::new(), |i| format!("event {i}: "));
    let text = text.trim_matches(|c: char| c.is_ascii_whitespace());
    if text.len() > max_bytes {
        return Err(EventError::TooLarge(format!(
            "{at}the event is {} bytes; the limit is {max_bytes}",
            text.len()
        )));
    }
    let not_object = || EventError::Invalid(format!("{at}an event must be a JSON object"));
    // JSON at all (syntax only), and an object, before what it holds is read.
    if !text.starts_with('{') || serde_json::from_str::<&RawValue>(text).is_err() {
        return Err(not_object());
    }
    let head = walk(text, true).map_err(|e| EventError::Invalid(format!("{at}the event {e}")))?;
    let id = match head.id {
        Field::Text(s) => s,
        Field::Other => return Err(EventError::Invalid(format!("{at}id must be a string"))),
        Field::Missing => return Err(EventError::Invalid(format!("{at}id is missing"))),
    };
    validate_event_id("id", &id).map_err(|e| EventError::Invalid(format!("{at}{e}")))?;
    let event_type = match head.event_type {
        Field::Text(s) => s,
        Field::Other => return Err(EventError::Invalid(format!("{at}type must be a string"))),
        Field::Missing => return Err(EventError::Invalid(format!("{at}type is missing"))),
    };
    validate_visible("type", &event_type).map_err(|e| EventError::Invalid(format!("{at}{e}")))?;
    if event_type.contains('*') {
        return Err(EventError::Invalid(format!(
            "{at}type must not contain '*'"
        )));
    }
    Ok(NewEvent {
        id,
        event_type,
        body: text.to_string(),
        traceparent: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: Result<(&str, &str), &str>) {
        let got = parse_event(text, None, 64).map(|e| (e.id, e.body));
        match (got, expected) {
            (Ok((id, body)), Ok((eid, ebody))) => {
                assert_eq!((id.as_str(), body.as_str()), (eid, ebody), "{text}")
            }
            (Err(e), Err(message)) => assert!(e.to_string().contains(message), "{text}: {e}"),
            (got, exp) => panic!("{text}: got {got:?}, expected {exp:?}"),
        }
    }

    #[test]
    fn event_table() {
        check(
            r#"{"id":"e1","type":"a"}"#,
            Ok(("e1", r#"{"id":"e1","type":"a"}"#)),
        );
        check(
            " {\"id\":\"e1\",\"type\":\"a\"}\n",
            Ok(("e1", "{\"id\":\"e1\",\"type\":\"a\"}")),
        );
        check(r#"["e1","a"]"#, Err("a JSON object"));
        check(r#"{"id":"e1","type":"a"} x"#, Err("a JSON object"));
        check("not json", Err("a JSON object"));
        check(r#"{"type":"a"}"#, Err("id is missing"));
        check(r#"{"id":1,"type":"a"}"#, Err("id must be a string"));
        check(r#"{"id":"e1"}"#, Err("type is missing"));
        check(r#"{"id":"e1","type":"a*"}"#, Err("'*'"));
        check(
            &format!(r#"{{"id":"e1","type":"a","p":"{}"}}"#, "x".repeat(64)),
            Err("limit is 64"),
        );
    }

    /// Nested `[` … `]` around `inner`, `levels` deep.
    fn nest(levels: usize, inner: &str) -> String {
        format!("{}{inner}{}", "[".repeat(levels), "]".repeat(levels))
    }

    /// What the one parser accepts and refuses (issue 35): every body it accepts reads into a
    /// `serde_json::Value` (what filters, ordering keys and the filter test read), and so does
    /// the part a filter projects; what it refuses is named.
    #[test]
    fn the_parser_decides_table() {
        let depth_ok = format!(
            r#"{{"id":"e","type":"t","d":{}}}"#,
            nest(MAX_DEPTH - 1, "1")
        );
        let too_deep = format!(r#"{{"id":"e","type":"t","d":{}}}"#, nest(MAX_DEPTH, "1"));
        let serde_limit = format!(r#"{{"id":"e","type":"t","d":{}}}"#, nest(200, "1"));
        let deep_id = format!(r#"{{"id":{},"type":"t"}}"#, nest(MAX_DEPTH, "1"));
        let cases: &[(&str, Result<(), &str>)] = &[
            (r#"{"id":"e","type":"t"}"#, Ok(())),
            (r#"{"id":"e","type":"t","s":"\ud83d\ude00"}"#, Ok(())),
            (r#"{"id":"e","type":"t","n":1e308,"m":-1e-400}"#, Ok(())),
            (
                r#"{"id":"e","type":"t","n":123456789012345678901234567890}"#,
                Ok(()),
            ),
            (r#"{"id":"e","type":"t","k":{"a":1,"b":{"a":2}}}"#, Ok(())),
            (&depth_ok, Ok(())),
            (
                r#"{"id":"e","type":"t","s":"\ud800"}"#,
                Err("cannot be read as JSON values: unexpected end of hex escape"),
            ),
            (
                r#"{"id":"e","type":"t","s":"\ud800\u0041"}"#,
                Err("lone leading surrogate"),
            ),
            (r#"{"id":"e","type":"t","s":"\udc00x"}"#, Err("surrogate")),
            (r#"{"id":"e","type":"t","\ud800":1}"#, Err("hex escape")),
            (
                r#"{"id":"e","type":"t","n":1e400}"#,
                Err("number out of range"),
            ),
            (
                r#"{"id":"e","type":"t","n":[-1e400]}"#,
                Err("number out of range"),
            ),
            (&too_deep, Err("nested deeper than 64 levels")),
            (&serde_limit, Err("nested deeper than 64 levels")),
            (&deep_id, Err("nested deeper than 64 levels")),
            (
                r#"{"id":"e","type":"t","a":1,"a":2}"#,
                Err(r#"the key "a" appears twice"#),
            ),
            (
                r#"{"id":"e","type":"t","a":1,"\u0061":2}"#,
                Err("appears twice"),
            ),
            (
                r#"{"id":"e","type":"t","o":{"x":1,"x":1}}"#,
                Err("appears twice"),
            ),
            (
                r#"{"id":"e","id":"f","type":"t"}"#,
                Err(r#"the key "id" appears twice"#),
            ),
            (r#"{"id":"e","type":"t"} {}"#, Err("a JSON object")),
            (r#"{"id":"e","type":"t","x":nul}"#, Err("a JSON object")),
        ];
        for (text, want) in cases {
            let got = parse_event(text, Some(3), 1 << 20);
            match (&got, want) {
                (Ok(e), Ok(())) => {
                    let v: serde_json::Value = serde_json::from_str(&e.body).unwrap();
                    assert!(v.is_object(), "{text}");
                    let all = crate::event_filter::Filter::compile(&serde_json::json!({"x": 1}))
                        .unwrap()
                        .projection();
                    assert!(all.parse(&e.body).is_ok(), "{text}");
                    assert_eq!(readable(text), Ok(()), "{text}");
                }
                (Err(e), Err(m)) => {
                    let e = e.to_string();
                    assert!(e.starts_with("event 3: "), "{text}: {e}");
                    assert!(e.contains(m), "{text}: {e}");
                }
                _ => panic!("{text}: got {got:?}, expected {want:?}"),
            }
        }
        // What the walk refuses, `serde_json` refuses too (the same parser): nothing refused
        // here is read by a later reader as something else.
        for text in [r#"{"s":"\ud800"}"#, r#"{"n":1e400}"#] {
            assert!(serde_json::from_str::<serde_json::Value>(text).is_err());
            assert!(readable(text).is_err());
        }
        assert!(readable(&nest(MAX_DEPTH, "1")).is_ok());
        assert!(readable(&nest(MAX_DEPTH + 1, "1")).is_err());
    }

    /// The outbox's plan checks each row with this module: a row the filters could not read
    /// becomes a rejection naming why, and the rows beside it are ingested.
    #[test]
    fn the_outbox_rejects_what_ingest_refuses() {
        use crate::outbox::plan::{plan, Row};
        let row = |id: i64, text: &str| Row {
            id,
            payload: Some(text.to_string()),
            age_secs: 0.0,
        };
        let batch = plan(
            &[
                row(1, r#"{"id":"a","type":"t","s":"\ud800"}"#),
                row(2, r#"{"id":"b","type":"t","n":1e400}"#),
                row(3, r#"{"id":"c","type":"t"}"#),
            ],
            1 << 20,
        );
        assert_eq!(batch.events.len(), 1);
        assert_eq!(batch.events[0].id, "c");
        assert_eq!(batch.ids, [1, 2, 3]);
        let why: Vec<(i64, bool)> = batch
            .rejected
            .iter()
            .map(|(id, e)| {
                (
                    *id,
                    e.starts_with("the event cannot be read as JSON values"),
                )
            })
            .collect();
        assert_eq!(why, [(1, true), (2, true)]);
    }
}
