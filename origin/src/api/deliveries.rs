//! `/v1/deliveries` and replay: list deliveries by a filter, read one with its attempts, and
//! put finished ones back in the queue (one, or in bulk by a filter, in short steps). The
//! filter is parsed here (pure); the ledger applies it within the caller's scope. It does not
//! deliver anything: the dispatcher is told which subscribers have work again.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::auth::Principal;
use super::body::{parse_json_or_default, read_body, MAX_ADMIN_BYTES};
use super::error::ApiError;
use super::extract::PathId;
use super::state::AppState;
use super::views;
use crate::dispatch::Control;
use crate::ledger::Deliveries as _;
use crate::ledger::{DeliveryFilter, LedgerError};
use crate::model::{parse_delivery_id, Status};
use crate::time::{now_ms, parse_time};

/// Deliveries one step of a bulk replay looks at: one short writer transaction.
const REPLAY_STEP: usize = 500;
/// Deliveries one `POST /v1/replay` looks at, at most; `more` and `next` say where to go on.
const REPLAY_PER_CALL: usize = 10_000;
/// The pause between two steps, which lets ingest and the dispatcher write in between.
const REPLAY_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeliveryQuery {
    status: Option<String>,
    subscriber: Option<String>,
    event: Option<String>,
    /// Only events of this type.
    #[serde(rename = "type")]
    event_type: Option<String>,
    since: Option<serde_json::Value>,
    until: Option<serde_json::Value>,
    after: Option<String>,
    limit: Option<usize>,
    /// `POST /v1/replay` only: count what would be replayed, change nothing.
    dry_run: Option<bool>,
}

fn time_arg(name: &str, v: Option<serde_json::Value>) -> Result<Option<i64>, ApiError> {
    let bad = || {
        ApiError::Invalid(format!(
            "{name} must be unix milliseconds or an RFC 3339 time"
        ))
    };
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Number(n)) => n.as_i64().map(Some).ok_or_else(bad),
        Some(serde_json::Value::String(s)) if s.is_empty() => Ok(None),
        Some(serde_json::Value::String(s)) => parse_time(&s).map(Some).ok_or_else(bad),
        Some(_) => Err(bad()),
    }
}

/// Turn query or body arguments into a ledger filter (pure).
fn filter_from(q: DeliveryQuery) -> Result<DeliveryFilter, ApiError> {
    let status = match q.status.as_deref() {
        None | Some("") => None,
        Some(s) => Some(Status::parse(s).ok_or_else(|| {
            ApiError::Invalid(format!(
                "status must be pending, in_flight, sent or dead, not {s:?}"
            ))
        })?),
    };
    let after = match q.after.as_deref() {
        None | Some("") => None,
        Some(a) => Some(
            parse_delivery_id(a)
                .ok_or_else(|| ApiError::Invalid("after must be a delivery id".into()))?,
        ),
    };
    Ok(DeliveryFilter {
        status,
        subscriber: q.subscriber.filter(|s| !s.is_empty()),
        event: q.event.filter(|s| !s.is_empty()),
        event_type: q.event_type.filter(|s| !s.is_empty()),
        customer: None,
        since_ms: time_arg("since", q.since)?,
        until_ms: time_arg("until", q.until)?,
        after,
        limit: q.limit.unwrap_or(1000).clamp(1, 10_000),
    })
}

pub(super) async fn list_deliveries(
    State(state): State<AppState>,
    who: Principal,
    Query(q): Query<HashMap<String, String>>,
) -> Result<impl IntoResponse, ApiError> {
    let mut query = DeliveryQuery::default();
    for (k, v) in q {
        match k.as_str() {
            "status" => query.status = Some(v),
            "subscriber" => query.subscriber = Some(v),
            "event" => query.event = Some(v),
            "type" => query.event_type = Some(v),
            "since" => query.since = Some(serde_json::Value::String(v)),
            "until" => query.until = Some(serde_json::Value::String(v)),
            "after" => query.after = Some(v),
            "limit" => {
                query.limit = Some(
                    v.parse()
                        .map_err(|_| ApiError::Invalid("limit must be a number".into()))?,
                )
            }
            other => {
                return Err(ApiError::Invalid(format!(
                    "unknown query parameter {other:?}"
                )))
            }
        }
    }
    let mut filter = filter_from(query)?;
    filter.customer = who.scope();
    let limit = filter.limit;
    let rows = state.ledger.list_deliveries(filter).await?;
    let next = (rows.len() == limit)
        .then(|| rows.last().map(|d| d.id.clone()))
        .flatten();
    Ok(Json(views::DeliveryList {
        deliveries: rows,
        next,
    }))
}

fn delivery_id(id: &str) -> Result<i64, ApiError> {
    parse_delivery_id(id).ok_or_else(|| ApiError::NotFound(format!("no delivery {id}")))
}

pub(super) async fn get_delivery(
    State(state): State<AppState>,
    who: Principal,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    let rowid = delivery_id(&id)?;
    let scope = who.scope();
    Ok(Json(state.ledger.get_delivery(rowid, scope).await?))
}

pub(super) async fn replay_one(
    State(state): State<AppState>,
    who: Principal,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    let rowid = delivery_id(&id)?;
    let now = now_ms();
    let scope = who.scope();
    let sub = state.ledger.replay_one(rowid, now, scope).await?;
    state.tell(Control::Replayed(vec![sub]));
    Ok((
        StatusCode::ACCEPTED,
        Json(views::ReplayedOne {
            id,
            status: Status::Pending,
        }),
    ))
}

pub(super) async fn replay_bulk(
    State(state): State<AppState>,
    who: Principal,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&state.cfg, &headers, body, MAX_ADMIN_BYTES).await?;
    let q: DeliveryQuery = parse_json_or_default(&bytes)?;
    let dry_run = q.dry_run.unwrap_or(false);
    let mut filter = filter_from(q)?;
    filter.customer = who.scope();
    let now = now_ms();
    let unknown = |e| match e {
        LedgerError::NotFound(m) => ApiError::UnknownSubscriber(m),
        other => ApiError::Ledger(other),
    };
    if dry_run && filter.status == Some(Status::Pending) {
        return Ok(Json(json!({ "count": 0 })).into_response());
    }
    if dry_run {
        let n = state
            .ledger
            .count_replayable(filter)
            .await
            .map_err(unknown)?;
        return Ok(Json(json!({ "count": n })).into_response());
    }
    // What is pending already is in the queue: replaying it changes nothing.
    if filter.status == Some(Status::Pending) {
        return Ok((
            StatusCode::ACCEPTED,
            Json(views::Replayed {
                replayed: 0,
                more: false,
                next: None,
            }),
        )
            .into_response());
    }
    // In steps, each a short transaction, with a pause between them (as retention), and no
    // more than REPLAY_PER_CALL deliveries looked at per call: the answer says where to go on.
    let mut replayed = 0u64;
    let mut looked_at = 0usize;
    let mut step = filter.clone();
    let more = loop {
        step.limit = REPLAY_STEP.min(REPLAY_PER_CALL - looked_at);
        let done = state
            .ledger
            .replay_step(step.clone(), now)
            .await
            .map_err(unknown)?;
        replayed += done.replayed;
        looked_at += step.limit;
        if !done.subscribers.is_empty() {
            state.tell(Control::Replayed(done.subscribers));
        }
        step.after = done.last.or(step.after);
        if done.done {
            break false;
        }
        if looked_at >= REPLAY_PER_CALL {
            break true;
        }
        tokio::time::sleep(REPLAY_PAUSE).await;
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(views::Replayed {
            replayed,
            more,
            next: more
                .then(|| step.after.map(crate::model::delivery_public_id))
                .flatten(),
        }),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_table() {
        let q = |status: Option<&str>, since: Option<&str>| DeliveryQuery {
            status: status.map(Into::into),
            since: since.map(|s| serde_json::Value::String(s.into())),
            ..Default::default()
        };
        assert_eq!(
            filter_from(q(Some("dead"), None)).unwrap().status,
            Some(Status::Dead)
        );
        assert!(filter_from(q(Some("lost"), None)).is_err());
        assert_eq!(
            filter_from(q(None, Some("1970-01-01T00:00:01Z")))
                .unwrap()
                .since_ms,
            Some(1000)
        );
        assert_eq!(
            filter_from(q(None, Some("1500"))).unwrap().since_ms,
            Some(1500)
        );
        assert!(filter_from(q(None, Some("soon"))).is_err());
        assert_eq!(filter_from(q(None, None)).unwrap().limit, 1000);
    }
}
