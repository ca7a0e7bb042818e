//! `GET /v1/series`: the charts' points over the last 15 minutes (`window=15m`) or hour (`1h`,
//! both 10 s buckets) or day (`1d`, 5 min buckets), of one subscriber (`subscriber=ID`) or of
//! every subscriber the caller sees combined (a portal token: its customer's), with the
//! in-flight cap configured now ([`configured_cap`]). Reads the kept buckets
//! (`crate::series`), never the deliveries; the arithmetic is `crate::series::buckets`. A
//! subscriber's chart starts at its creation: one created again under an old id (a new
//! `fanout listen` session) starts with empty buckets.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::response::IntoResponse;
use axum::Json;

use super::auth::Principal;
use super::error::ApiError;
use super::state::AppState;
use crate::ledger::series::SeriesLedger as _;
use crate::ledger::{Customers as _, Subscribers as _};
use crate::series::buckets::{bucket_start, combine, SeriesView, Window};
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

/// `GET /v1/series`'s answer: the buckets, and the in-flight cap configured now.
#[derive(Debug, serde::Serialize)]
struct Charted {
    #[serde(flatten)]
    series: SeriesView,
    /// What the chart draws as the cap: [`configured_cap`] of what it shows.
    in_flight_cap: u64,
}

/// The in-flight cap configured for what a chart shows (pure): the subscribers'
/// `max_in_flight` added up per customer, each customer's sum held to its own cap; with
/// `total_cap` (the daemon's `--max-total-in-flight`, for the operator's charts), held to that.
pub fn configured_cap(
    subscribers: &[(u32, Option<&str>)],
    customer_caps: &HashMap<String, u32>,
    total_cap: Option<u64>,
) -> u64 {
    let mut by_customer: HashMap<Option<&str>, u64> = HashMap::new();
    for (cap, customer) in subscribers {
        *by_customer.entry(*customer).or_default() += u64::from(*cap);
    }
    let sum: u64 = by_customer
        .into_iter()
        .map(
            |(customer, sum)| match customer.and_then(|c| customer_caps.get(c)) {
                Some(own) => sum.min(u64::from(*own)),
                None => sum,
            },
        )
        .sum();
    total_cap.map_or(sum, |t| sum.min(t))
}

pub(super) async fn series(
    State(state): State<AppState>,
    who: Principal,
    Query(q): Query<HashMap<String, String>>,
) -> Result<impl IntoResponse, ApiError> {
    let (window, subscriber) = query(&q)?;
    let scope = who.scope();
    // One the caller does not see is not found, as everywhere.
    let subs = match &subscriber {
        Some(id) => vec![state.ledger.subscriber(id.clone(), scope.clone()).await?],
        None => {
            state
                .ledger
                .subscribers(None, false, scope.clone())
                .await?
                .0
        }
    };
    let shown = subscriber
        .as_ref()
        .and_then(|_| subs.first().map(|s| s.created_ms));
    let customer_caps: HashMap<String, u32> = state
        .ledger
        .customers(None)
        .await?
        .into_iter()
        .filter_map(|(c, _)| c.max_in_flight.map(|m| (c.id, m)))
        .collect();
    let caps: Vec<(u32, Option<&str>)> = subs
        .iter()
        .map(|s| (s.limits.max_in_flight, s.customer.as_deref()))
        .collect();
    let total = scope
        .is_none()
        .then_some(state.cfg.max_total_in_flight as u64);
    let in_flight_cap = configured_cap(&caps, &customer_caps, total);
    let now = now_ms();
    let (from, to) = window.range(now);
    // A subscriber's chart starts at the bucket it was created in.
    let from = shown.map_or(from, |created| {
        from.max(bucket_start(created, window.resolution_ms()))
    });
    let rows = state
        .ledger
        .read_series(window.resolution_ms(), from, to, subscriber.clone(), scope)
        .await?;
    Ok(Json(Charted {
        series: combine(window, now, subscriber, &rows),
        in_flight_cap,
    }))
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
        assert_eq!(q(&[("window", "15m")]), Ok((Window::Quarter, None)));
        assert_eq!(q(&[("window", "7d")]), Err("invalid_request"));
        assert_eq!(q(&[("since", "1")]), Err("invalid_request"));
    }

    #[test]
    fn the_cap_is_the_configured_one() {
        let caps: HashMap<String, u32> = [("acme".to_string(), 10)].into();
        // (subscribers' caps and customers, the total cap, the cap shown)
        type Case<'a> = (&'a [(u32, Option<&'a str>)], Option<u64>, u64);
        let cases: &[Case] = &[
            (&[], None, 0),
            (&[(16, None)], None, 16),
            (&[(16, None), (8, None)], None, 24),
            (&[(8, Some("acme")), (8, Some("acme"))], None, 10),
            (
                &[(12, Some("acme")), (8, Some("globex")), (4, None)],
                None,
                22,
            ),
            (
                &[(12, Some("acme")), (8, Some("globex")), (4, None)],
                Some(20),
                20,
            ),
            (&[(4, Some("acme"))], Some(20), 4),
        ];
        for (subs, total, expected) in cases {
            assert_eq!(
                configured_cap(subs, &caps, *total),
                *expected,
                "{subs:?} {total:?}"
            );
        }
    }
}
