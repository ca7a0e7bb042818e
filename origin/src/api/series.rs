//! `GET /v1/series`: the charts' points over the last hour (`window=1h`, 10 s buckets) or day
//! (`1d`, 5 min buckets), of one subscriber (`subscriber=ID`) or of every subscriber the caller
//! sees combined (a portal token: its customer's). Reads the kept buckets
//! (`crate::series`), never the deliveries; the arithmetic is `crate::series::buckets`.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::response::IntoResponse;
use axum::Json;

use super::auth::Principal;
use super::error::ApiError;
use super::state::AppState;
use crate::ledger::series::SeriesLedger as _;
use crate::ledger::Subscribers as _;
use crate::series::buckets::{combine, Window};
use crate::time::now_ms;

/// The window and subscriber a query asks for (pure).
fn query(q: &HashMap<String, String>) -> Result<(Window, Option<String>), ApiError> {
    if let Some(k) = q
        .keys()
        .find(|k| !["window", "subscriber"].contains(&k.as_str()))
    {
        return Err(ApiError::Invalid(format!("unknown query parameter {k:?}")));
    }
    let window = Window::parse(q.get("window").map(String::as_str)).map_err(ApiError::Invalid)?;
    let subscriber = q.get("subscriber").filter(|s| !s.is_empty()).cloned();
    Ok((window, subscriber))
}

pub(super) async fn series(
    State(state): State<AppState>,
    who: Principal,
    Query(q): Query<HashMap<String, String>>,
) -> Result<impl IntoResponse, ApiError> {
    let (window, subscriber) = query(&q)?;
    let scope = who.scope();
    if let Some(id) = &subscriber {
        // One the caller does not see is not found, as everywhere.
        state.ledger.subscriber(id.clone(), scope.clone()).await?;
    }
    let now = now_ms();
    let (from, to) = window.range(now);
    let rows = state
        .ledger
        .read_series(window.resolution_ms(), from, to, subscriber.clone(), scope)
        .await?;
    Ok(Json(combine(window, now, subscriber, &rows)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_table() {
        let q = |pairs: &[(&str, &str)]| {
            query(
                &pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
            .map_err(|e| e.status_and_code().1)
        };
        assert_eq!(q(&[]), Ok((Window::Hour, None)));
        assert_eq!(
            q(&[("window", "1d"), ("subscriber", "a")]),
            Ok((Window::Day, Some("a".into())))
        );
        assert_eq!(q(&[("subscriber", "")]), Ok((Window::Hour, None)));
        assert_eq!(q(&[("window", "7d")]), Err("invalid_request"));
        assert_eq!(q(&[("since", "1")]), Err("invalid_request"));
    }
}
