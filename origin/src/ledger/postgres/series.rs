//! The charts' series on PostgreSQL: each flush's rows added in one transaction by one upsert
//! per row (counts and latency buckets add, gauges keep the highest), so the flushes of every
//! daemon sharing the ledger add up under the row's lock whatever their order; a window is one
//! lookup of the primary key per bucket (`= ANY` of the bucket starts). Rows go in (resolution, subscriber) order in every daemon, so two
//! flushes never wait on each other in a circle. Trimming is `retention.rs`'s.

use tokio_postgres::Row;

use super::ledger::PgLedger;
use crate::ledger::error::LedgerError;
use crate::ledger::series::{bucket_starts, series_key, SeriesLedger};
use crate::series::buckets::{Counts, Gauges, SeriesRow};

const COLUMNS: &str = "resolution_ms, bucket_ms, subscriber_id, delivered, failed, deferred, \
     rejected, latency, backlog, oldest_age_ms, in_flight, cap, paused, breaker_open";

const ADD: &str = "INSERT INTO series (resolution_ms, bucket_ms, subscriber_id, delivered, failed,
         deferred, rejected, latency, backlog, oldest_age_ms, in_flight, cap, paused, breaker_open)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
     ON CONFLICT (resolution_ms, bucket_ms, subscriber_id) DO UPDATE SET
         delivered = series.delivered + EXCLUDED.delivered,
         failed = series.failed + EXCLUDED.failed,
         deferred = series.deferred + EXCLUDED.deferred,
         rejected = series.rejected + EXCLUDED.rejected,
         latency = ARRAY(SELECT COALESCE(a, 0) + COALESCE(b, 0)
                         FROM unnest(series.latency, EXCLUDED.latency) WITH ORDINALITY AS t(a, b, n)
                         ORDER BY n),
         backlog = GREATEST(series.backlog, EXCLUDED.backlog),
         oldest_age_ms = GREATEST(series.oldest_age_ms, EXCLUDED.oldest_age_ms),
         in_flight = GREATEST(series.in_flight, EXCLUDED.in_flight),
         cap = GREATEST(series.cap, EXCLUDED.cap),
         paused = GREATEST(series.paused, EXCLUDED.paused),
         breaker_open = GREATEST(series.breaker_open, EXCLUDED.breaker_open)";

fn row(r: &Row) -> SeriesRow {
    let n = |i: usize| r.get::<_, i64>(i).max(0) as u64;
    let latency: Vec<i64> = r.get(7);
    SeriesRow {
        resolution_ms: r.get(0),
        bucket_ms: r.get(1),
        subscriber_id: r.get(2),
        counts: Counts {
            delivered: n(3),
            failed: n(4),
            deferred: n(5),
            rejected: n(6),
        },
        latency: latency.into_iter().map(|c| c.max(0) as u64).collect(),
        gauges: Gauges {
            backlog: r.get(8),
            oldest_age_ms: r.get(9),
            in_flight: r.get(10),
            cap: r.get(11),
            paused: r.get(12),
            breaker_open: r.get(13),
        },
    }
}

impl SeriesLedger for PgLedger {
    async fn add_series(&self, rows: Vec<SeriesRow>) -> Result<(), LedgerError> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let st = tx.prepare_cached(ADD).await?;
        let n = |v: u64| v.min(i64::MAX as u64) as i64;
        for r in &rows {
            let latency: Vec<i64> = r.latency.iter().map(|&c| n(c)).collect();
            tx.execute(
                &st,
                &[
                    &r.resolution_ms,
                    &r.bucket_ms,
                    &r.subscriber_id,
                    &n(r.counts.delivered),
                    &n(r.counts.failed),
                    &n(r.counts.deferred),
                    &n(r.counts.rejected),
                    &latency,
                    &r.gauges.backlog,
                    &r.gauges.oldest_age_ms,
                    &r.gauges.in_flight,
                    &r.gauges.cap,
                    &r.gauges.paused,
                    &r.gauges.breaker_open,
                ],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn read_series(
        &self,
        resolution_ms: i64,
        from_ms: i64,
        to_ms: i64,
        subscriber: Option<String>,
        scope: Option<String>,
    ) -> Result<Vec<SeriesRow>, LedgerError> {
        // A subscriber's own rows, to a scope that owns it only.
        let owner = subscriber.as_ref().and(scope.as_ref());
        let key = series_key(subscriber.clone(), scope.as_deref());
        let c = self.client().await?;
        let rows = match bucket_starts(resolution_ms, from_ms, to_ms) {
            Some(starts) => {
                let st = c
                    .prepare_cached(&read_sql("bucket_ms = ANY($2::BIGINT[])"))
                    .await?;
                c.query(&st, &[&resolution_ms, &starts, &key, &owner])
                    .await?
            }
            None => {
                let st = c
                    .prepare_cached(&read_sql("bucket_ms >= $2 AND bucket_ms < $5"))
                    .await?;
                c.query(&st, &[&resolution_ms, &from_ms, &key, &owner, &to_ms])
                    .await?
            }
        };
        Ok(rows.iter().map(row).collect())
    }
}

/// A read of one key's rows (`$3`) of one resolution (`$1`) in the buckets `buckets` names, to
/// the scope `$4` owns (NULL: any).
fn read_sql(buckets: &str) -> String {
    format!(
        "SELECT {COLUMNS} FROM series
         WHERE resolution_ms = $1 AND {buckets} AND subscriber_id = $3
           AND ($4::TEXT IS NULL
                OR EXISTS (SELECT 1 FROM subscribers WHERE id = $3 AND customer = $4))"
    )
}
