//! Read-only per-subscriber figures for the console and `?stats=true`: deliveries by status
//! (`delivery_counts`), the stored limiter state and the most recent error (`last_errors`),
//! both kept by triggers (migration 4), so a lookup costs the same at any ledger size.
//! Nothing here writes.

use std::collections::BTreeMap;

use fanout_core::limiter::LimiterState;
use rusqlite::{Connection, OptionalExtension};

use super::limiters::{read_limiter, StoredLimiter};
use crate::ledger::error::LedgerError;
use crate::ledger::subscribers::{earlier_sql, SubscriberCounts};
use crate::model::{Status, Subscriber};

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

/// Each of `subs`' figures from its creation on ([`SubscriberCounts::since_creation`]): what
/// an earlier subscriber under its id left is left out.
pub fn since_creation(
    c: &Connection,
    subs: &[Subscriber],
    counts: &mut BTreeMap<String, SubscriberCounts>,
) -> Result<(), LedgerError> {
    let mut sent = c.prepare_cached(&earlier_sql(Status::Sent, "?1", "?2"))?;
    let mut dead = c.prepare_cached(&earlier_sql(Status::Dead, "?1", "?2"))?;
    for s in subs {
        if let Some(n) = counts.get_mut(&s.id) {
            let args = rusqlite::params![s.id, s.created_ms];
            let earlier_sent: i64 = sent.query_row(args, |r| r.get(0))?;
            let earlier_dead: i64 = dead.query_row(args, |r| r.get(0))?;
            n.since_creation(s.created_ms, earlier_sent, earlier_dead);
        }
    }
    Ok(())
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
    use crate::ledger::sqlite::{apply, claim, create_subscriber, ingest};
    use crate::ledger::AttemptRecord;
    use crate::ledger::{Outcome, Transition};

    #[test]
    fn counts_and_last_error() {
        let c = crate::ledger::sqlite::test_db();
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
