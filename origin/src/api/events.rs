//! `POST /v1/events`: a producer's event, or an array of them, parsed (pure, each event kept
//! byte for byte and checked by `event_input.rs`, as an outbox row is), written to the ledger
//! in one transaction, and the dispatcher told which subscribers have work. It does not
//! deliver anything.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::value::RawValue;

use super::body::{read_body, MAX_REQUEST_BYTES};
use super::error::ApiError;
use super::state::AppState;
use super::views;
use crate::event_input::EventError;
use crate::ledger::NewEvent;
use crate::time::now_ms;
use fanout_core::traceparent::TraceParent;

/// Most events in one `POST /v1/events`.
pub const MAX_EVENTS_PER_REQUEST: usize = 10_000;

/// Parse one event of a request (`crate::event_input`, the check the outbox uses too).
fn parse_event(
    raw: &RawValue,
    index: Option<usize>,
    max_bytes: usize,
) -> Result<NewEvent, ApiError> {
    crate::event_input::parse_event(raw.get(), index, max_bytes).map_err(|e| match e {
        EventError::Invalid(m) => ApiError::Invalid(m),
        EventError::TooLarge(m) => ApiError::TooLarge(m),
    })
}

/// Parse a `POST /v1/events` body: one event or an array of them. `true` when it was an array.
pub fn parse_events(
    body: &[u8],
    max_event_bytes: usize,
) -> Result<(Vec<NewEvent>, bool), ApiError> {
    let raw: &RawValue = serde_json::from_slice(body).map_err(|e| ApiError::from_json(&e))?;
    let text = raw.get();
    if text.starts_with('[') {
        let items: Vec<&RawValue> =
            serde_json::from_str(text).map_err(|e| ApiError::from_json(&e))?;
        if items.is_empty() {
            return Err(ApiError::Invalid("the array holds no event".into()));
        }
        if items.len() > MAX_EVENTS_PER_REQUEST {
            return Err(ApiError::TooLarge(format!(
                "{} events in one request; the limit is {MAX_EVENTS_PER_REQUEST}",
                items.len()
            )));
        }
        let events = items
            .iter()
            .enumerate()
            .map(|(i, r)| parse_event(r, Some(i), max_event_bytes))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((events, true))
    } else {
        Ok((vec![parse_event(raw, None, max_event_bytes)?], false))
    }
}

/// `POST /v1/events` within its span (`crate::trace`): a valid `traceparent` header makes it
/// part of the producer's trace; an invalid one is ignored (a trace context is advice, never a
/// reason to refuse an event).
pub(super) async fn post_events(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<impl IntoResponse, ApiError> {
    let incoming = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse);
    let span = state.cfg.telemetry.ingest(incoming);
    let answer = ingest(&state, &headers, body, span.stored()).await;
    span.end(match &answer {
        Ok(_) => StatusCode::ACCEPTED.as_u16(),
        Err(e) => e.status_and_code().0.as_u16(),
    });
    answer.map(|body| (StatusCode::ACCEPTED, Json(body)))
}

async fn ingest(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    traceparent: Option<&str>,
) -> Result<serde_json::Value, ApiError> {
    let limit = MAX_REQUEST_BYTES.max(state.cfg.max_event_bytes);
    let bytes = read_body(&state.cfg, headers, body, limit).await?;
    let (mut events, is_array) = parse_events(&bytes, state.cfg.max_event_bytes)?;
    if let Some(tp) = traceparent {
        for e in &mut events {
            e.traceparent = Some(tp.to_string());
        }
    }
    let now = now_ms();
    let results =
        crate::ingest::ingest(&state.ledger, &state.metrics, &state.control, events, now).await?;
    Ok(if is_array {
        serde_json::to_value(views::IngestedBatch { events: results })
    } else {
        serde_json::to_value(&results[0])
    }
    .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: &str, expected: Result<Vec<(&str, &str)>, &str>) {
        let got = parse_events(body.as_bytes(), 64)
            .map(|(evs, _)| evs.into_iter().map(|e| (e.id, e.body)).collect::<Vec<_>>());
        match (got, expected) {
            (Ok(evs), Ok(exp)) => {
                let exp: Vec<(String, String)> = exp
                    .into_iter()
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect();
                assert_eq!(evs, exp, "{body}");
            }
            (Err(e), Err(code)) => assert_eq!(e.status_and_code().1, code, "{body}: {e}"),
            (got, exp) => panic!("{body}: got {got:?}, expected {exp:?}"),
        }
    }

    #[test]
    fn event_parsing_table() {
        check(
            r#"{"id":"e1","type":"a.b"}"#,
            Ok(vec![("e1", r#"{"id":"e1","type":"a.b"}"#)]),
        );
        check(
            " {\"type\":\"a\", \"id\":\"e1\"} \n",
            Ok(vec![("e1", "{\"type\":\"a\", \"id\":\"e1\"}")]),
        );
        check(
            r#"[{"id":"e1","type":"a"},{"id":"e2","type":"a","x":[1]}]"#,
            Ok(vec![
                ("e1", r#"{"id":"e1","type":"a"}"#),
                ("e2", r#"{"id":"e2","type":"a","x":[1]}"#),
            ]),
        );
        check(r#"{"id":"e1""#, Err("malformed_json"));
        check("", Err("malformed_json"));
        check(r#"{"type":"a"}"#, Err("invalid_request"));
        check(r#"{"id":"e1"}"#, Err("invalid_request"));
        check(r#"{"id":7,"type":"a"}"#, Err("invalid_request"));
        check(r#"{"id":"","type":"a"}"#, Err("invalid_request"));
        // An event id is sent as the webhook-id header: visible ASCII only.
        check(r#"{"id":"évènement","type":"a"}"#, Err("invalid_request"));
        check(r#"{"id":"a b","type":"a"}"#, Err("invalid_request"));
        check(r#"{"id":"e1","type":"a*"}"#, Err("invalid_request"));
        check(r#"[]"#, Err("invalid_request"));
        check(r#"["x"]"#, Err("invalid_request"));
        check(r#"42"#, Err("invalid_request"));
        check(
            &format!(r#"{{"id":"e1","type":"a","pad":"{}"}}"#, "x".repeat(64)),
            Err("too_large"),
        );
        check(
            &format!(
                r#"[{{"id":"e1","type":"a"}},{{"id":"e2","type":"a","pad":"{}"}}]"#,
                "x".repeat(64)
            ),
            Err("too_large"),
        );
    }
}
