//! The charts' flush task: every [`FINE_MS`] (just after each fine bucket ends), the
//! dispatcher's tallies (`crate::series::acc`, kept in [`Metrics`]) and the gauges sampled
//! now go into the ledger's series as a few rows per active subscriber (`crate::series`
//! says what they are; `crate::series::buckets` does the arithmetic).

use std::sync::Arc;
use std::time::Duration;

use fanout_core::breaker::BreakerConfig;

use crate::ledger::series::SeriesLedger;
use crate::ledger::{LedgerError, Observe, SubscriberStats};
use crate::metrics::Metrics;
use crate::series::buckets::{bucket_start, flush_rows, Gauges, FINE_MS};

/// A subscriber's gauges at `now_ms` as a flush samples them.
pub fn gauges(s: &SubscriberStats, now_ms: i64) -> Gauges {
    Gauges {
        backlog: s.pending,
        oldest_age_ms: s
            .oldest_pending_at_ms
            .map_or(0, |t| now_ms.saturating_sub(t).max(0)),
        in_flight: s.in_flight,
        cap: i64::from(s.max_in_flight),
        paused: i64::from(s.paused_until_ms.is_some()),
        breaker_open: i64::from(s.breaker != "closed"),
    }
}

/// One flush at `now_ms` into the bucket `bucket_ms`: the tallies taken from `metrics` and
/// the gauges read now. Tallies that cannot be written go back for the next flush.
pub async fn flush(
    ledger: &(impl Observe + SeriesLedger + Sync),
    metrics: &Metrics,
    breaker: BreakerConfig,
    now_ms: i64,
    bucket_ms: i64,
) -> Result<usize, LedgerError> {
    let tallies = metrics.series.take();
    let sampled = match ledger.metrics_snapshot(now_ms, breaker).await {
        Ok((_, subs, _)) => subs,
        Err(e) => {
            metrics.series.restore(tallies);
            return Err(e);
        }
    };
    let gauges = sampled
        .iter()
        .map(|s| (s.id.clone(), s.customer.clone(), gauges(s, now_ms)))
        .collect();
    let rows = flush_rows(bucket_ms, tallies.clone(), gauges);
    let n = rows.len();
    if let Err(e) = ledger.add_series(rows).await {
        metrics.series.restore(tallies);
        return Err(e);
    }
    Ok(n)
}

/// Flush just after each fine bucket ends (into that bucket), and once more, into the bucket
/// still filling, when `stop` turns true.
pub async fn run(
    ledger: impl Observe + SeriesLedger + Send + Sync,
    metrics: Arc<Metrics>,
    breaker: BreakerConfig,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let now = crate::time::now_ms();
        let next = bucket_start(now, FINE_MS) + FINE_MS;
        let wait = Duration::from_millis((next - now).max(0) as u64 + 50);
        let stopping = tokio::select! {
            _ = tokio::time::sleep(wait) => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        let now = crate::time::now_ms();
        // A regular flush counts what came in during the bucket that just ended.
        let at = if stopping { now } else { now - FINE_MS / 2 };
        let bucket = bucket_start(at, FINE_MS);
        if let Err(e) = flush(&ledger, &metrics, breaker, now, bucket).await {
            tracing::warn!(error = %e, "the charts' series could not be written; the next flush retries");
        }
        if stopping {
            return;
        }
    }
}

/// The flush task while the daemon serves. It is stopped after the dispatcher, so the last
/// results are flushed too.
#[derive(Debug)]
pub struct Running {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    pub fn start(
        ledger: impl Observe + SeriesLedger + Send + Sync + 'static,
        metrics: Arc<Metrics>,
        breaker: BreakerConfig,
    ) -> Running {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(run(ledger, metrics, breaker, stopped));
        Running { stop, task }
    }

    /// Flush once more and end.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "the series task failed");
        }
    }
}
