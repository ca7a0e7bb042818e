//! The planner's statistics of `deliveries` on PostgreSQL, refreshed (one daemon at a time)
//! once the table has outgrown them, so the dispatcher's and the API's plans stay right as
//! it grows; [`Growth`] counts what this daemon inserted since.

use super::growth::outgrown;
use super::ledger::{every, PgLedger};
use crate::ledger::error::LedgerError;

/// The advisory lock of a statistics refresh, shared by every daemon ("fanout" + 3).
const STATISTICS_LOCK: i64 = 0x6661_6e6f_7574 + 3;
/// How often a daemon looks whether `deliveries` has outgrown its planner statistics (and
/// at once when its own ingest has, [`Growth`]).
pub const STATISTICS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
impl PgLedger {
    /// `ANALYZE deliveries` when at least twice as many rows have changed since its
    /// statistics were taken as they counted (and 10,000): returns whether it did.
    ///
    /// Why: the claim and the due probe read `deliveries_due` in due order, and
    /// `deliveries_pending_by_sub` (the API's lists) has the same predicate and subscriber
    /// prefix. With statistics from a table much smaller than the queue (a new ledger, a
    /// backlog that grew within a minute), PostgreSQL estimates one pending row per
    /// subscriber and may read the list index and sort every pending row of the subscriber,
    /// on every turn: measured at 10,000 pending each, 8 ms per subscriber per turn, two
    /// thirds of the server's time per delivery. Autovacuum's analyze comes only after its
    /// naptime (a minute by default) and a 10 % change; this refresh follows the queue
    /// within a second (at once for what this daemon ingested) and, once the table is large,
    /// rarely (only when it has turned over twice). It never waits for a lock: if autovacuum is working on
    /// the table, it leaves it for later.
    pub(super) async fn refresh_statistics(&self) -> Result<bool, LedgerError> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let locked: bool = tx
            .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&STATISTICS_LOCK])
            .await?
            .try_get(0)?;
        if !locked {
            return Ok(false);
        }
        const COUNTS: &str = "SELECT GREATEST(c.reltuples, 0)::BIGINT,
                 COALESCE(s.n_mod_since_analyze, 0)
             FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
             WHERE c.oid = 'deliveries'::regclass";
        let row = tx.query_one(COUNTS, &[]).await?;
        let (counted, published): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
        self.growth.counted.store(counted, Relaxed);
        let mine = self.growth.inserted.load(Relaxed);
        let changed = published.max(mine);
        if !outgrown(changed, counted) {
            return Ok(false);
        }
        tx.batch_execute("SET LOCAL lock_timeout = '100ms'").await?;
        match tx.batch_execute("ANALYZE deliveries").await {
            Ok(()) => {}
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                return Ok(false)
            }
            Err(e) => return Err(e.into()),
        }
        let counted: i64 = tx.query_one(COUNTS, &[]).await?.try_get(0)?;
        tx.commit().await?;
        self.growth.counted.store(counted, Relaxed);
        self.growth.inserted.fetch_sub(mine, Relaxed);
        tracing::debug!(
            counted,
            changed,
            "refreshed the planner's statistics of deliveries"
        );
        Ok(true)
    }

    /// Refresh the statistics of `deliveries` when due ([`PgLedger::refresh_statistics`]),
    /// looking every `STATISTICS_EVERY`, and at once when this daemon's ingest outgrew
    /// them, until `stop` fires or is dropped.
    pub(super) fn keep_statistics(&self, stop: tokio::sync::oneshot::Receiver<()>) {
        let me = self.clone();
        every(
            STATISTICS_EVERY,
            Some(self.growth.wake.clone()),
            stop,
            "refresh the planner's statistics of deliveries",
            move || {
                let me = me.clone();
                async move { me.refresh_statistics().await.map(drop) }
            },
        );
    }
}
