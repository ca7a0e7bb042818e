//! The charts' series in the ledger (contract): rows of one subscriber's time bucket, added
//! to by every flush of every daemon (`crate::series`), read by a window's bucket range, and
//! trimmed by retention (`Retention::purge_series`, each backend's `retention.rs`). No SQL here.

use std::future::Future;

use super::error::LedgerError;
use crate::series::buckets::SeriesRow;

pub trait SeriesLedger {
    /// Add each row to the row of its (resolution, bucket, subscriber): counts and latency
    /// buckets add, gauges keep the highest sample. One transaction.
    fn add_series(
        &self,
        rows: Vec<SeriesRow>,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// The rows of resolution `resolution_ms` with buckets in `[from_ms, to_ms)`: of
    /// `subscriber` alone when given, otherwise the totals of every subscriber `scope` sees (a
    /// customer's own; every subscriber, removed ones too, without a scope), which each flush
    /// wrote as one row per bucket ([`series_key`]). At most one row per bucket, each found by
    /// its whole primary key ([`bucket_starts`]): the cost follows the window, not the
    /// subscribers nor the ledger.
    fn read_series(
        &self,
        resolution_ms: i64,
        from_ms: i64,
        to_ms: i64,
        subscriber: Option<String>,
        scope: Option<String>,
    ) -> impl Future<Output = Result<Vec<SeriesRow>, LedgerError>> + Send;
}

/// The key of the rows a chart reads: the subscriber's own, or the total of the scope's
/// (`crate::series::buckets::total_key`).
pub fn series_key(subscriber: Option<String>, scope: Option<&str>) -> String {
    subscriber.unwrap_or_else(|| crate::series::buckets::total_key(scope))
}

/// Beyond this many buckets a read is one range of the primary key instead of a lookup per
/// bucket (no window the API reads is that long: 360 fine buckets, 288 coarse).
pub const MAX_LOOKUPS: i64 = 1024;

/// The starts of the buckets of resolution `resolution_ms` in `[from_ms, to_ms)`, to look up
/// one by one; `None` when there are more than [`MAX_LOOKUPS`] (read a range instead).
pub fn bucket_starts(resolution_ms: i64, from_ms: i64, to_ms: i64) -> Option<Vec<i64>> {
    if resolution_ms <= 0 {
        return Some(Vec::new());
    }
    let first = crate::series::buckets::bucket_start(from_ms, resolution_ms);
    let first = if first < from_ms {
        first.saturating_add(resolution_ms)
    } else {
        first
    };
    let span = to_ms.saturating_sub(first).max(0);
    let n = span / resolution_ms + i64::from(span % resolution_ms != 0);
    if n > MAX_LOOKUPS {
        return None;
    }
    Some((0..n).map(|i| first + i * resolution_ms).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_starts_table() {
        let rows: &[(i64, i64, i64, Option<Vec<i64>>)] = &[
            (10, 0, 30, Some(vec![0, 10, 20])),
            (10, 5, 30, Some(vec![10, 20])),
            (10, 0, 31, Some(vec![0, 10, 20, 30])),
            (10, 30, 30, Some(vec![])),
            (10, 40, 30, Some(vec![])),
            (10, -20, 0, Some(vec![-20, -10])),
            (10, 0, 10 * 1024, Some((0..1024).map(|i| i * 10).collect())),
            (10, 0, 10 * 1025, None),
            (300_000, 0, i64::MAX, None),
        ];
        for (res, from, to, want) in rows {
            assert_eq!(bucket_starts(*res, *from, *to), *want, "{res} {from} {to}");
        }
    }
}
