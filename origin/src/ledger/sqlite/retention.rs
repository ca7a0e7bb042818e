//! Retention: the only module that deletes deliveries, attempts and events.
//!
//! What goes, and when: a `sent` delivery whose last change (`updated_ms`, the moment it was
//! sent) is older than `--retain-sent`, with its attempts; a `dead` one older than
//! `--retain-dead`, with its attempts; an event once no delivery refers to it (its last
//! delivery removed, or it matched no subscriber and is older than `--retain-sent`).
//! What never goes: a `pending` or `in_flight` delivery, a dead one within its window, the
//! attempts of a delivery that is kept, an event a delivery still refers to.
//!
//! Each step removes at most `batch` rows by an index (`deliveries_sent_age`,
//! `deliveries_dead_age`, the events' rowid) inside one short writer transaction; the caller
//! (`crate::retention`) yields between steps so that ingest never waits long. Freed pages go
//! to SQLite's free list and are reused by the next inserts (below).
//!
//! # Retention and file size: free-list reuse, not `auto_vacuum`
//!
//! Deleting rows frees pages inside the database file; SQLite keeps them on a free list and the
//! next inserts take pages from it before growing the file. Under steady traffic retention frees
//! about what a day of ingest needs, so the file levels off at one window's worth of ledger (plus
//! the WAL) and stays there (BENCHMARKS.md, soak). We do not turn on `auto_vacuum=INCREMENTAL`:
//! it would only give pages back to the filesystem for the next inserts to take again (file churn
//! and extra writes for no steady-state gain), it adds pointer-map pages that every insert must
//! update, and switching an existing ledger to it needs a full `VACUUM` — a rewrite of the whole
//! file with the writer stopped, minutes at tens of millions of rows. To shrink a ledger after a
//! one-off spike, `fanout backup` writes a compacted copy (`VACUUM INTO`), which can replace the
//! file while the daemon is stopped.

use rusqlite::{params, Connection, OptionalExtension};
use std::time::{Duration, Instant};

use super::ledger::Ledger;
use crate::ledger::error::LedgerError;
use crate::ledger::retention::{Finished, Removed, Retention, RetentionReport};

/// The partial index of `kind`'s deliveries by `updated_ms` (migration 4).
fn age_index(kind: Finished) -> &'static str {
    match kind {
        Finished::Sent => "deliveries_sent_age",
        Finished::Dead => "deliveries_dead_age",
    }
}

/// Remove up to `batch` deliveries of status `kind` last changed before `cutoff_ms`, their
/// attempts, and the events no delivery refers to any more.
pub fn purge_finished(
    c: &Connection,
    kind: Finished,
    cutoff_ms: i64,
    batch: usize,
) -> Result<Removed, LedgerError> {
    // The oldest first, from the partial index by age (named: without statistics the planner
    // would pick the index by status and sort all of that status's rows).
    let status = kind.status();
    let ids: Vec<(i64, String)> = c
        .prepare_cached(&format!(
            "SELECT id, event_id FROM deliveries INDEXED BY {}
             WHERE status = '{status}' AND updated_ms < ?1 ORDER BY updated_ms LIMIT ?2",
            age_index(kind)
        ))?
        .query_map(params![cutoff_ms, batch as i64], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    if ids.is_empty() {
        return Ok(Removed::default());
    }
    let rowids = json_array(ids.iter().map(|(id, _)| serde_json::Value::from(*id)));
    let attempts = c
        .prepare_cached(
            "DELETE FROM attempts WHERE delivery_id IN (SELECT value FROM json_each(?1))",
        )?
        .execute([&rowids])?;
    // The status and age again: nothing else but a finished delivery past its window, ever.
    let ended: Vec<(String, Option<String>, i64)> = c
        .prepare_cached(&format!(
            "DELETE FROM deliveries WHERE id IN (SELECT value FROM json_each(?1))
                 AND status = '{status}' AND updated_ms < ?2
             RETURNING subscriber_id, ordering_key, sequence"
        ))?
        .query_map(params![rowids, cutoff_ms], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<Result<_, _>>()?;
    let deliveries = ended.len();
    forget_keys(c, &ended)?;
    let event_ids = json_array(ids.into_iter().map(|(_, e)| serde_json::Value::from(e)));
    let events = c
        .prepare_cached(
            "DELETE FROM events WHERE id IN (SELECT value FROM json_each(?1))
                 AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = events.id)",
        )?
        .execute([&event_ids])?;
    let removed = Removed {
        deliveries: deliveries as u64,
        attempts: attempts as u64,
        events: events as u64,
    };
    add_removed(c, kind, removed)?;
    Ok(removed)
}

/// Of the keys (`crate::ordering`) whose deliveries `ended` just removed, forget those whose
/// last delivery was among them and that have nothing outstanding: an ordered key idle past
/// retention starts over (its next delivery carries no `webhook-previous-sequence`), so
/// `ordering_keys` holds the keys of the kept deliveries, not every key ever seen.
fn forget_keys(c: &Connection, ended: &[(String, Option<String>, i64)]) -> Result<(), LedgerError> {
    let mut forget = c.prepare_cached(
        "DELETE FROM ordering_keys WHERE subscriber_id = ?1 AND key = ?2 AND last = ?3
             AND NOT EXISTS (
                 SELECT 1 FROM deliveries d
                 WHERE d.subscriber_id = ?1 AND d.ordering_key = ?2
                   AND d.ordering_key IS NOT NULL AND d.status IN ('pending', 'in_flight'))",
    )?;
    for (sub, key, last) in ended {
        if let Some(key) = key {
            forget.execute(params![sub, key, last])?;
        }
    }
    Ok(())
}

/// Sweep up to `batch` events older than `cutoff_ms` from where the last sweep stopped (in
/// rowid order) and remove those no delivery refers to (they matched no subscriber). Returns
/// how many were removed and whether the sweep reached events not yet old enough.
pub fn sweep_events(
    c: &Connection,
    cutoff_ms: i64,
    batch: usize,
) -> Result<(u64, bool), LedgerError> {
    let from = counter(c, "events_swept_to")?;
    let rows: Vec<(i64, i64)> = c
        .prepare_cached(
            "SELECT rowid, received_ms FROM events WHERE rowid > ?1 ORDER BY rowid LIMIT ?2",
        )?
        .query_map(params![from, batch as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    // Only past events older than the cutoff: the sweep stops at the first that is not.
    let old: Vec<i64> = rows
        .iter()
        .take_while(|(_, received)| *received < cutoff_ms)
        .map(|(rowid, _)| *rowid)
        .collect();
    let caught_up = old.len() < batch;
    let Some(&last) = old.last() else {
        return Ok((0, true));
    };
    let removed =
        c.prepare_cached(
            "DELETE FROM events WHERE rowid IN (SELECT value FROM json_each(?1))
                 AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = events.id)",
        )?
        .execute([json_array(old.into_iter().map(serde_json::Value::from))])? as u64;
    set_counter(c, "events_swept_to", last)?;
    bump(c, "removed_events", removed)?;
    Ok((removed, caught_up))
}

/// Note that the pass run at `now_ms` (its cut-offs' reference) has completed.
pub fn mark_run(c: &Connection, now_ms: i64) -> Result<(), LedgerError> {
    set_counter(c, "last_run_ms", now_ms)
}

/// The report, from a handful of keyed lookups (the oldest by the age indexes' first entry).
pub fn report(c: &Connection) -> Result<RetentionReport, LedgerError> {
    let oldest = |kind: Finished| -> Result<Option<i64>, LedgerError> {
        Ok(c.prepare_cached(&format!(
            "SELECT MIN(updated_ms) FROM deliveries INDEXED BY {} WHERE status = '{}'",
            age_index(kind),
            kind.status()
        ))?
        .query_row([], |r| r.get(0))?)
    };
    let last = counter(c, "last_run_ms")?;
    Ok(RetentionReport {
        removed_sent: counter(c, "removed_sent")?,
        removed_dead: counter(c, "removed_dead")?,
        removed_attempts: counter(c, "removed_attempts")?,
        removed_events: counter(c, "removed_events")?,
        oldest_sent_at_ms: oldest(Finished::Sent)?,
        oldest_dead_at_ms: oldest(Finished::Dead)?,
        last_run_at_ms: (last > 0).then_some(last),
    })
}

fn add_removed(c: &Connection, kind: Finished, r: Removed) -> Result<(), LedgerError> {
    let key = match kind {
        Finished::Sent => "removed_sent",
        Finished::Dead => "removed_dead",
    };
    bump(c, key, r.deliveries)?;
    bump(c, "removed_attempts", r.attempts)?;
    bump(c, "removed_events", r.events)
}

fn counter(c: &Connection, key: &str) -> Result<i64, LedgerError> {
    Ok(
        c.prepare_cached("SELECT value FROM retention WHERE key = ?1")?
            .query_row([key], |r| r.get(0))
            .optional()?
            .unwrap_or(0),
    )
}

fn set_counter(c: &Connection, key: &str, value: i64) -> Result<(), LedgerError> {
    c.prepare_cached("INSERT OR REPLACE INTO retention (key, value) VALUES (?1, ?2)")?
        .execute(params![key, value])?;
    Ok(())
}

fn bump(c: &Connection, key: &str, by: u64) -> Result<(), LedgerError> {
    if by > 0 {
        c.prepare_cached("UPDATE retention SET value = value + ?2 WHERE key = ?1")?
            .execute(params![key, by as i64])?;
    }
    Ok(())
}

fn json_array(items: impl Iterator<Item = serde_json::Value>) -> String {
    serde_json::Value::Array(items.collect()).to_string()
}

impl Retention for Ledger {
    async fn retention_report(&self) -> Result<RetentionReport, LedgerError> {
        self.read(|c| report(c)).await
    }

    async fn purge_finished(
        &self,
        kind: Finished,
        cutoff_ms: i64,
        batch: usize,
    ) -> Result<Option<(Removed, Duration)>, LedgerError> {
        self.tx(move |c| {
            let start = Instant::now();
            let r = purge_finished(c, kind, cutoff_ms, batch)?;
            Ok(Some((r, start.elapsed())))
        })
        .await
    }

    async fn sweep_events(
        &self,
        cutoff_ms: i64,
        batch: usize,
    ) -> Result<Option<(u64, bool, Duration)>, LedgerError> {
        self.tx(move |c| {
            let start = Instant::now();
            let (n, done) = sweep_events(c, cutoff_ms, batch)?;
            Ok(Some((n, done, start.elapsed())))
        })
        .await
    }

    async fn mark_retention_run(&self, now_ms: i64) -> Result<(), LedgerError> {
        self.tx(move |c| mark_run(c, now_ms)).await
    }

    async fn purge_series(
        &self,
        resolution_ms: i64,
        cutoff_ms: i64,
        batch: usize,
    ) -> Result<u64, LedgerError> {
        self.tx(move |c| purge_series(c, resolution_ms, cutoff_ms, batch))
            .await
    }
}

/// Remove up to `batch` of the charts' rows of resolution `resolution_ms` older than
/// `cutoff_ms` (the oldest first, by the primary key).
pub fn purge_series(
    c: &rusqlite::Connection,
    resolution_ms: i64,
    cutoff_ms: i64,
    batch: usize,
) -> Result<u64, LedgerError> {
    let n = c
        .prepare_cached(
            "DELETE FROM series WHERE (resolution_ms, bucket_ms, subscriber_id) IN
                 (SELECT resolution_ms, bucket_ms, subscriber_id FROM series
                  WHERE resolution_ms = ?1 AND bucket_ms < ?2
                  ORDER BY bucket_ms LIMIT ?3)",
        )?
        .execute(rusqlite::params![resolution_ms, cutoff_ms, batch as i64])?;
    Ok(n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::sqlite::{apply, claim, create_subscriber, ingest};
    use crate::ledger::{AttemptRecord, Outcome};
    use crate::ledger::{NewEvent, Transition};

    fn attempt(at_ms: i64, outcome: &'static str) -> Option<AttemptRecord> {
        Some(AttemptRecord {
            attempt: 1,
            at_ms,
            lane: "origin",
            outcome,
            status: Some(200),
            latency_ms: Some(1),
            response_body: None,
            error: None,
        })
    }

    fn statuses(c: &Connection) -> Vec<(String, String)> {
        c.prepare("SELECT event_id, status FROM deliveries ORDER BY event_id, subscriber_id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn count(c: &Connection, table: &str) -> i64 {
        c.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    /// A ledger with every kind of delivery, old and new: the purge removes exactly the sent
    /// ones and the dead ones past their windows (with their attempts and the events nothing
    /// refers to any more) and touches nothing pending, in flight or dead within its window.
    /// One subscriber's eight deliveries: e0 sent and e1 dead long ago (t=100), e2 sent and e3
    /// dead recently (t=5000), e4 retried (pending with an old attempt), e5 in flight, e6 and
    /// e7 pending; and an old event that matched no subscriber.
    fn every_kind_of_delivery() -> Connection {
        let c = crate::ledger::sqlite::test_db();
        create_subscriber(&c, &crate::ledger::test_subscriber("a", &["*"]), "s").unwrap();
        ingest(&c, &crate::ledger::test_events(8), 0).unwrap();
        // e0..e5 leased at t=0; e6 and e7 stay pending (old, never attempted).
        let ids: Vec<i64> = claim(&c, &[("a".into(), 6)], &[], 0, 1_000_000).unwrap()[0]
            .claimed
            .iter()
            .map(|d| d.rowid)
            .collect();
        let done = |i: usize, transition: Transition, outcome| Outcome {
            rowid: ids[i],
            transition,
            attempt: attempt(10, outcome),
        };
        let dead = || Transition::Dead {
            reason: "gone".into(),
        };
        // Old (t=100): e0 sent, e1 dead. Newer (t=5000): e2 sent, e3 dead.
        apply(
            &c,
            &[
                done(0, Transition::Sent, "delivered"),
                done(1, dead(), "rejected"),
            ],
            &[],
            100,
        )
        .unwrap();
        apply(
            &c,
            &[
                done(2, Transition::Sent, "delivered"),
                done(3, dead(), "rejected"),
            ],
            &[],
            5_000,
        )
        .unwrap();
        // e4 retried (pending, with an old attempt); e5 still in flight (leased at t=0).
        apply(
            &c,
            &[done(
                4,
                Transition::Retry {
                    at_ms: 9_000_000,
                    error: "503".into(),
                },
                "failed",
            )],
            &[],
            100,
        )
        .unwrap();
        // An event that matched no subscriber, old.
        c.execute(
            "INSERT INTO events (id, type, body, received_ms) VALUES ('lonely', 't', '{}', 0)",
            [],
        )
        .unwrap();
        assert_eq!(count(&c, "attempts"), 5);
        c
    }

    #[test]
    fn purge_removes_only_finished_deliveries_past_their_window() {
        let c = every_kind_of_delivery();

        // now = 10_000: sent kept 1s (cut-off 9_000), dead kept 8s (cut-off 2_000).
        let sent = purge_finished(&c, Finished::Sent, 9_000, 100).unwrap();
        let dead_removed = purge_finished(&c, Finished::Dead, 2_000, 100).unwrap();
        let (swept, caught_up) = sweep_events(&c, 9_000, 100).unwrap();
        assert_eq!(
            sent,
            Removed {
                deliveries: 2,
                attempts: 2,
                events: 2
            }
        );
        assert_eq!(
            dead_removed,
            Removed {
                deliveries: 1,
                attempts: 1,
                events: 1
            }
        );
        assert_eq!((swept, caught_up), (1, true));
        assert_eq!(
            statuses(&c),
            vec![
                ("e3".to_string(), "dead".to_string()),
                ("e4".to_string(), "pending".to_string()),
                ("e5".to_string(), "in_flight".to_string()),
                ("e6".to_string(), "pending".to_string()),
                ("e7".to_string(), "pending".to_string()),
            ]
        );
        // The kept deliveries keep their attempts and events; nothing else is left.
        assert_eq!(count(&c, "attempts"), 2);
        let events: Vec<String> = c
            .prepare("SELECT id FROM events ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(events, ["e3", "e4", "e5", "e6", "e7"]);
        let r = report(&c).unwrap();
        assert_eq!(
            (
                r.removed_sent,
                r.removed_dead,
                r.removed_attempts,
                r.removed_events
            ),
            (2, 1, 3, 4)
        );
        assert_eq!(
            (r.oldest_sent_at_ms, r.oldest_dead_at_ms),
            (None, Some(5_000))
        );
        // The counts the triggers keep agree with the rows left.
        let counts: Vec<(String, i64)> = c
            .prepare("SELECT status, n FROM delivery_counts WHERE n > 0 ORDER BY status")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            counts,
            vec![
                ("dead".to_string(), 1),
                ("in_flight".to_string(), 1),
                ("pending".to_string(), 3)
            ]
        );
        // A second pass at the same time finds nothing more.
        assert_eq!(
            purge_finished(&c, Finished::Sent, 9_000, 100).unwrap(),
            Removed::default()
        );
        assert_eq!(
            purge_finished(&c, Finished::Dead, 2_000, 100).unwrap(),
            Removed::default()
        );
    }

    /// Steps are bounded: a batch of 2 removes 2 and leaves the rest for the next step; the
    /// event sweep stops at the first event not old enough and resumes where it stopped.
    #[test]
    fn steps_are_bounded_and_resume() {
        let c = crate::ledger::sqlite::test_db();
        let evs: Vec<NewEvent> = (0..5)
            .map(|i| NewEvent {
                id: format!("x{i}"),
                event_type: "t".into(),
                body: "{}".into(),
                traceparent: None,
            })
            .collect();
        // No subscriber: events only, received at 0..4 (x4 at t=4 is not old at cut-off 4).
        for (t, e) in evs.iter().enumerate() {
            ingest(&c, std::slice::from_ref(e), t as i64).unwrap();
        }
        assert_eq!(sweep_events(&c, 4, 2).unwrap(), (2, false));
        assert_eq!(sweep_events(&c, 4, 2).unwrap(), (2, false));
        assert_eq!(sweep_events(&c, 4, 2).unwrap(), (0, true));
        assert_eq!(count(&c, "events"), 1);
        assert_eq!(sweep_events(&c, 5, 2).unwrap(), (1, true));
        assert_eq!(count(&c, "events"), 0);

        create_subscriber(&c, &crate::ledger::test_subscriber("a", &["*"]), "s").unwrap();
        ingest(&c, &crate::ledger::test_events(5), 0).unwrap();
        let ids: Vec<i64> = claim(&c, &[("a".into(), 5)], &[], 0, 10).unwrap()[0]
            .claimed
            .iter()
            .map(|d| d.rowid)
            .collect();
        let sent: Vec<Outcome> = ids
            .iter()
            .map(|&rowid| Outcome {
                rowid,
                transition: Transition::Sent,
                attempt: None,
            })
            .collect();
        apply(&c, &sent, &[], 1).unwrap();
        let step = |c: &Connection| purge_finished(c, Finished::Sent, 2, 2).unwrap().deliveries;
        assert_eq!([step(&c), step(&c), step(&c), step(&c)], [2, 2, 1, 0]);
    }
}
