//! What this daemon inserted into `deliveries` since the planner's statistics were last
//! refreshed (`statistics.rs` reads it; ingest adds to it). Atomics only.

/// The deliveries this daemon inserted since the statistics were last refreshed, against the
/// row count they were taken with: the server's own count of changes is published about once
/// a second, and a queue that grew tenfold within it would be read with the old plans until
/// then.
#[derive(Debug, Default)]
pub struct Growth {
    pub(super) inserted: std::sync::atomic::AtomicI64,
    pub(super) counted: std::sync::atomic::AtomicI64,
    pub(super) wake: std::sync::Arc<tokio::sync::Notify>,
}

impl Growth {
    /// `n` deliveries inserted: wakes the refresh when they outnumber what the statistics
    /// counted.
    pub fn inserted(&self, n: i64) {
        use std::sync::atomic::Ordering::Relaxed;
        let total = self.inserted.fetch_add(n, Relaxed) + n;
        if outgrown(total, self.counted.load(Relaxed)) {
            self.wake.notify_one();
        }
    }
}

/// Changes to `deliveries` below this many never call for a refresh (autovacuum's analyze
/// follows in its own time; a misplanned turn over fewer pending rows costs little).
const STATISTICS_MIN_CHANGES: i64 = 10_000;

/// Whether `changed` rows since the statistics counted `counted` call for a refresh: the
/// table may have tripled (each refresh of a growing table samples it again, so not at every
/// doubling while a backlog is ingested).
pub(super) fn outgrown(changed: i64, counted: i64) -> bool {
    changed >= STATISTICS_MIN_CHANGES.max(counted.saturating_mul(2))
}
