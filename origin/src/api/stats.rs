//! `?stats=true` on `GET /v1/subscribers` and `GET /v1/subscribers/{id}`: each subscriber's
//! view with its delivery counts, limiter state and last error, as the console shows them.

use std::collections::{BTreeMap, HashMap};

use fanout_core::breaker::{BreakerConfig, BreakerView};
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use crate::ledger::SubscriberCounts;
use crate::model::{StallView, Subscriber, SubscriberView};

/// One subscriber's figures. `tokens`, `paused_until_ms` and `breaker` are the limiter as last
/// stored by the dispatcher (the origin lane's limiter; the edge keeps its own per subscriber).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubscriberStats {
    pub pending: i64,
    pub in_flight: i64,
    pub sent: i64,
    pub dead: i64,
    pub tokens: f64,
    pub paused_until_ms: Option<i64>,
    pub breaker: BreakerView,
    pub last_error: Option<String>,
    pub last_error_at_ms: Option<i64>,
    /// Present while the dispatcher's watchdog finds it stalled: due work and nothing sent
    /// past the wait it stated (this daemon's subscribers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled: Option<StallView>,
    /// Present when the stored limiter state does not decode (the subscriber starts from an
    /// empty bucket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limiter_error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ViewWithStats {
    #[serde(flatten)]
    pub view: SubscriberView,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<SubscriberStats>,
}

/// Is `stats=true` (or `1`) in the query? Other parameters are ignored.
pub fn wants_stats(q: &HashMap<String, String>) -> Result<bool, ApiError> {
    match q.get("stats").map(String::as_str) {
        None | Some("" | "false" | "0") => Ok(false),
        Some("true" | "1") => Ok(true),
        Some(other) => Err(ApiError::Invalid(format!(
            "stats must be true or false, not {other:?}"
        ))),
    }
}

/// The views of `subs`, with their figures when `counts` has them (pure).
pub fn views(
    subs: &[Subscriber],
    counts: Option<&BTreeMap<String, SubscriberCounts>>,
    stalled: &BTreeMap<String, StallView>,
    breaker: BreakerConfig,
    now_ms: i64,
) -> Vec<ViewWithStats> {
    subs.iter()
        .map(|s| ViewWithStats {
            view: SubscriberView::of(s, now_ms, None),
            stats: counts.and_then(|c| c.get(&s.id)).map(|c| SubscriberStats {
                stalled: stalled.get(&s.id).cloned(),
                ..stats(s, c, breaker, now_ms)
            }),
        })
        .collect()
}

fn stats(
    s: &Subscriber,
    c: &SubscriberCounts,
    breaker: BreakerConfig,
    now_ms: i64,
) -> SubscriberStats {
    let in_flight = u32::try_from(c.in_flight).unwrap_or(u32::MAX);
    let limiter = c
        .limiter
        .status(&s.id, s.limits.core(breaker), in_flight, now_ms);
    SubscriberStats {
        pending: c.pending,
        in_flight: c.in_flight,
        sent: c.sent,
        dead: c.dead,
        tokens: limiter.tokens,
        paused_until_ms: limiter.paused_until_ms,
        breaker: limiter.breaker,
        last_error: c.last_error.as_ref().map(|(_, e)| e.clone()),
        last_error_at_ms: c.last_error.as_ref().map(|(at, _)| *at),
        stalled: None,
        limiter_error: c.limiter_error.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_flag_table() {
        let q = |v: Option<&str>| {
            let mut m = HashMap::new();
            if let Some(v) = v {
                m.insert("stats".to_string(), v.to_string());
            }
            wants_stats(&m).map_err(|e| e.status_and_code().1)
        };
        assert_eq!(q(None), Ok(false));
        assert_eq!(q(Some("true")), Ok(true));
        assert_eq!(q(Some("1")), Ok(true));
        assert_eq!(q(Some("false")), Ok(false));
        assert_eq!(q(Some("yes")), Err("invalid_request"));
    }
}
