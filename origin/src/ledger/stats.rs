//! What `/metrics` and `/healthz` read from either backend: the per-subscriber gauges, the
//! deliveries per status and retention's report, and whether the ledger answers. No SQL here.

use std::collections::HashMap;
use std::future::Future;

use fanout_core::breaker::BreakerConfig;
use fanout_core::limiter::LimiterState;
use serde::Serialize;

use super::error::LedgerError;
use super::retention::RetentionReport;
use crate::model::{Lane, Subscriber};

/// One live subscriber's gauges.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SubscriberStats {
    pub id: String,
    /// The configured lane (`auto` follows whether an edge is configured).
    pub lane: Lane,
    pub rate_per_sec: f64,
    pub burst: u32,
    pub max_in_flight: u32,
    pub pending: i64,
    pub in_flight: i64,
    pub sent: i64,
    pub dead: i64,
    /// When the oldest delivery not yet sent or dead (pending or in flight) was created.
    pub oldest_pending_at_ms: Option<i64>,
    /// The origin's limiter: paused (by a 429 or 503 with `Retry-After`) until then.
    pub paused_until_ms: Option<i64>,
    /// `closed`, `open` or `half_open`.
    pub breaker: String,
    pub consecutive_failures: u32,
    /// Disabled (a 410, `--disable-after` of failures, or by hand): nothing is claimed for it.
    pub disabled: bool,
    /// The customer that owns it (the charts' per-customer totals, `crate::series`); not shown.
    #[serde(skip)]
    pub customer: Option<String>,
}

impl SubscriberStats {
    /// The gauges of `s` from its kept counts by status, the creation time of its oldest open
    /// delivery and its stored limiter (either ledger).
    pub fn of(
        s: Subscriber,
        by_status: &HashMap<String, i64>,
        oldest_pending_at_ms: Option<i64>,
        limiter: &LimiterState,
        breaker: BreakerConfig,
        now_ms: i64,
    ) -> SubscriberStats {
        let n = |status: &str| by_status.get(status).copied().unwrap_or(0);
        let view = limiter.breaker.view(breaker, now_ms);
        SubscriberStats {
            lane: s.lane,
            rate_per_sec: s.limits.rate_per_sec,
            burst: s.limits.burst,
            max_in_flight: s.limits.max_in_flight,
            pending: n("pending"),
            in_flight: n("in_flight"),
            sent: n("sent"),
            dead: n("dead"),
            oldest_pending_at_ms,
            paused_until_ms: limiter.paused_until_ms.filter(|&p| p > now_ms),
            breaker: view.state.as_str().to_string(),
            consecutive_failures: view.consecutive_failures,
            disabled: s.health.disabled.is_some(),
            customer: s.customer,
            id: s.id,
        }
    }
}

/// What `/metrics` reads from the ledger: deliveries per status, per-subscriber figures, and
/// what retention did.
pub type MetricsSnapshot = (Vec<(String, i64)>, Vec<SubscriberStats>, RetentionReport);

pub trait Observe {
    /// Answers when the ledger does.
    fn ping(&self) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// Deliveries per status and per-subscriber figures, for `/metrics` (on SQLite from one
    /// snapshot of the reader connection, so a scrape never holds up the dispatcher's writes).
    fn metrics_snapshot(
        &self,
        now_ms: i64,
        breaker: BreakerConfig,
    ) -> impl Future<Output = Result<MetricsSnapshot, LedgerError>> + Send;
}
