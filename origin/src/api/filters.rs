//! `POST /v1/filters/test`: does a content filter (`crate::event_filter`) match an event? For
//! the console and the portal ("does my filter match this event?"), with the admin token or a
//! portal token alike: it reads nothing from the ledger. A filter it refuses is the 400 a
//! subscriber with that filter would get, naming where it is wrong.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::Value;

use super::body::{parse_json, read_body};
use super::error::ApiError;
use super::state::AppState;
use crate::event_filter::Filter;

/// The body of `POST /v1/filters/test`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterTest {
    filter: Option<Value>,
    event: Option<Value>,
}

pub(super) async fn test_filter(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<impl IntoResponse, ApiError> {
    // An event as large as ingest takes, and its filter.
    let limit = state.cfg.max_event_bytes + super::body::MAX_ADMIN_BYTES;
    let bytes = read_body(&state.cfg, &headers, body, limit).await?;
    let input: FilterTest = parse_json(&bytes)?;
    let filter = input
        .filter
        .ok_or_else(|| ApiError::Invalid("filter is missing".into()))?;
    let event = input
        .event
        .ok_or_else(|| ApiError::Invalid("event is missing".into()))?;
    let filter = Filter::compile(&filter).map_err(|e| ApiError::Invalid(e.to_string()))?;
    Ok(Json(
        serde_json::json!({ "matches": filter.matches(&event) }),
    ))
}
