//! The per-subscriber gauges of `/metrics`, read from the ledger at scrape time: the counts
//! that triggers keep as deliveries change (`delivery_counts`, migration 4, exact by
//! construction) and keyed lookups, never a scan of the deliveries. The console's figures are
//! in `status`.

use std::collections::HashMap;

use fanout_core::breaker::BreakerConfig;
use rusqlite::Connection;

use super::deliveries::status_counts;
use super::ledger::Ledger;
use super::limiters::load_limiter;
use super::retention::report;
use super::subscribers::list_subscribers;
use crate::ledger::error::LedgerError;
use crate::ledger::stats::{MetricsSnapshot, Observe, SubscriberStats};

/// Every live subscriber's gauges, ordered by id: the counts the triggers keep
/// (`delivery_counts`) and two keyed lookups per subscriber for its oldest open delivery, so
/// the cost follows the number of subscribers, not of deliveries.
pub fn subscriber_stats(
    c: &Connection,
    breaker: BreakerConfig,
    now_ms: i64,
) -> Result<Vec<SubscriberStats>, LedgerError> {
    let mut counts: HashMap<String, HashMap<String, i64>> = HashMap::new();
    let mut st = c.prepare_cached("SELECT subscriber_id, status, n FROM delivery_counts")?;
    let rows = st.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    for row in rows {
        let (sub, status, n) = row?;
        counts.entry(sub).or_default().insert(status, n);
    }
    let mut out = Vec::new();
    for s in list_subscribers(c)? {
        let limiter = load_limiter(c, &s.id, now_ms)?;
        let mine = counts.remove(&s.id).unwrap_or_default();
        let oldest = oldest_open(c, &s.id)?;
        out.push(SubscriberStats::of(
            s, &mine, oldest, &limiter, breaker, now_ms,
        ));
    }
    Ok(out)
}

/// When `subscriber`'s oldest open (pending or in flight) delivery was created: the first of
/// each status in id order (creation order), by the `(subscriber_id, status)` index.
pub fn oldest_open(c: &Connection, subscriber: &str) -> Result<Option<i64>, LedgerError> {
    Ok(c.prepare_cached(
        "SELECT MIN(created_ms) FROM (
             SELECT created_ms FROM (SELECT created_ms FROM deliveries
                 WHERE subscriber_id = ?1 AND status = 'pending' ORDER BY id LIMIT 1)
             UNION ALL
             SELECT created_ms FROM (SELECT created_ms FROM deliveries
                 WHERE subscriber_id = ?1 AND status = 'in_flight' ORDER BY id LIMIT 1))",
    )?
    .query_row([subscriber], |r| r.get(0))?)
}

impl Observe for Ledger {
    async fn ping(&self) -> Result<(), LedgerError> {
        self.call(|c| Ok(c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0))?))
            .await?;
        Ok(())
    }

    async fn metrics_snapshot(
        &self,
        now_ms: i64,
        breaker: BreakerConfig,
    ) -> Result<MetricsSnapshot, LedgerError> {
        self.read(move |c| {
            let snapshot = c.transaction()?;
            Ok((
                status_counts(&snapshot)?,
                subscriber_stats(&snapshot, breaker, now_ms)?,
                report(&snapshot)?,
            ))
        })
        .await
    }
}
