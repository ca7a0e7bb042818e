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
    /// `subscriber` alone when given, otherwise of every subscriber `scope` sees (a customer's
    /// own; every subscriber, removed ones too, without a scope). A bounded range of the
    /// series' primary key: the cost follows the window and the subscribers, not the ledger.
    fn read_series(
        &self,
        resolution_ms: i64,
        from_ms: i64,
        to_ms: i64,
        subscriber: Option<String>,
        scope: Option<String>,
    ) -> impl Future<Output = Result<Vec<SeriesRow>, LedgerError>> + Send;
}
