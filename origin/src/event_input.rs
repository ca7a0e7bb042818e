//! One event as a producer hands it in, checked the one way both ingest paths use: the body of
//! `POST /v1/events` (`api/events.rs`) and a row of a producer's outbox (`outbox/plan.rs`).
//! An event is a JSON object with a string `id` (visible ASCII: it is sent as `webhook-id`) and
//! a string `type` without `*`, at most the configured size, kept byte for byte (pure).

use serde::Deserialize;

use crate::ledger::NewEvent;
use crate::model::{validate_event_id, validate_visible};

/// Why a text is not an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    TooLarge(String),
}

#[derive(Deserialize)]
struct EventHead {
    id: Option<serde_json::Value>,
    #[serde(rename = "type")]
    event_type: Option<serde_json::Value>,
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
    // A struct also deserializes from a JSON array: only an object is an event.
    if !text.starts_with('{') {
        return Err(not_object());
    }
    let head: EventHead = serde_json::from_str(text).map_err(|_| not_object())?;
    let id = match head.id {
        Some(serde_json::Value::String(s)) => s,
        Some(_) => return Err(EventError::Invalid(format!("{at}id must be a string"))),
        None => return Err(EventError::Invalid(format!("{at}id is missing"))),
    };
    validate_event_id("id", &id).map_err(|e| EventError::Invalid(format!("{at}{e}")))?;
    let event_type = match head.event_type {
        Some(serde_json::Value::String(s)) => s,
        Some(_) => return Err(EventError::Invalid(format!("{at}type must be a string"))),
        None => return Err(EventError::Invalid(format!("{at}type is missing"))),
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
}
