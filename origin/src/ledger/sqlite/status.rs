//! Read-only per-subscriber figures for the console and `?stats=true`: deliveries by status
//! (`delivery_counts`), the stored limiter state and the most recent error (`last_errors`),
//! both kept by triggers (migration 4), so a lookup costs the same at any ledger size.
//! Nothing here writes.

use std::collections::BTreeMap;

use fanout_core::limiter::LimiterState;
use rusqlite::{Connection, OptionalExtension};

use super::{read_limiter, LedgerError, StoredLimiter};

/// One subscriber's figures as the ledger holds them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubscriberCounts {
    pub pending: i64,
    pub in_flight: i64,
    pub sent: i64,
    pub dead: i64,
    /// The most recent failed or rejected attempt: when, and what went wrong.
    pub last_error: Option<(i64, String)>,
    /// The limiter state as last stored by the dispatcher.
    pub limiter: LimiterState,
    /// Why the stored limiter state does not decode, if it does not (the dispatcher starts
    /// the subscriber from an empty bucket; `limiter` shows that bucket).
    pub limiter_error: Option<String>,
}

/// Figures for each of `ids` (zeros for an id without deliveries), keyed by subscriber id.
pub fn subscriber_counts(
    c: &Connection,
    ids: &[String],
    now_ms: i64,
) -> Result<BTreeMap<String, SubscriberCounts>, LedgerError> {
    let mut out = BTreeMap::new();
    let mut counts =
        c.prepare_cached("SELECT status, n FROM delivery_counts WHERE subscriber_id = ?1")?;
    let mut last =
        c.prepare_cached("SELECT at_ms, status, error FROM last_errors WHERE subscriber_id = ?1")?;
    for id in ids {
        let mut s = SubscriberCounts::default();
        let rows = counts.query_map([id], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        for row in rows {
            let (status, n) = row?;
            match status.as_str() {
                "pending" => s.pending = n,
                "in_flight" => s.in_flight = n,
                "sent" => s.sent = n,
                "dead" => s.dead = n,
                _ => {}
            }
        }
        s.last_error = last
            .query_row([id], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, Option<u16>>(1)?,
                    r.get::<_, Option<String>>(2)?,
                ))
            })
            .optional()?
            .map(|(at, status, error)| (at, describe(status, error)));
        match read_limiter(c, id)? {
            StoredLimiter::Never => {}
            StoredLimiter::Decoded(state) => s.limiter = state,
            StoredLimiter::Undecodable(why) => {
                s.limiter = LimiterState::empty(now_ms);
                s.limiter_error = Some(why);
            }
        }
        out.insert(id.clone(), s);
    }
    Ok(out)
}

/// A failed attempt in a few words: its error, else its HTTP status.
fn describe(status: Option<u16>, error: Option<String>) -> String {
    match (error, status) {
        (Some(e), Some(s)) => format!("{s}: {e}"),
        (Some(e), None) => e,
        (None, Some(s)) => format!("HTTP {s}"),
        (None, None) => "failed".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{apply, claim, create_subscriber, ingest, AttemptRecord};
    use crate::ledger::{Outcome, Transition};

    #[test]
    fn counts_and_last_error() {
        let c = crate::ledger::test_db();
        let sub = crate::ledger::test_subscriber("a", &["*"]);
        create_subscriber(&c, &sub, "s").unwrap();
        ingest(&c, &crate::ledger::test_events(3), 0).unwrap();
        let ids: Vec<i64> = claim(&c, &[("a".into(), 2)], &[], 0, 100).unwrap()[0]
            .claimed
            .iter()
            .map(|d| d.rowid)
            .collect();
        let attempt = |at_ms, outcome, status, error: Option<&str>| AttemptRecord {
            attempt: 1,
            at_ms,
            lane: "origin",
            outcome,
            status,
            latency_ms: Some(1),
            response_body: None,
            error: error.map(Into::into),
        };
        apply(
            &c,
            &[
                Outcome {
                    rowid: ids[0],
                    transition: Transition::Sent,
                    attempt: Some(attempt(5, "delivered", Some(200), None)),
                },
                Outcome {
                    rowid: ids[1],
                    transition: Transition::Dead {
                        reason: "gone".into(),
                    },
                    attempt: Some(attempt(6, "rejected", Some(410), None)),
                },
            ],
            &[],
            7,
        )
        .unwrap();
        let got = subscriber_counts(&c, &["a".into(), "nobody".into()], 0).unwrap();
        let a = &got["a"];
        assert_eq!(
            (a.pending, a.in_flight, a.sent, a.dead),
            (1, 0, 1, 1),
            "{a:?}"
        );
        assert_eq!(a.last_error, Some((6, "HTTP 410".into())));
        assert_eq!(got["nobody"], SubscriberCounts::default());
        assert_eq!(describe(Some(503), Some("x".into())), "503: x");
        assert_eq!(describe(None, Some("timeout".into())), "timeout");
    }
}
