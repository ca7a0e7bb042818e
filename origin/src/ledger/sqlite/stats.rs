//! The per-subscriber gauges of `/metrics`, read from the ledger at scrape time: the counts
//! that triggers keep as deliveries change (`delivery_counts`, migration 4, exact by
//! construction) and keyed lookups, never a scan of the deliveries. The console's figures are
//! in `status`.

use std::collections::HashMap;

use fanout_core::breaker::BreakerConfig;
use fanout_core::limiter::LimiterState;
use rusqlite::Connection;
use serde::Serialize;

use super::{list_subscribers, load_limiter, LedgerError};
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
            id: s.id,
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{apply, claim, create_subscriber, ingest, Outcome, Transition};
    use crate::model::{Disabled, Subscriber};

    fn sub(id: &str) -> Subscriber {
        crate::ledger::test_subscriber(id, &["*"])
    }

    #[test]
    fn counts_and_oldest_open_per_subscriber() {
        let c = crate::ledger::test_db();
        create_subscriber(&c, &sub("a"), "s").unwrap();
        create_subscriber(&c, &sub("b"), "s").unwrap();
        let events = crate::ledger::test_events(4);
        ingest(&c, &events[..2], 100).unwrap();
        ingest(&c, &events[2..], 200).unwrap();
        // a: lease 3 of its 4; one sent, one retrying with an error, one dead; one pending.
        let claims = claim(&c, &[("a".into(), 3)], &[], 1_000, 9_000).unwrap();
        let ids: Vec<i64> = claims[0].claimed.iter().map(|d| d.rowid).collect();
        let outcomes = vec![
            Outcome {
                rowid: ids[0],
                transition: Transition::Sent,
                attempt: None,
            },
            Outcome {
                rowid: ids[1],
                transition: Transition::Retry {
                    at_ms: 5_000,
                    error: "status 503".into(),
                },
                attempt: None,
            },
        ];
        apply(&c, &outcomes, &[], 2_000).unwrap();
        let dead = vec![Outcome {
            rowid: ids[2],
            transition: Transition::Dead {
                reason: "status 410".into(),
            },
            attempt: None,
        }];
        apply(&c, &dead, &[], 3_000).unwrap();
        let off = Disabled {
            at_ms: 3_500,
            reason: "by hand".into(),
            by_operator: true,
        };
        crate::ledger::set_disabled(&c, "b", Some(&off)).unwrap();
        let stats = subscriber_stats(&c, BreakerConfig::default(), 4_000).unwrap();
        let got: Vec<_> = stats
            .iter()
            .map(|s| {
                (
                    s.id.as_str(),
                    s.pending,
                    s.in_flight,
                    s.sent,
                    s.dead,
                    s.oldest_pending_at_ms,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![("a", 2, 0, 1, 1, Some(100)), ("b", 4, 0, 0, 0, Some(100)),]
        );
        assert_eq!(
            stats.iter().map(|s| s.disabled).collect::<Vec<_>>(),
            [false, true]
        );
        assert_eq!(stats[0].breaker, "closed");
        assert_eq!(stats[0].paused_until_ms, None);
    }
}
