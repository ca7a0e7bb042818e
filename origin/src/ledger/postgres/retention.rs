//! Retention and kept counts on PostgreSQL: the only code that deletes deliveries, attempts
//! and events there (as `ledger/retention.rs` on SQLite, with the same rules), and the fold of
//! the count rows the triggers of migration 2 append.
//!
//! What goes, and when: a `sent` delivery whose last change is older than `--retain-sent`,
//! with its attempts; a `dead` one older than `--retain-dead`, with its attempts; an event once
//! no delivery refers to it. What never goes: a `pending` or `in_flight` delivery, a dead one
//! within its window, the attempts of a delivery that is kept, an event a delivery still
//! refers to. The rows to delete are locked (`FOR UPDATE SKIP LOCKED`) by the statement that
//! checks their status and age, and stay locked until the delete commits, so a replay racing
//! a purge either wins (the delivery is pending and kept) or waits and then finds nothing to
//! replay.
//!
//! Several daemons share the ledger: each step takes a transaction-scoped advisory lock
//! (`pg_try_advisory_xact_lock`) and a daemon that does not get it ends its pass — another
//! daemon is purging. Steps are small (the caller sizes them) and leave the rows they do not
//! delete alone (`SKIP LOCKED`). Freed space is reused once `vacuum.rs` (or autovacuum) has vacuumed it (`postgres` module doc, "Retention").

use std::time::{Duration, Instant};

use deadpool_postgres::Transaction;
use tokio_postgres::Row;

use super::ledger::{every, PgLedger};
use crate::ledger::error::LedgerError;
use crate::ledger::retention::{Finished, Removed, Retention, RetentionReport};

/// The advisory lock one retention step holds, shared by every daemon ("fanout" + 1).
pub(super) const RETENTION_LOCK: i64 = 0x6661_6e6f_7574 + 1;
/// The advisory lock of a fold of the kept counts ("fanout" + 2).
const FOLD_LOCK: i64 = 0x6661_6e6f_7574 + 2;
/// How often a daemon folds the kept counts.
pub const FOLD_EVERY: Duration = Duration::from_secs(1);

/// The events of `$1` that no delivery refers to any more, deleted (by a purge step, for the
/// events of the deliveries it removed, and by the sweep).
const DELETE_UNREFERENCED_EVENTS: &str = "DELETE FROM events e WHERE e.id = ANY($1)
     AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.id)";

fn status(kind: Finished) -> &'static str {
    match kind {
        Finished::Sent => "sent",
        Finished::Dead => "dead",
    }
}

/// Of the keys (`crate::ordering`) whose deliveries `ended` just removed, forget those whose
/// last delivery was among them and that have nothing outstanding: an ordered key idle past
/// retention starts over (its next delivery carries no `webhook-previous-sequence`), so
/// `ordering_keys` holds the keys of the kept deliveries, not every key ever seen. A key an
/// ingest is moving meanwhile keeps its row: the delete waits for that ingest's lock and then
/// finds `last` moved on.
const FORGET_KEYS: &str = "DELETE FROM ordering_keys o
     USING unnest($1::text[], $2::text[], $3::bigint[]) AS u(s, k, last)
     WHERE o.subscriber_id = u.s AND o.key = u.k AND o.last = u.last
       AND NOT EXISTS (
           SELECT 1 FROM deliveries d
           WHERE d.subscriber_id = u.s AND d.ordering_key = u.k
             AND d.ordering_key IS NOT NULL AND d.status IN ('pending', 'in_flight'))";

async fn forget_keys(tx: &Transaction<'_>, ended: &[Row]) -> Result<(), LedgerError> {
    let (mut subs, mut keys, mut lasts) = (Vec::new(), Vec::new(), Vec::new());
    for r in ended {
        if let Some(key) = r.try_get::<_, Option<String>>(1)? {
            subs.push(r.try_get::<_, String>(0)?);
            keys.push(key);
            lasts.push(r.try_get::<_, i64>(2)?);
        }
    }
    if !subs.is_empty() {
        tx.execute(FORGET_KEYS, &[&subs, &keys, &lasts]).await?;
    }
    Ok(())
}

impl PgLedger {
    /// Remove up to `batch` deliveries of status `kind` last changed before `cutoff_ms`, their
    /// attempts, and the events no delivery refers to any more. `None` when another daemon
    /// is purging (nothing done); otherwise what was removed and how long the step took.
    pub(super) async fn purge_finished(
        &self,
        kind: Finished,
        cutoff_ms: i64,
        batch: usize,
    ) -> Result<Option<(Removed, Duration)>, LedgerError> {
        let mut c = self.client().await?;
        let start = Instant::now();
        let tx = c.transaction().await?;
        if !try_lock(&tx, RETENTION_LOCK).await? {
            return Ok(None);
        }
        let status = status(kind);
        let limit = batch as i64;
        // The oldest first, by the partial index of this status by age (the status written
        // out, so that even a generic plan can use it); rows another transaction holds (a
        // replay) are left for the next pass.
        let doomed = tx
            .query(
                &format!(
                    "SELECT id, event_id FROM deliveries
                     WHERE status = '{status}' AND updated_ms < $1
                     ORDER BY updated_ms LIMIT $2 FOR UPDATE SKIP LOCKED"
                ),
                &[&cutoff_ms, &limit],
            )
            .await?;
        if doomed.is_empty() {
            tx.commit().await?;
            return Ok(Some((Removed::default(), start.elapsed())));
        }
        let mut ids: Vec<i64> = Vec::with_capacity(doomed.len());
        let mut events: Vec<String> = Vec::with_capacity(doomed.len());
        for r in &doomed {
            ids.push(r.try_get(0)?);
            events.push(r.try_get(1)?);
        }
        events.sort();
        events.dedup();
        let attempts = tx
            .execute("DELETE FROM attempts WHERE delivery_id = ANY($1)", &[&ids])
            .await?;
        // Only these rows: this transaction has held their locks since the SELECT above
        // checked their status and age (FOR UPDATE checks a row changed meanwhile again), so
        // none can have been replayed or otherwise changed since.
        let ended = tx
            .query(
                "DELETE FROM deliveries WHERE id = ANY($1)
                 RETURNING subscriber_id, ordering_key, sequence",
                &[&ids],
            )
            .await?;
        let deliveries = ended.len() as u64;
        let gone_events = tx.execute(DELETE_UNREFERENCED_EVENTS, &[&events]).await?;
        forget_keys(&tx, &ended).await?;
        let removed = Removed {
            deliveries,
            attempts,
            events: gone_events,
        };
        let key = match kind {
            Finished::Sent => "removed_sent",
            Finished::Dead => "removed_dead",
        };
        bump(&tx, key, removed.deliveries).await?;
        bump(&tx, "removed_attempts", removed.attempts).await?;
        bump(&tx, "removed_events", removed.events).await?;
        tx.commit().await?;
        Ok(Some((removed, start.elapsed())))
    }

    /// Sweep up to `batch` events received before `cutoff_ms`, from where the last sweep
    /// stopped in (received, id) order, and remove those no delivery refers to (they matched
    /// no subscriber). `None` when another daemon is purging; otherwise how many were removed,
    /// whether the sweep reached events not yet old enough, and how long the step took.
    ///
    /// An event committed with a receive time already behind the sweep's mark would be
    /// skipped: the daemons' receive times are on one clock, the server's (`clock.rs`), so
    /// that is a matter of milliseconds against `--retain-sent`.
    pub(super) async fn sweep_events(
        &self,
        cutoff_ms: i64,
        batch: usize,
    ) -> Result<Option<(u64, bool, Duration)>, LedgerError> {
        let mut c = self.client().await?;
        let start = Instant::now();
        let tx = c.transaction().await?;
        if !try_lock(&tx, RETENTION_LOCK).await? {
            return Ok(None);
        }
        let mark = tx
            .query_one("SELECT received_ms, event_id FROM retention_sweep", &[])
            .await?;
        let (from_ms, from_id): (i64, String) = (mark.try_get(0)?, mark.try_get(1)?);
        let limit = batch as i64;
        let rows = tx
            .query(
                "SELECT received_ms, id FROM events
                 WHERE (received_ms, id) > ($1, $2) AND received_ms < $3
                 ORDER BY received_ms, id LIMIT $4",
                &[&from_ms, &from_id, &cutoff_ms, &limit],
            )
            .await?;
        let caught_up = rows.len() < batch;
        let Some(last) = rows.last() else {
            tx.commit().await?;
            return Ok(Some((0, true, start.elapsed())));
        };
        let (last_ms, last_id): (i64, String) = (last.try_get(0)?, last.try_get(1)?);
        let ids: Vec<String> = rows
            .iter()
            .map(|r| r.try_get(1))
            .collect::<Result<_, _>>()?;
        let removed = tx.execute(DELETE_UNREFERENCED_EVENTS, &[&ids]).await?;
        tx.execute(
            "UPDATE retention_sweep SET received_ms = $1, event_id = $2",
            &[&last_ms, &last_id],
        )
        .await?;
        bump(&tx, "removed_events", removed).await?;
        tx.commit().await?;
        Ok(Some((removed, caught_up, start.elapsed())))
    }

    /// Note that the pass run at `now_ms` (its cut-offs' reference) has completed (a later
    /// pass of another daemon is not moved back).
    pub(super) async fn mark_retention_run(&self, now_ms: i64) -> Result<(), LedgerError> {
        self.client()
            .await?
            .execute(
                "UPDATE retention SET value = GREATEST(value, $1) WHERE key = 'last_run_ms'",
                &[&now_ms],
            )
            .await?;
        Ok(())
    }

    /// What retention has done, in total, and the oldest finished deliveries it kept: keyed
    /// lookups only (the oldest by the age indexes' first entry). The oldest are asked for in
    /// age order with a LIMIT, not as `MIN(updated_ms)`: where the planner guesses that a
    /// status has one row (a table not yet analyzed, whose guess falls as its rows widen), it
    /// plans a MIN as an aggregate over the whole of another index of that status.
    pub(super) async fn retention_report(&self) -> Result<RetentionReport, LedgerError> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "SELECT
                     (SELECT updated_ms FROM deliveries WHERE status = 'sent'
                      ORDER BY updated_ms LIMIT 1),
                     (SELECT updated_ms FROM deliveries WHERE status = 'dead'
                      ORDER BY updated_ms LIMIT 1),
                     (SELECT value FROM retention WHERE key = 'removed_sent'),
                     (SELECT value FROM retention WHERE key = 'removed_dead'),
                     (SELECT value FROM retention WHERE key = 'removed_attempts'),
                     (SELECT value FROM retention WHERE key = 'removed_events'),
                     (SELECT value FROM retention WHERE key = 'last_run_ms')",
                &[],
            )
            .await?;
        let counter = |i: usize| -> Result<i64, LedgerError> {
            Ok(row.try_get::<_, Option<i64>>(i)?.unwrap_or(0))
        };
        let last = counter(6)?;
        Ok(RetentionReport {
            oldest_sent_at_ms: row.try_get(0)?,
            oldest_dead_at_ms: row.try_get(1)?,
            removed_sent: counter(2)?,
            removed_dead: counter(3)?,
            removed_attempts: counter(4)?,
            removed_events: counter(5)?,
            last_run_at_ms: (last > 0).then_some(last),
        })
    }

    /// Replace the count rows the triggers appended with their sums (one per subscriber and
    /// status, none for a zero), and each subscriber's error rows with the latest. Readers see
    /// the same sums before and after (one transaction); a fold that finds another running
    /// does nothing. Returns whether it folded.
    pub(super) async fn fold_counts(&self) -> Result<bool, LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        if !try_lock(&tx, FOLD_LOCK).await? {
            return Ok(false);
        }
        tx.batch_execute(
            "WITH gone AS (DELETE FROM delivery_counts RETURNING subscriber_id, status, n)
             INSERT INTO delivery_counts (subscriber_id, status, n)
                 SELECT subscriber_id, status, SUM(n)::BIGINT FROM gone
                 GROUP BY subscriber_id, status HAVING SUM(n) <> 0;
             DELETE FROM last_errors l WHERE EXISTS (
                 SELECT 1 FROM last_errors m WHERE m.subscriber_id = l.subscriber_id
                     AND (m.at_ms, m.id) > (l.at_ms, l.id));",
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Fold the kept counts every [`FOLD_EVERY`] until `stop` (every daemon runs this; the
    /// advisory lock lets one fold at a time).
    pub(super) fn keep_counts_folded(&self, stop: tokio::sync::oneshot::Receiver<()>) {
        let me = self.clone();
        every(
            FOLD_EVERY,
            None,
            stop,
            "fold the kept delivery counts",
            move || {
                let me = me.clone();
                async move { me.fold_counts().await.map(drop) }
            },
        );
    }
}

/// Take `key` for the rest of the transaction, if no other transaction holds it.
async fn try_lock(tx: &deadpool_postgres::Transaction<'_>, key: i64) -> Result<bool, LedgerError> {
    Ok(tx
        .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&key])
        .await?
        .try_get(0)?)
}

async fn bump(
    tx: &deadpool_postgres::Transaction<'_>,
    key: &str,
    by: u64,
) -> Result<(), LedgerError> {
    if by > 0 {
        tx.execute(
            "UPDATE retention SET value = value + $2 WHERE key = $1",
            &[&key, &(by as i64)],
        )
        .await?;
    }
    Ok(())
}

impl Retention for PgLedger {
    async fn retention_report(&self) -> Result<RetentionReport, LedgerError> {
        self.retention_report().await
    }

    async fn purge_finished(
        &self,
        kind: Finished,
        cutoff_ms: i64,
        batch: usize,
    ) -> Result<Option<(Removed, Duration)>, LedgerError> {
        self.purge_finished(kind, cutoff_ms, batch).await
    }

    async fn sweep_events(
        &self,
        cutoff_ms: i64,
        batch: usize,
    ) -> Result<Option<(u64, bool, Duration)>, LedgerError> {
        self.sweep_events(cutoff_ms, batch).await
    }

    async fn mark_retention_run(&self, now_ms: i64) -> Result<(), LedgerError> {
        self.mark_retention_run(now_ms).await
    }

    /// Remove up to `batch` of the charts' rows of one resolution older than `cutoff_ms`, the
    /// oldest first; rows another daemon's flush holds are left for the next pass.
    async fn purge_series(
        &self,
        resolution_ms: i64,
        cutoff_ms: i64,
        batch: usize,
    ) -> Result<u64, LedgerError> {
        let c = self.client().await?;
        let n = c
            .execute(
                "DELETE FROM series WHERE (resolution_ms, bucket_ms, subscriber_id) IN
                     (SELECT resolution_ms, bucket_ms, subscriber_id FROM series
                      WHERE resolution_ms = $1 AND bucket_ms < $2
                      ORDER BY bucket_ms LIMIT $3 FOR UPDATE SKIP LOCKED)",
                &[&resolution_ms, &cutoff_ms, &(batch as i64)],
            )
            .await?;
        Ok(n)
    }
}
