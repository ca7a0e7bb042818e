//! The charts' series on SQLite: each flush's rows added to the kept ones in one writer
//! transaction (read, fold with `SeriesRow::absorb`, write: the one writer makes it atomic),
//! and a window read as one lookup of the primary key per bucket. Trimming is `retention.rs`'s.

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::ledger::Ledger;
use crate::ledger::error::LedgerError;
use crate::ledger::series::{bucket_starts, series_key, SeriesLedger};
use crate::series::buckets::{Counts, Gauges, SeriesRow};

const COLUMNS: &str = "resolution_ms, bucket_ms, subscriber_id, delivered, failed, deferred, \
     rejected, latency, backlog, oldest_age_ms, in_flight, cap, paused, breaker_open";

fn row(r: &Row<'_>) -> rusqlite::Result<SeriesRow> {
    let latency: String = r.get(7)?;
    Ok(SeriesRow {
        resolution_ms: r.get(0)?,
        bucket_ms: r.get(1)?,
        subscriber_id: r.get(2)?,
        counts: Counts {
            delivered: r.get::<_, i64>(3)? as u64,
            failed: r.get::<_, i64>(4)? as u64,
            deferred: r.get::<_, i64>(5)? as u64,
            rejected: r.get::<_, i64>(6)? as u64,
        },
        latency: serde_json::from_str(&latency).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(7, rusqlite::types::Type::Text, Box::new(e))
        })?,
        gauges: Gauges {
            backlog: r.get(8)?,
            oldest_age_ms: r.get(9)?,
            in_flight: r.get(10)?,
            cap: r.get(11)?,
            paused: r.get(12)?,
            breaker_open: r.get(13)?,
        },
    })
}

/// Add `rows` to the kept ones.
pub fn add_series(c: &Connection, rows: &[SeriesRow]) -> Result<(), LedgerError> {
    let mut get = c.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM series
         WHERE resolution_ms = ?1 AND bucket_ms = ?2 AND subscriber_id = ?3"
    ))?;
    let mut put = c.prepare_cached(&format!(
        "INSERT OR REPLACE INTO series ({COLUMNS})
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
    ))?;
    for new in rows {
        let mut r = get
            .query_row(
                params![new.resolution_ms, new.bucket_ms, new.subscriber_id],
                row,
            )
            .optional()?
            .unwrap_or_else(|| SeriesRow {
                counts: Counts::default(),
                latency: Vec::new(),
                gauges: Gauges::default(),
                ..new.clone()
            });
        r.absorb(new);
        let latency = serde_json::to_string(&r.latency)
            .map_err(|e| LedgerError::Invalid(format!("a latency histogram: {e}")))?;
        let n = |v: u64| v.min(i64::MAX as u64) as i64;
        put.execute(params![
            r.resolution_ms,
            r.bucket_ms,
            r.subscriber_id,
            n(r.counts.delivered),
            n(r.counts.failed),
            n(r.counts.deferred),
            n(r.counts.rejected),
            latency,
            r.gauges.backlog,
            r.gauges.oldest_age_ms,
            r.gauges.in_flight,
            r.gauges.cap,
            r.gauges.paused,
            r.gauges.breaker_open,
        ])?;
    }
    Ok(())
}

/// The rows of one resolution in `[from, to)`, of one subscriber (when `scope` sees it) or
/// the totals of those `scope` sees: one lookup of the whole primary key per bucket
/// (`SeriesLedger::read_series`).
pub fn read_series(
    c: &Connection,
    resolution_ms: i64,
    from_ms: i64,
    to_ms: i64,
    subscriber: Option<&str>,
    scope: Option<&str>,
) -> Result<Vec<SeriesRow>, LedgerError> {
    // A subscriber's own rows, to a scope that owns it only.
    let owner = subscriber.and(scope);
    let key = series_key(subscriber.map(str::to_string), scope);
    let rows = match bucket_starts(resolution_ms, from_ms, to_ms) {
        Some(starts) => {
            let starts = serde_json::to_string(&starts)
                .map_err(|e| LedgerError::Invalid(format!("bucket starts: {e}")))?;
            c.prepare_cached(&read_sql("bucket_ms IN (SELECT value FROM json_each(?2))"))?
                .query_map(params![resolution_ms, starts, key, owner], row)?
                .collect::<rusqlite::Result<Vec<_>>>()?
        }
        None => c
            .prepare_cached(&read_sql("bucket_ms >= ?2 AND bucket_ms < ?5"))?
            .query_map(params![resolution_ms, from_ms, key, owner, to_ms], row)?
            .collect::<rusqlite::Result<Vec<_>>>()?,
    };
    Ok(rows)
}

/// A read of one key's rows (`?3`) of one resolution (`?1`) in the buckets `buckets` names,
/// to the scope `?4` owns (NULL: any).
fn read_sql(buckets: &str) -> String {
    format!(
        "SELECT {COLUMNS} FROM series
         WHERE resolution_ms = ?1 AND {buckets} AND subscriber_id = ?3
           AND (?4 IS NULL OR EXISTS (SELECT 1 FROM subscribers WHERE id = ?3 AND customer = ?4))"
    )
}

impl SeriesLedger for Ledger {
    async fn add_series(&self, rows: Vec<SeriesRow>) -> Result<(), LedgerError> {
        if rows.is_empty() {
            return Ok(());
        }
        self.tx(move |c| add_series(c, &rows)).await
    }

    async fn read_series(
        &self,
        resolution_ms: i64,
        from_ms: i64,
        to_ms: i64,
        subscriber: Option<String>,
        scope: Option<String>,
    ) -> Result<Vec<SeriesRow>, LedgerError> {
        self.read(move |c| {
            read_series(
                c,
                resolution_ms,
                from_ms,
                to_ms,
                subscriber.as_deref(),
                scope.as_deref(),
            )
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::sqlite::test_db;

    /// A combined chart reads the totals each flush wrote: one row per bucket, however many
    /// subscribers were charted (here 500 over a day's 288 buckets would be 144,000 rows), each
    /// found by its whole primary key; a customer's are its subscribers' only.
    #[test]
    fn a_combined_chart_reads_one_row_per_bucket() {
        use crate::series::buckets::{flush_rows, Tally, Window, COARSE_MS};
        let c = test_db();
        let now = 50 * 86_400_000;
        let (from, to) = Window::Day.range(now);
        for bucket in [from, from + COARSE_MS, to - COARSE_MS] {
            let mut tallies = Vec::new();
            let mut gauges = Vec::new();
            for i in 0..200 {
                let mut t = Tally::default();
                t.counts.delivered = 1;
                tallies.push((format!("s{i}"), t));
                let owner = (i % 4 == 0).then(|| "acme".to_string());
                gauges.push((
                    format!("s{i}"),
                    owner,
                    Gauges {
                        backlog: 1,
                        ..Gauges::default()
                    },
                ));
            }
            add_series(&c, &flush_rows(bucket, tallies, gauges)).unwrap();
        }
        let every = read_series(&c, COARSE_MS, from, to, None, None).unwrap();
        assert_eq!(every.len(), 3, "one row per bucket");
        assert!(every
            .iter()
            .all(|r| r.counts.delivered == 200 && r.gauges.backlog == 200));
        let acme = read_series(&c, COARSE_MS, from, to, None, Some("acme")).unwrap();
        assert_eq!(acme.len(), 3);
        assert!(acme.iter().all(|r| r.counts.delivered == 50));
        assert!(read_series(&c, COARSE_MS, from, to, None, Some("globex"))
            .unwrap()
            .is_empty());
        // The read is a lookup per bucket of the whole key, not a scan of the window.
        let starts = serde_json::to_string(&bucket_starts(COARSE_MS, from, to).unwrap()).unwrap();
        let sql = read_sql("bucket_ms IN (SELECT value FROM json_each(?2))");
        let plan: Vec<String> = c
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap()
            .query_map(params![COARSE_MS, starts, "*", None::<String>], |r| {
                r.get::<_, String>(3)
            })
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(
            plan.iter().any(|p| p.contains(
                "SEARCH series USING PRIMARY KEY (resolution_ms=? AND bucket_ms=? AND subscriber_id=?)"
            )),
            "{plan:?}"
        );
    }
}
