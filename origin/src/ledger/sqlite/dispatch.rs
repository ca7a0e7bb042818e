//! [`DispatchLedger`] on the SQLite ledger: each operation one closure on the writer (or the
//! reader) thread; a turn is one transaction. Does not decide anything (the dispatcher does).

use fanout_core::limiter::LimiterState;

use super::customers::list_customers;
use super::health::{apply_health, check_dead_counts, rearm_dead_alerts};
use super::leases::{
    apply, claim_runs, due_summary, release_all_leases, release_expired_leases, release_strays,
};
use super::ledger::Ledger;
use super::limiters::load_limiter;
use super::subscribers::{get_subscriber, list_subscribers};
use crate::ledger::dispatch::{DispatchLedger, Recorded, Turn, TurnError};
use crate::ledger::error::LedgerError;
use crate::model::{InFlight, Share, Subscriber};

impl DispatchLedger for Ledger {
    async fn dispatch_subscribers(&self) -> Result<Vec<(Subscriber, LimiterState)>, LedgerError> {
        // A stored limiter that does not decode starts empty as of now (`load_limiter`).
        let now = crate::time::now_ms();
        self.read(move |c| {
            let mut out = Vec::new();
            for s in list_subscribers(c)? {
                let limiter = load_limiter(c, &s.id, now)?;
                out.push((s, limiter));
            }
            Ok(out)
        })
        .await
    }

    async fn dispatch_subscriber(
        &self,
        id: &str,
    ) -> Result<Option<(Subscriber, LimiterState)>, LedgerError> {
        let id = id.to_string();
        let now = crate::time::now_ms();
        // On the writer: the change that prompted this read has just committed there.
        self.call(move |c| match get_subscriber(c, &id) {
            Ok(s) => {
                let limiter = load_limiter(c, &id, now)?;
                Ok(Some((s, limiter)))
            }
            Err(LedgerError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        })
        .await
    }

    async fn dispatch_customers(&self) -> Result<Vec<(String, u32, Option<u32>)>, LedgerError> {
        // On the writer: the change that prompted this read has just committed there.
        self.call(|c| {
            Ok(list_customers(c)?
                .into_iter()
                .map(|c| (c.id, c.weight, c.max_in_flight))
                .collect())
        })
        .await
    }

    async fn record_turn(&self, turn: Turn) -> Result<Recorded, TurnError> {
        // The turn travels to the writer thread in a slot it is put back into after running, so
        // a failure — of the writes, of the commit, or a ledger that never ran it — hands it
        // back whole, without a copy.
        let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(turn)));
        let held = slot.clone();
        let result = self
            .tx(move |c| {
                let guard = held.lock().unwrap_or_else(|p| p.into_inner());
                match guard.as_ref() {
                    Some(turn) => record_turn_sql(c, turn),
                    None => Err(LedgerError::Closed),
                }
            })
            .await;
        match result {
            Ok(recorded) => Ok(recorded),
            Err(error) => {
                let turn = slot
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .unwrap_or_default();
                Err(TurnError { turn, error })
            }
        }
    }

    async fn due_work(&self, dead_threshold: u64) -> Result<Vec<(String, i64)>, LedgerError> {
        self.tx(move |c| {
            rearm_dead_alerts(c, dead_threshold)?;
            due_summary(c)
        })
        .await
    }

    async fn release_expired_leases(&self, now_ms: i64) -> Result<Vec<String>, LedgerError> {
        self.tx(move |c| release_expired_leases(c, now_ms)).await
    }

    async fn release_all_leases(&self, now_ms: i64) -> Result<usize, LedgerError> {
        self.tx(move |c| release_all_leases(c, now_ms)).await
    }

    async fn release_strays(
        &self,
        held: Vec<i64>,
        now_ms: i64,
    ) -> Result<Vec<String>, LedgerError> {
        self.tx(move |c| release_strays(c, &held, now_ms)).await
    }

    /// A SQLite ledger has one daemon (the owner lock): it owns every subscriber.
    async fn share(
        &self,
        _in_flight: &[(Option<String>, usize)],
    ) -> Result<Option<(Share, InFlight)>, LedgerError> {
        Ok(None)
    }

    async fn leave(&self) -> Result<(), LedgerError> {
        Ok(())
    }
}

/// [`DispatchLedger::record_turn`] on one connection, inside the caller's transaction.
fn record_turn_sql(c: &rusqlite::Connection, turn: &Turn) -> Result<Recorded, LedgerError> {
    let now = turn.now_ms;
    let due = if turn.outcomes.is_empty() {
        Vec::new()
    } else {
        apply(c, &turn.outcomes, &[], now)?
    };
    if !turn.health.is_empty() {
        apply_health(c, &turn.health)?;
    }
    let mut notices = turn.notices.clone();
    if !turn.dead.is_empty() {
        notices.extend(check_dead_counts(c, &turn.dead, turn.dead_threshold, now)?);
    }
    let asks = turn.asks();
    let runs: std::collections::HashMap<&str, usize> = turn
        .batch_per
        .iter()
        .filter(|(id, _)| turn.runs.contains(id))
        .map(|(id, per)| (id.as_str(), *per))
        .collect();
    let claims = claim_runs(c, &asks, &runs, &turn.limiters, now, turn.lease_until_ms)?;
    Ok(Recorded {
        claims,
        notices,
        due,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::sqlite::{create_subscriber, get_delivery, ingest};
    use crate::ledger::{test_events, test_subscriber};
    use crate::model::{AttemptRecord, Outcome, Transition};

    fn attempt(n: u32, body: &str) -> Option<AttemptRecord> {
        Some(AttemptRecord {
            attempt: n,
            at_ms: 10,
            lane: "origin",
            outcome: "failed",
            status: Some(500),
            latency_ms: Some(1),
            response_body: Some(body.to_string()),
            error: None,
        })
    }

    /// A turn the ledger cannot write (the file is full) comes back whole and nothing of it is
    /// written; retried once there is room, each result counts once — and recording it yet
    /// again (an answer lost after the commit) changes nothing.
    #[tokio::test]
    async fn a_refused_turn_comes_back_whole_and_counts_once() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("l.db")).unwrap();
        ledger
            .tx(|c| {
                create_subscriber(c, &test_subscriber("a", &["*"]), "s")?;
                ingest(c, &test_events(3), 0).map(|_| ())
            })
            .await
            .unwrap();
        let leased = ledger
            .record_turn(Turn {
                now_ms: 1,
                claims: vec![("a".into(), 3)],
                lease_until_ms: 100_000,
                ..Default::default()
            })
            .await
            .unwrap();
        let rows: Vec<i64> = leased.claims[0].claimed.iter().map(|d| d.rowid).collect();
        assert_eq!(rows.len(), 3);
        // Big attempt records, so the turn needs more pages than the full file has (free
        // pages included: a new ledger's migrations leave some).
        let big = "x".repeat(100_000);
        let turn = Turn {
            now_ms: 10,
            outcomes: vec![
                Outcome {
                    rowid: rows[0],
                    transition: Transition::Retry {
                        at_ms: 50,
                        error: "status 500".into(),
                    },
                    attempt: attempt(1, &big),
                },
                Outcome {
                    rowid: rows[1],
                    transition: Transition::Dead {
                        reason: "gone".into(),
                    },
                    attempt: attempt(1, &big),
                },
            ],
            ..Default::default()
        };
        let pages: i64 = ledger
            .call(|c| Ok(c.query_row("PRAGMA page_count", [], |r| r.get(0))?))
            .await
            .unwrap();
        ledger
            .call(move |c| {
                c.pragma_update(None, "max_page_count", pages)?;
                Ok(())
            })
            .await
            .unwrap();
        let failed = ledger.record_turn(turn.clone()).await.unwrap_err();
        assert_eq!(failed.turn, turn, "handed back whole");
        let first = rows[0];
        let d0 = ledger.read(move |c| get_delivery(c, first)).await.unwrap();
        assert_eq!(
            (d0.status.as_str(), d0.attempt_count),
            ("in_flight", 0),
            "nothing written"
        );
        ledger
            .call(|c| {
                c.pragma_update(None, "max_page_count", 1_000_000_000)?;
                Ok(())
            })
            .await
            .unwrap();
        ledger.record_turn(failed.turn.clone()).await.unwrap();
        ledger.record_turn(failed.turn).await.unwrap();
        for (row, status) in [(rows[0], "pending"), (rows[1], "dead")] {
            let d = ledger.read(move |c| get_delivery(c, row)).await.unwrap();
            assert_eq!(
                (
                    d.status.as_str(),
                    d.attempt_count,
                    d.attempts.map(|a| a.len())
                ),
                (status, 1, Some(1)),
                "delivery {row}: one attempt, recorded once"
            );
        }
    }
}
