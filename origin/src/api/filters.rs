//! `POST /v1/filters/test`: does a content filter (`crate::event_filter`) match an event? For
//! the console and the portal ("does my filter match this event?"), with the admin token or a
//! portal token alike: it reads nothing from the ledger. A filter it refuses is the 400 a
//! subscriber with that filter would get, naming where it is wrong; an event is read as ingest
//! reads it (`crate::event_input::readable`): one ingest would refuse is refused here too.
//!
//! One call's work is bounded: a match stops after [`MAX_TEST_STEPS`] steps (400, naming the
//! limit), it runs on a blocking thread (never on the threads that answer `/healthz` and every
//! other request), a few at a time, and each caller (the operator, each portal customer) may
//! start [`TEST_RATE`] of them (429 with `Retry-After` beyond): `test_limits.rs`.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::auth::Principal;
use super::body::{parse_json, read_body};
use super::error::ApiError;
use super::state::AppState;
use super::test_limits::TEST_RATE;
use crate::event_filter::Filter;
use crate::time::now_ms;

/// Most steps one test's match may take (`event_filter`'s "Cost"): far above what a filter a
/// person writes takes against a real event, far below what stalls a core for long.
pub const MAX_TEST_STEPS: u64 = 2_000_000;

/// The body of `POST /v1/filters/test`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterTest {
    filter: Option<Value>,
    /// Kept as its text: read by itself as ingest reads an event.
    event: Option<Box<RawValue>>,
}

pub(super) async fn test_filter(
    State(state): State<AppState>,
    who: Principal,
    headers: HeaderMap,
    body: Body,
) -> Result<impl IntoResponse, ApiError> {
    let caller = match &who {
        Principal::Admin => "operator".to_string(),
        Principal::Portal { customer } => format!("customer {customer}"),
    };
    state
        .filter_tests
        .admit(caller, now_ms())
        .map_err(|retry_after_ms| ApiError::RateLimited {
            message: format!(
                "too many filter tests: at most {} at once, then {} a second",
                TEST_RATE.burst, TEST_RATE.per_sec
            ),
            retry_after_ms,
        })?;
    // An event as large as ingest takes, and its filter.
    let limit = state.cfg.max_event_bytes + super::body::MAX_ADMIN_BYTES;
    let bytes = read_body(&state.cfg, &headers, body, limit).await?;
    let busy = || ApiError::Busy("the filter test could not run; retry".into());
    let slot = state
        .filter_tests
        .running
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| busy())?;
    let max_event_bytes = state.cfg.max_event_bytes;
    let matches = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        run(&bytes, max_event_bytes)
    })
    .await
    .map_err(|_| busy())??;
    Ok(Json(serde_json::json!({ "matches": matches })))
}

/// One test (pure): the request read, its event checked as ingest checks one, the filter
/// compiled, and the match within [`MAX_TEST_STEPS`].
fn run(bytes: &[u8], max_event_bytes: usize) -> Result<bool, ApiError> {
    let input: FilterTest = parse_json(bytes)?;
    let filter = input
        .filter
        .ok_or_else(|| ApiError::Invalid("filter is missing".into()))?;
    let event = input
        .event
        .ok_or_else(|| ApiError::Invalid("event is missing".into()))?;
    if event.get().len() > max_event_bytes {
        return Err(ApiError::TooLarge(format!(
            "the event is {} bytes; the limit is {max_event_bytes}",
            event.get().len()
        )));
    }
    crate::event_input::readable(event.get())
        .map_err(|e| ApiError::Invalid(format!("the event {e}")))?;
    let filter = Filter::compile(&filter).map_err(|e| ApiError::Invalid(e.to_string()))?;
    let event: Value = serde_json::from_str(event.get())
        .map_err(|e| ApiError::Invalid(format!("the event {e}")))?;
    filter
        .matches_within(&event, MAX_TEST_STEPS)
        .map_err(|e| ApiError::Invalid(format!("{e}: the limit of one test")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What one test answers: ingest's reading of the event, the filter's refusal, the cap.
    #[test]
    fn one_test_table() {
        let big: Vec<String> = (0..100_000).map(|i| format!("t{i}")).collect();
        let clauses: Vec<Value> = (0..49)
            .map(|i| serde_json::json!({"tags": {"$in": [format!("x{i}")]}}))
            .collect();
        let worst = serde_json::json!({
            "filter": { "$or": clauses },
            "event": { "tags": big },
        })
        .to_string();
        let cases: &[(&str, Result<bool, &str>)] = &[
            (r#"{"filter":{"a":1},"event":{"a":1}}"#, Ok(true)),
            (
                r#"{"filter":{"a":{"$in":[2,3]}},"event":{"a":1}}"#,
                Ok(false),
            ),
            (
                r#"{"filter":{"a":1},"event":{"a":"\ud800"}}"#,
                Err("the event cannot be read as JSON values"),
            ),
            (
                r#"{"filter":{"a":1},"event":{"a":1e400}}"#,
                Err("number out of range"),
            ),
            (
                r#"{"filter":{"a":1},"event":{"a":1,"a":2}}"#,
                Err("appears twice"),
            ),
            (
                r#"{"filter":{"a":{"$gt":"x"}},"event":{}}"#,
                Err("filter/a/$gt"),
            ),
            (r#"{"filter":{}}"#, Err("event is missing")),
            (&worst, Err("takes more than 2000000 steps")),
        ];
        for (body, want) in cases {
            let got = run(body.as_bytes(), 8 << 20).map_err(|e| e.to_string());
            match (&got, want) {
                (Ok(m), Ok(w)) => assert_eq!(m, w, "{body:.80}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{body:.80}: {e}"),
                _ => panic!("{body:.80}: got {got:?}, want {want:?}"),
            }
        }
        let deep = format!(
            r#"{{"filter":{{}},"event":{}1{}}}"#,
            "[".repeat(100),
            "]".repeat(100)
        );
        assert!(run(deep.as_bytes(), 1 << 20)
            .unwrap_err()
            .to_string()
            .contains("nested deeper than 64 levels"));
    }
}
